"""What `mechopd train` says and where it logs (mechopd/train/reporting.py): the config as one line, one line per
periodic evaluation with the numbers metrics.jsonl holds, the last evaluation with intervals at the end; TensorBoard
and W&B (offline) runs write their logs with the metric names of metrics.jsonl and the config once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mechopd.cli import main

ARGS = [
    "--steps",
    "2",
    "--eval-every",
    "1",
    "--set",
    "eval_n=4",
    "--set",
    "batch_size=4",
    "--set",
    "pool_size=32",
    "--set",
    "max_new_tokens=6",
    "--no-progress",
]


def _train(org: Path, out: Path, *extra: str) -> None:
    assert main(["train", "--student", str(org), *ARGS, "--out", str(out), *extra]) == 0


def _metrics(out: Path) -> list[dict]:
    return [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def test_train_prints_the_config_line_and_every_evaluation(tiny_rules_organism, tmp_path, capsys):
    out = tmp_path / "run"
    _train(tiny_rules_organism, out)
    text = capsys.readouterr().out
    lines = text.splitlines()
    config = [ln for ln in lines if ln.startswith("config (new run):")]
    assert len(config) == 1 and f"full config: {out / 'config.yaml'}" in config[0] and "steps=2" in config[0]
    assert "resolved config" not in text and "eval_every=1" in config[0]
    evals = [m for m in _metrics(out) if "eval/acc_x" in m]
    assert [m["step"] for m in evals] == [0, 1, 2]
    for m in evals:  # the printed numbers are the logged ones
        want = (
            f"step {m['step']}/2 · eval (n=4): Acc_x {_fmt(m['eval/acc_x'])} · Acc_xc {_fmt(m['eval/acc_xc'])} · "
            f"Harm {_fmt(m['eval/harm'])} · Help {_fmt(m['eval/help'])}"
        )
        assert want in lines
    done = [ln for ln in lines if ln.startswith("done: step 2/2 · eval (n=4, 95 % paired bootstrap): Acc_x ")]
    assert len(done) == 1 and "evaluated at step" not in done[0]
    assert re.search(rf"Acc_x {re.escape(_fmt(evals[-1]['eval/acc_x']))}( \[[0-9.]+, [0-9.]+\])?", done[0])
    assert lines.count(f"final checkpoint: {out / 'final'}") == 1


def test_verbose_prints_the_full_config_and_a_late_evaluation_is_named(tiny_rules_organism, tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--student",
                str(tiny_rules_organism),
                *ARGS,
                "--set",
                "steps=3",
                "--set",
                "eval_every=2",
                "--out",
                str(out),
                "--verbose",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "resolved config (new run" in text and "\n  eval_n: 4\n" in text
    assert "done: step 3/3" in text and f"(evaluated at step 2, not the final step: mechopd eval --run {out})" in text


def test_run_train_in_python_prints_one_config_line(tiny_rules_organism, tmp_path, capsys):
    import mechopd

    mechopd.run_train(
        {"student": str(tiny_rules_organism), "steps": 1, "batch_size": 2, "pool_size": 16, "max_new_tokens": 4},
        tmp_path / "py",
        progress=False,
    )
    text = capsys.readouterr().out
    assert "resolved config" not in text and text.count("config (new run):") == 1
    assert "no periodic evaluation (eval_every=0)" in text


def test_tensorboard_run_writes_the_jsonl_metrics_and_the_config_once(tiny_rules_organism, tmp_path):
    pytest.importorskip(
        "tensorboard", reason='the extra mechopd[tensorboard] is not installed (pip install -e ".[tensorboard]")'
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    _train(tiny_rules_organism, out, "--set", "log_tensorboard=true")
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    metrics = _metrics(out)
    names = {k for m in metrics for k, v in m.items() if k != "step" and isinstance(v, (int, float))}
    assert {"loss", "kl/teacher_student", "eval/acc_x", "eval/acc_xc"} <= names
    assert names == set(acc.Tags()["scalars"])
    for name in ("loss", "eval/acc_x"):
        want = [(m["step"], m[name]) for m in metrics if isinstance(m.get(name), (int, float))]
        got = [(e.step, e.value) for e in acc.Scalars(name)]
        assert [s for s, _ in got] == [s for s, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)
    assert [t for t in acc.Tags()["tensors"] if t.startswith("config")] == ["config/text_summary"]


def wandb_records(path: Path):
    """The protobuf records of an offline ``run-*.wandb`` file: a 7-byte W&B header, then LevelDB's log format
    (32 KiB blocks; per chunk crc32, length, type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb2

    data, pos, part = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            rec = pb2.Record()
            rec.ParseFromString(part)
            yield rec


def test_wandb_offline_run_writes_its_log_and_the_config(tiny_rules_organism, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason='the extra mechopd[wandb] is not installed (pip install -e ".[wandb]")')
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline by default: nothing leaves the machine
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    _train(tiny_rules_organism, out, "--set", "log_wandb=true", "--set", "wandb_project=mechopd-test")
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    records = list(wandb_records(next(runs[0].glob("run-*.wandb"))))
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            history[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
    metrics = _metrics(out)
    want = {}
    for m in metrics:  # the same names and steps as metrics.jsonl (None: not a number, not logged)
        want.setdefault(m["step"], {}).update({k: v for k, v in m.items() if k != "step" and v is not None})
    assert sorted(history) == sorted(want) == [0, 1, 2]
    for step, row in want.items():
        assert set(history[step]) == set(row)
        assert [history[step][k] for k in sorted(row)] == pytest.approx([row[k] for k in sorted(row)], rel=1e-9)
    runs_rec = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert len(runs_rec) == 1 and runs_rec[0].project == "mechopd-test"
    config = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in runs_rec[0].config.update}
    assert config["eval_n"] == {"value": 4} or config["eval_n"] == 4
