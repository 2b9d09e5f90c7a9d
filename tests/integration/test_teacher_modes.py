"""Teacher modes (frozen | live | ema) for full and LoRA students on the tiny rules organism: the anchor gate and the
per-term gradient statistics run with each; a resumed LoRA + EMA run equals an uninterrupted one (adapter, merged
weights and the teacher's average all restored); ``mechopd train --set teacher_mode=ema`` trains."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from mechopd.config import TrainConfig
from mechopd.models import lora
from mechopd.train.teachers import EMA_FILE
from mechopd.train.trainer import train

BASE = dict(task="rules", batch_size=4, steps=2, lr=3e-3, max_new_tokens=6, seed=1, pool_size=32, method="nca")


def _cfg(student, **kw):
    return TrainConfig(student=str(student), **{**BASE, **kw})


def _lines(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["frozen", "live", "ema"])
@pytest.mark.parametrize("rank", [0, 4])
def test_gate_and_grad_stats_run_with_every_teacher_mode(tiny_rules_organism, tmp_path, mode, rank):
    train(
        _cfg(
            tiny_rules_organism,
            teacher_mode=mode,
            lora_rank=rank,
            nca_gate=100.0,
            nca_gate_window=1,
            grad_stats_every=1,
        ),
        tmp_path / "r",
        progress=False,
    )
    recs = _lines(tmp_path / "r")
    assert [r["step"] for r in recs] == [1, 2]
    assert recs[0]["beta_eff"] == 0.0 and recs[1]["beta_eff"] == 0.5  # the gate opened after step 1's KL
    for key in ("grad/norm/opd", "grad/norm/nca"):
        assert recs[1][key] > 0 and torch.isfinite(torch.tensor(recs[1][key]))
    assert (recs[0]["trainable_share"] < 1.0) == (rank > 0)


def test_lora_ema_resume_equals_uninterrupted(tiny_rules_organism, tmp_path):
    kw = dict(lora_rank=4, teacher_mode="ema", ema_decay=0.5, steps=4, save_every=2)
    full = train(_cfg(tiny_rules_organism, **kw), tmp_path / "a", progress=False)
    train(_cfg(tiny_rules_organism, **{**kw, "steps": 2}), tmp_path / "b", progress=False)
    assert (tmp_path / "b" / "checkpoints" / "step-2" / EMA_FILE).is_file()
    resumed = train(_cfg(tiny_rules_organism, **kw), tmp_path / "b", resume=True, progress=False)
    for name in ("model.safetensors", f"{lora.ADAPTER_DIR}/{lora.ADAPTER_WEIGHTS}"):
        wa, wb = load_file(str(full / name)), load_file(str(resumed / name))
        assert set(wa) == set(wb)
        for k in wa:
            torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5, msg=f"{name} {k}")
    assert [r["step"] for r in _lines(tmp_path / "b")] == [1, 2, 3, 4]
    adapter = load_file(str(full / lora.ADAPTER_DIR / lora.ADAPTER_WEIGHTS))
    assert any(float(t.abs().max()) > 0 for k, t in adapter.items() if ".lora_B." in k)  # it trained


def test_cli_teacher_mode_ema_trains(tiny_rules_organism, tmp_path):
    from mechopd.cli import main

    rc = main(
        [
            "train",
            "--student",
            str(tiny_rules_organism),
            "--task",
            "rules",
            "--method",
            "nca",
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--no-progress",
            "--set",
            "max_new_tokens=6",
            "--set",
            "pool_size=16",
            "--set",
            "teacher_mode=ema",
            "--out",
            str(tmp_path / "ema"),
        ]
    )
    assert rc == 0
    recs = _lines(tmp_path / "ema")
    assert [r["step"] for r in recs] == [1, 2] and all(r["trainable_share"] == 1.0 for r in recs)
    assert "teacher_mode: ema" in (tmp_path / "ema" / "config.yaml").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("sets", [["lora_rank=4", "teacher_mode=ema"], ["teacher_mode=live"]], ids=["lora-ema", "live"])
def test_two_processes_equal_one_with_a_moving_teacher(tiny_rules_organism, tmp_path, sets):
    """Replicas (sharding: none) over two processes: the EMA average and the live teacher follow identical replicas,
    so the weights (merged; adapter) and the logged values equal one process's (as tests/integration/
    test_two_process.py for the frozen teacher)."""
    from tests.integration.test_two_process import _assert_same, _run, _torchrun

    args = [
        "train",
        "--student",
        str(tiny_rules_organism),
        "--set",
        "batch_size=8",
        "--set",
        "lr=1e-3",
        "--set",
        "max_new_tokens=8",
        "--set",
        "seed=2",
        "--set",
        "pool_size=64",
        "--set",
        "method=nca",
        "--set",
        "steps=2",
        "--no-progress",
        *[x for s in sets for x in ("--set", s)],
    ]
    _run([sys.executable, "-m", "mechopd.cli", *args, "--out", str(tmp_path / "one")], tmp_path)
    _run([*_torchrun(), *args, "--out", str(tmp_path / "two")], tmp_path)
    _assert_same(tmp_path / "one", tmp_path / "two")
