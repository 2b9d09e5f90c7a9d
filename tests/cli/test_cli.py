"""The commands as a user types them: bad input gives one line on stderr and exit code 2, nothing overwritten."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mechopd.cli import main


def _err(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["train", "--task", "nosuch", "--student", "x"], "unknown task 'nosuch'"),
        (["train", "--method", "ppo"], "method='ppo' is unknown"),
        (["train", "--beta", "-1"], "beta=-1.0 is invalid"),
        (["train", "--budget", "1.5"], "budget=1.5 is invalid"),
        (["train", "--budget", "0"], "budget=0.0 is invalid"),
        (["train", "--set", "k=0"], "k=0 is invalid"),
        (["train", "--set", "selector=best"], "selector='best' is unknown"),
        (["train", "--set", "lr=fast"], "lr='fast' is not a valid float"),
        (["train", "--set", "nosuchkey=1"], "unknown key(s) nosuchkey"),
        (["train", "missing.yaml"], "config file missing.yaml does not exist"),
        (["eval", "--task", "rules", "--model", "/nonexistent/dir"], "does not exist"),
        (["eval", "--task", "nosuch", "--model", "x"], "unknown task"),
        (["pretrain", "--task", "chess"], "task='chess' is unknown"),
        (["probe", "gradients", "--model", "/nope", "--task", "rules", "--terms", "opd"], "must name two terms"),
        (["figures", "/nonexistent/run"], "does not exist"),
        (["eval", "--task", "rules", "--compare", "a=x", "b=y", "--out", "cmp.json"], "--compare writes a directory"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    code, err = _err(capsys, argv)
    assert code == 2
    assert err.startswith("error: ") and "\n" not in err
    assert needle in err


def test_eval_empty_set_and_missing_context_file(capsys, tiny_rules_organism, tmp_path):
    code, err = _err(capsys, ["eval", "--task", "rules", "--model", str(tiny_rules_organism), "--n", "0"])
    assert code == 2 and "evaluation set is empty" in err
    code, err = _err(
        capsys, ["eval", "--task", "jsonl", "--option", "path=/no/such.jsonl", "--model", str(tiny_rules_organism)]
    )
    assert code == 2 and "/no/such.jsonl" in err


def test_eval_refuses_model_lacking_task_tokens(capsys, tiny_rules_organism, tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"prompt": "zyzzyva quux?", "answer": "blorp", "context": "frobnicate"}) + "\n")
    code, err = _err(
        capsys, ["eval", "--task", "jsonl", "--option", f"path={data}", "--model", str(tiny_rules_organism)]
    )
    assert code == 2 and "lacks tokens" in err


def test_train_refuses_existing_run_and_keeps_it(capsys, tiny_rules_organism, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("precious\n")
    code, err = _err(capsys, ["train", "--student", str(tiny_rules_organism), "--out", str(out), "--steps", "1"])
    assert code == 2 and "--resume" in err
    assert (out / "metrics.jsonl").read_text() == "precious\n"


def test_eval_writes_report_and_summary(capsys, tiny_rules_organism, tmp_path):
    out = tmp_path / "rep.json"
    assert main(["eval", "--task", "rules", "--model", str(tiny_rules_organism), "--n", "12", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "acc_x" in text and "regime" in text
    rep = json.loads(out.read_text())
    assert rep["summary"]["n"] == 12 and len(rep["records"]) == 12
    assert out.with_suffix(".csv").exists()


def test_console_script_exit_code(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "mechopd.cli", "train", "--method", "ppo"], capture_output=True, text=True, cwd=tmp_path
    )
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "ppo" in res.stderr
