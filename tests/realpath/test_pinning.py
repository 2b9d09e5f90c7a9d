"""Renders that cannot change by themselves (#22 items 4-7) on the zoo's real chat-template behaviours.

Llama-3's template reads today's date (``strftime_now``): a run pins it at its start, records it in config.yaml, and
its evaluation and probes render with the recorded date on any later day. Qwen3's thinking switch recorded by a run is
the default of ``eval --run`` / ``eval --model RUN/final``, and a flag that contradicts it is refused. Qwen2.5's
default system prompt is refused before any model loads, naming the real key. The days are mocked at the one clock
the template reads (transformers' ``chat_template_utils.datetime``).
"""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest
import yaml

from mechopd.core.views import RenderSpec, render_prompt_ids
from mechopd.models import load_tokenizer

from .helpers import cli, jsonl_sets

ONE_STEP = [
    "--steps",
    "1",
    "--batch-size",
    "2",
    "--lr",
    "1e-3",
    "--no-progress",
    "--set",
    "max_new_tokens=4",
    "--set",
    "pool_size=4",
]


def _freeze(monkeypatch, day: dt.datetime) -> None:
    from transformers.utils import chat_template_utils as ctu

    real = dt.datetime

    class Frozen(real):
        @classmethod
        def now(cls, tz=None):
            return day

    monkeypatch.setattr(ctu, "datetime", Frozen)


DAY_A, DAY_B = dt.datetime(2031, 3, 4), dt.datetime(2032, 11, 30)


def test_the_zoo_llama_template_reads_the_date_as_the_real_one(zoo, monkeypatch):
    tok = load_tokenizer(zoo.student("llama"))
    spec = RenderSpec("system", "")
    texts = []
    for day in (DAY_A, DAY_B):
        _freeze(monkeypatch, day)
        texts.append(tok.decode(render_prompt_ids(tok, "q", None, spec)))
    assert "Today Date: 04 Mar 2031\n\n" in texts[0] and "Today Date: 30 Nov 2032\n\n" in texts[1]  # unpinned: drifts


def test_a_pinned_render_is_identical_on_any_day(zoo, monkeypatch):
    from mechopd.evaluation.pinning import pin_render

    tok = load_tokenizer(zoo.student("llama"))
    _freeze(monkeypatch, DAY_A)
    spec, note = pin_render(tok, RenderSpec("system", ""), "q", "CTX")
    assert spec.chat_template_kwargs == {"date_string": "04 Mar 2031"} and "pinned" in note
    ids = {}
    for day in (DAY_A, DAY_B):
        _freeze(monkeypatch, day)
        ids[day] = (render_prompt_ids(tok, "q", None, spec), render_prompt_ids(tok, "q", "CTX", spec))
    assert ids[DAY_A] == ids[DAY_B]
    assert pin_render(tok, spec, "q", "CTX") == (spec, None)  # already pinned: nothing changes


def test_a_run_pins_records_and_its_eval_and_probes_reuse_the_date(zoo, tmp_path, monkeypatch, capsys):
    """Trained on day A with a colon system prompt; evaluated and probed on day B: the day-A render throughout."""
    from mechopd.probes.setup import ProbeSetup

    run = tmp_path / "llama"
    _freeze(monkeypatch, DAY_A)
    old = os.umask(0o022)
    try:
        cli(
            "train",
            "--task",
            "jsonl",
            "--student",
            zoo.student("llama"),
            *ONE_STEP,
            *jsonl_sets(zoo),
            "--set",
            "no_context_system=Note: be brief.",
            "--out",
            run,
        )
    finally:
        os.umask(old)
    assert "pinned chat_template_kwargs.date_string='04 Mar 2031'" in capsys.readouterr().out
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    saved = json.loads((run / "final" / "training.json").read_text())["config"]
    for c in (cfg, saved):
        assert (
            c["chat_template_kwargs"] == {"date_string": "04 Mar 2031"} and c["no_context_system"] == "Note: be brief."
        )
    assert (run / "final").stat().st_mode & 0o777 == 0o755  # umask 022, not mkdtemp's 0700
    assert all(f.stat().st_mode & 0o777 == 0o644 for f in (run / "final").iterdir())
    _freeze(monkeypatch, DAY_B)
    cli("eval", "--run", run, "--n", "2", "--max-new-tokens", "2", "--out", tmp_path / "e.json")
    settings = json.loads((tmp_path / "e.json").read_text())["settings"]
    assert settings["chat_template_kwargs"] == {"date_string": "04 Mar 2031"}
    assert settings["no_context_system"] == "Note: be brief." and settings["task"] == "jsonl"
    spec = ProbeSetup.from_run(run).spec()
    assert spec.chat_template_kwargs == {"date_string": "04 Mar 2031"}


def test_an_iso_date_and_a_colon_stay_text_through_the_run(zoo, tmp_path):
    run = tmp_path / "iso"
    cli(
        "train",
        "--task",
        "jsonl",
        "--student",
        zoo.student("llama"),
        *ONE_STEP,
        *jsonl_sets(zoo),
        "--set",
        "chat_template_kwargs.date_string=2024-07-26",
        "--set",
        "no_context_system=Note: be brief.",
        "--out",
        run,
    )
    saved = json.loads((run / "final" / "training.json").read_text())["config"]
    assert saved["chat_template_kwargs"] == {"date_string": "2024-07-26"}
    assert yaml.safe_load((run / "config.yaml").read_text())["chat_template_kwargs"] == {"date_string": "2024-07-26"}
    tok = load_tokenizer(run / "final")
    text = tok.decode(
        render_prompt_ids(
            tok, "q", None, RenderSpec("system", saved["no_context_system"], saved["chat_template_kwargs"])
        )
    )
    assert "Today Date: 2024-07-26\n\nNote: be brief.<|eot_id|>" in text


def test_eval_takes_the_runs_thinking_switch_and_refuses_a_contradiction(zoo, tmp_path, capsys):
    from mechopd.cli import main

    run = tmp_path / "qwen3"
    cli(
        "train",
        "--task",
        "jsonl",
        "--student",
        zoo.student("qwen3"),
        *ONE_STEP,
        *jsonl_sets(zoo),
        "--set",
        "chat_template_kwargs.enable_thinking=false",
        "--out",
        run,
    )
    for how in (["--run", run], ["--model", run / "final"]):
        out = tmp_path / f"{how[0][2:]}.json"
        cli("eval", *how, "--n", "2", "--max-new-tokens", "2", "--out", out)
        settings = json.loads(out.read_text())["settings"]
        assert settings["chat_template_kwargs"] == {"enable_thinking": False} and settings["task"] == "jsonl"
    capsys.readouterr()
    rc = main(
        [
            "eval",
            "--model",
            str(run / "final"),
            "--n",
            "2",
            "--chat-template-kwarg",
            "enable_thinking=true",
            "--out",
            str(tmp_path / "x.json"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "differs from the run's chat_template_kwargs" in err and "Loading weights" not in err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("verb", ["train", "eval"])
def test_the_default_system_refusal_names_the_real_flag_before_any_load(zoo, tmp_path, capsys, verb):
    from mechopd.cli import main

    opts = [x for k, v in zoo.jsonl_options().items() for x in ("--option", f"{k}={v}")]
    argv = (
        [
            "train",
            "--task",
            "jsonl",
            "--student",
            str(zoo.student("qwen2")),
            *ONE_STEP,
            *opts,
            "--out",
            str(tmp_path / "r"),
        ]
        if verb == "train"
        else ["eval", "--task", "jsonl", "--model", str(zoo.student("qwen2")), *opts, "--n", "2"]
    )
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "render.no_context_system" not in lines[0]
    assert "--set no_context_system=" in lines[0] and "--no-context-system" in lines[0]
    assert not (tmp_path / "r").exists()


def test_a_real_size_head_over_a_smaller_tokenizer_evaluates(zoo, tmp_path):
    """Qwen2.5's 151936-row head over the zoo's tokenizer (2-layer hidden-16): the whole path runs, recorded."""
    from transformers import AutoConfig

    d = zoo.padded("qwen2")
    tok = load_tokenizer(d)
    assert AutoConfig.from_pretrained(d).vocab_size == 151936 > len(tok)
    cli(
        "eval",
        "--task",
        "jsonl",
        "--model",
        d,
        "--option",
        f"path={zoo.data}",
        "--option",
        "context=Formulary.",
        "--option",
        "max_new_tokens=3",
        "--n",
        "2",
        "--no-context-system",
        "",
        "--out",
        tmp_path / "p.json",
    )
    settings = json.loads((tmp_path / "p.json").read_text())["settings"]
    assert settings["no_context_system"] == "" and settings["chat_template_kwargs"] == {}
