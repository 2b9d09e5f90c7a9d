"""`train.profile`: every step logs seconds and tokens/s per stage; the stages are disjoint (their sum stays within the
step's wall time) and each one of an NCA step took time."""

from __future__ import annotations

import json

import pytest

from mechopd.config import TrainConfig
from mechopd.train.profile import STAGES
from mechopd.train.trainer import train


@pytest.mark.parametrize("method, selector", [("nca", "full"), ("opd", "ta_opd")])
def test_each_step_logs_time_and_tokens_per_second_per_stage(tiny_rules_organism, tmp_path, method, selector):
    train(
        TrainConfig(
            student=str(tiny_rules_organism),
            task="rules",
            method=method,
            selector=selector,
            steps=2,
            batch_size=4,
            lr=1e-3,
            max_new_tokens=6,
            pool_size=16,
            logit_chunk=2,
            micro_batch_size=2,
        ),
        tmp_path / "r",
        progress=False,
    )
    for r in [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]:
        for s in STAGES:
            assert r[f"time/{s}"] > 0, s
            assert r[f"tokens_per_s/{s}"] == pytest.approx(r["response_tokens"] / r[f"time/{s}"])
        assert sum(r[f"time/{s}"] for s in STAGES) <= r["step_s"] * 1.001 + 1e-4  # disjoint: nothing counted twice
        assert r["time/rollout"] == r["rollout_s"]
