"""The trainer's periodic evaluation decodes with the run's response cap (`max_new_tokens`), not the task's."""

from __future__ import annotations

import contextlib

import pytest

from mechopd.config import TrainConfig
from mechopd.train import evaluator


@pytest.mark.parametrize("cap", [None, 6])
def test_periodic_evaluation_takes_the_runs_max_new_tokens(monkeypatch, cap):
    seen = []

    def fake(student, tokenizer, task, ecfg, spec, train_uids=None, engine=None):
        seen.append(ecfg)
        s = {k: {"value": 0.0} for k in evaluator.HEADLINE}
        return {"summary": s}

    monkeypatch.setattr(evaluator, "evaluate_model", fake)
    monkeypatch.setattr(evaluator, "eval_line", lambda *a: "")

    class Shard:
        def gathered(self, model):
            return contextlib.nullcontext()

    cfg = TrainConfig(max_new_tokens=cap, eval_n=4)
    pe = evaluator.PeriodicEval(cfg, None, None, None, set(), None, Shard(), None, 0, False)
    assert pe.evaluate(1)["eval/acc_x"] == 0.0
    assert seen[0].max_new_tokens == cap and seen[0].n == 4
