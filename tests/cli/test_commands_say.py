"""Commands that do what they say: `--resume` on a new directory starts the run and after a run without checkpoints
says what to do; a missing local model path is reported before any hub lookup; the method list of an error equals the
help's; a probe does not replace a run's probe files without --force; Python callers read Python argument names;
``dir(mechopd)`` is the public API. The README's Commands section runs in `test_readme_commands.py`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mechopd
from mechopd.cli import main, make_parser
from mechopd.core.errors import MechopdError

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--set", "batch_size=2", "--set", "pool_size=16", "--set", "max_new_tokens=4", "--no-progress"]


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err, err
    return err


def test_resume_on_a_new_directory_starts_and_a_finished_run_without_checkpoints_says_what_to_do(
    tiny_rules_organism, tmp_path, capsys
):
    out = tmp_path / "x"
    argv = [
        "train",
        "--student",
        str(tiny_rules_organism),
        "--set",
        "beta=0.1",
        "--set",
        "selector=ta_opd",
        "--steps",
        "1",
        *SMALL,
        "--out",
        str(out),
        "--resume",
    ]  # the README's line, small
    assert main(argv) == 0
    assert f"--resume: {out} holds no run yet; starting a new run" in capsys.readouterr().out
    assert (out / "final" / "config.json").is_file()
    assert main(argv) == 2
    err = _err(capsys)
    assert f"finished at step 1 (its model is {out / 'final'})" in err and "save_every" in err
    with pytest.raises(MechopdError) as e:  # the same refusal in Python names Python arguments
        mechopd.run_train(
            {"student": str(tiny_rules_organism), "steps": 1, "batch_size": 2, "pool_size": 16, "max_new_tokens": 4},
            out,
            progress=False,
        )
    assert "resume=True" in str(e.value) and "--resume" not in str(e.value) and "--out" not in str(e.value)


def test_a_missing_local_model_is_reported_before_any_hub_lookup(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert main(["eval", "--model", "runs/nonexistent", "--task", "rules", "--n", "2"]) == 2
    err = capfd.readouterr().err
    assert "model path 'runs/nonexistent' does not exist" in err and "huggingface.co" not in err


def test_method_lists_agree_between_the_error_and_the_help(capsys):
    from mechopd.config import method_names

    assert main(["train", "--method", "follow", "--out", "unused"]) == 2
    err = _err(capsys)
    assert f"choose one of {', '.join(method_names())}" in err and "--set follow_weight=1" in err
    train = next(
        a
        for a in make_parser()._subparsers._group_actions[0].choices["train"]._actions
        if "--method" in a.option_strings
    )
    listed = re.search(r"\(default '[a-z_]+'; ([a-z_ |]+)\)", train.help)  # the registry's names, generated
    assert listed and listed.group(1).split(" | ") == method_names()
    assert "follow_weight=1" in (ROOT / "README.md").read_text()


def test_a_probe_does_not_replace_a_runs_files_without_force(tiny_qwen3, organism_tokenizer, tmp_path, capsys):
    for name in ("base", "opd"):
        tiny_qwen3.save_pretrained(tmp_path / name)
        organism_tokenizer.save_pretrained(tmp_path / name)
    out = tmp_path / "run" / "probes"
    argv = [
        "probe",
        "deltas",
        "--base",
        str(tmp_path / "base"),
        "--models",
        f"opd={tmp_path / 'opd'}",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    before = (out / "deltas.csv").read_bytes()
    capsys.readouterr()
    assert main(argv) == 2
    assert "already exists" in _err(capsys) and (out / "deltas.csv").read_bytes() == before
    assert main([*argv, "--force"]) == 0


def test_the_namespace_is_the_public_api():
    names = dir(mechopd)
    assert {"run_train", "run_eval", "__version__", "probes", "plots"} <= set(names)
    assert not {"Any", "Path", "annotations", "re"} & set(names) and not [
        n for n in names if n.startswith("_") and n != "__version__"
    ]
