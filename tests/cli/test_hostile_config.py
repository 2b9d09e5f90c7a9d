"""Hostile inputs, config and numbers (#22): typed as a user types them, refused with one line before any model loads.

Legitimate inputs of the same classes (a system prompt with a colon, an ISO date, a number meant as text) are read as
text by the field's declared type and survive the JSON/YAML round trip (the last tests here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.hostile import Hostile, check, check_in_workspace, evaluate, train, write


def _yaml(ws: Path, text: str | bytes) -> str:
    return str(write(ws, "cfg.yaml", text))


CASES = [
    # config files and --set typing
    Hostile(
        "config",
        "yaml-not-utf8",
        lambda o, w: ["train", _yaml(w, b"lr: 1e-3\nno_context_system: \xff\xfe\n"), "--out", str(w / "run")],
        "is not UTF-8",
    ),
    Hostile(
        "config",
        "yaml-is-directory",
        lambda o, w: ["train", str((w / "d.yaml").mkdir() or w / "d.yaml"), "--out", str(w / "run")],
        "is not a file",
    ),
    Hostile(
        "config",
        "yaml-20k-brackets",
        lambda o, w: ["train", _yaml(w, "task_options: " + "[" * 20000 + "]" * 20000 + "\n"), "--out", str(w / "run")],
        "nests too deeply",
    ),
    Hostile(
        "config",
        "yaml-duplicate-key",
        lambda o, w: ["train", _yaml(w, "lr: 1e-3\nsteps: 2\nlr: 1e-1\n"), "--out", str(w / "run")],
        "key 'lr' appears twice",
    ),
    Hostile(
        "config",
        "yaml-number-as-text-field",
        lambda o, w: ["train", _yaml(w, "no_context_system: 123\n"), "--out", str(w / "run")],
        "is not text; quote it",
    ),
    Hostile(
        "config",
        "set-value-then-mapping",
        lambda o, w: train(o, w, "--set", "lr=1e-3", "--set", "lr.x=2"),
        "lr cannot be both a value and a mapping",
    ),
    Hostile(
        "config",
        "set-mapping-then-value",
        lambda o, w: train(o, w, "--set", "lr.x=2", "--set", "lr=1e-3"),
        "lr cannot be both a value and a mapping",
    ),
    Hostile(
        "config", "set-rule-number", lambda o, w: train(o, w, "--set", "task_options.rule=2"), "rule=2 is not text"
    ),
    Hostile("config", "option-rule-number", lambda o, w: train(o, w, "--option", "rule=2"), "rule=2 is not text"),
    Hostile(
        "config", "set-method-list", lambda o, w: train(o, w, "--set", "method=[opd]"), "method='[opd]' is unknown"
    ),
    Hostile(
        "config",
        "set-mapping-field-scalar",
        lambda o, w: train(o, w, "--set", "task_options=5"),
        "task_options=5 is not a mapping",
    ),
    Hostile(
        "config", "set-empty-key", lambda o, w: train(o, w, "--set", "task_options..rule=shift:1"), "is not key=value"
    ),
    Hostile(
        "config",
        "vllm-options-typo",
        lambda o, w: train(o, w, "--set", "vllm_options.gpu_memory_utilisation=.5"),
        "vllm_options: unknown key(s) gpu_memory_utilisation",
    ),
    Hostile(
        "config",
        "template-kwarg-typo-train",
        lambda o, w: train(o, w, "--set", "chat_template_kwargs.enable_thinkng=false"),
        "does not take enable_thinkng",
    ),
    Hostile(
        "config",
        "template-kwarg-typo-eval",
        lambda o, w: evaluate(o, "--chat-template-kwarg", "date_strng=x"),
        "does not take date_strng",
    ),
    Hostile(
        "config",
        "template-kwarg-reserved",
        lambda o, w: evaluate(o, "--chat-template-kwarg", "add_generation_prompt=false"),
        "does not take add_generation_prompt",
    ),
    # numbers: one rule per field in every verb, checked before the work
    Hostile("numbers", "eval-seed-negative", lambda o, w: evaluate(o, "--seed", "-1"), "seed=-1 is invalid"),
    Hostile("numbers", "eval-seed-2**64", lambda o, w: evaluate(o, "--seed", str(2**64)), "seed=18446744073709551616"),
    Hostile("numbers", "train-seed-2**64", lambda o, w: train(o, w, "--seed", str(2**64)), "seed=18446744073709551616"),
    Hostile(
        "numbers",
        "pretrain-seed-2**64",
        lambda o, w: ["pretrain", "--task", "rules", "--out", str(w / "o"), "--seed", str(2**64)],
        "seed=18446744073709551616",
    ),
    Hostile(
        "numbers",
        "pretrain-heads-zero",
        lambda o, w: ["pretrain", "--task", "rules", "--out", str(w / "o"), "--num-heads", "0"],
        "num_heads=0 is invalid",
    ),
    Hostile(
        "numbers",
        "pretrain-kv-heads-zero",
        lambda o, w: ["pretrain", "--task", "rules", "--out", str(w / "o"), "--num-kv-heads", "0"],
        "num_kv_heads=0 is invalid",
    ),
    Hostile(
        "numbers",
        "pretrain-heads-negative",
        lambda o, w: ["pretrain", "--task", "rules", "--out", str(w / "o"), "--num-heads", "-4"],
        "num_heads=-4 is invalid",
    ),
    Hostile(
        "numbers",
        "eval-temperature-denormal",
        lambda o, w: evaluate(o, "--temperature", "1e-310", "--samples", "2"),
        "temperature=1e-310 is invalid",
    ),
    Hostile(
        "numbers",
        "train-temperature-denormal",
        lambda o, w: train(o, w, "--set", "temperature=1e-310"),
        "temperature=1e-310 is invalid",
    ),
    Hostile(
        "numbers",
        "option-temperature-nan",
        lambda o, w: evaluate(o, "--task", "frozenlake", "--option", "temperature=.nan"),
        "temperature=nan",
    ),
    Hostile(
        "numbers",
        "train-max-new-tokens-huge",
        lambda o, w: train(o, w, "--set", "max_new_tokens=100000"),
        "plus max_new_tokens 100000 exceeds the model's maximum length",
    ),
    Hostile(
        "numbers",
        "eval-max-new-tokens-huge",
        lambda o, w: evaluate(o, "--max-new-tokens", "100000"),
        "plus max_new_tokens 100000 exceeds the model's maximum length",
    ),
    Hostile(
        "numbers",
        "demo-batch-size-zero",
        lambda o, w: ["demo", "--out", str(w / "demo"), "--batch-size", "0"],
        "--batch-size 0",
    ),
    Hostile(
        "numbers",
        "probe-temperature-denormal",
        lambda o, w: [
            "probe",
            "similarity",
            "--task",
            "rules",
            "--models",
            f"a={o}",
            "--temperature",
            "1e-310",
            "--out",
            str(w / "sim"),
        ],
        "temperature=1e-310 is invalid",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.cls}-{c.name}" for c in CASES])
def test_refused_with_one_line_nothing_changed(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    check_in_workspace(case, Path(tiny_rules_organism), tmp_path, monkeypatch, capsys)


def test_the_refusal_happens_before_the_model_loads_end_to_end(tiny_rules_organism, tmp_path, monkeypatch):
    """As a subprocess: stderr is exactly the one error line (no progress bar in front of it)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    case = Hostile(
        "config",
        "subprocess",
        lambda o, w: train(o, w, "--set", "chat_template_kwargs.x=1"),
        "does not take x",
        subprocess=True,
    )
    check(case, Path(tiny_rules_organism), ws, None)


@pytest.mark.parametrize(
    "pairs,field,value",
    [
        (["no_context_system=Note: be brief."], "no_context_system", "Note: be brief."),
        (["no_context_system=123"], "no_context_system", "123"),
        (["no_context_system="], "no_context_system", ""),
        (["no_context_system=null"], "no_context_system", None),
        (["teacher=null"], "teacher", None),
        (["chat_template_kwargs.date_string=2024-07-26"], "chat_template_kwargs", {"date_string": "2024-07-26"}),
        (["chat_template_kwargs.enable_thinking=false"], "chat_template_kwargs", {"enable_thinking": False}),
        (["task_options.rule=shift:2"], "task_options", {"rule": "shift:2"}),
        (
            ["task_options.family=[shift:1, reverse]"],
            "task_options",
            {"rule": "reverse", "family": ["shift:1", "reverse"]},
        ),
        # (the key is merged into the rules recipe's own task_options: its distilled rule stays)
        (["lr=1e-3"], "lr", 1e-3),
        (["steps=7"], "steps", 7),
        (["lr=1e-3", "lr=1e-2"], "lr", 1e-2),  # given again: the last one wins, as flags do
    ],
)
def test_text_stays_text_and_numbers_are_numbers(pairs, field, value):
    """Type-directed reading: the field's declared type decides; text fields never become dicts or dates."""
    import json

    import yaml

    from mechopd.core.config_parse import parse_overrides
    from mechopd.organisms.recipes import load_train_config

    cfg = load_train_config(None, parse_overrides(pairs))
    assert getattr(cfg, field) == value and type(getattr(cfg, field)) is type(value)
    d = cfg.to_dict()
    assert json.loads(json.dumps(d)) == d and yaml.safe_load(yaml.safe_dump(d)) == d  # what the run saves reads back


def test_the_same_words_in_every_verb(tiny_rules_organism):
    """--option K=V (train, eval, probe) reads as --set task_options.K=V; eval's --no-context-system as --set's text."""
    import argparse

    from mechopd.cli import make_parser
    from mechopd.cli.common import kv as _kv
    from mechopd.cli.common import text as _text
    from mechopd.core.config_parse import parse_overrides
    from mechopd.organisms.recipes import load_train_config

    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert all("--option" in {s for a in sub[v]._actions for s in a.option_strings} for v in ("train", "eval"))
    via_set = load_train_config(None, parse_overrides(["task_options.rule=shift:2", "task_options.max_len=4"]))
    assert _kv(["rule=shift:2", "max_len=4"], "--option") == via_set.task_options == {"rule": "shift:2", "max_len": 4}
    for text in ("Note: be brief.", "2024-07-26", "123", "", "null"):
        cfg = load_train_config(None, parse_overrides([f"no_context_system={text}"]))
        assert _text(text, "--no-context-system") == cfg.no_context_system


def test_demo_steps_are_honoured_under_fast():
    from mechopd.pipeline.demo import DemoConfig

    assert (DemoConfig(fast=True, steps=50).steps, DemoConfig(fast=True, batch_size=3).batch_size) == (50, 3)
    assert DemoConfig(fast=True).steps == 6  # --fast's own default when none is given
