"""Training with vLLM rollouts: after every optimizer step vLLM samples from exactly the trainer's weights."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the optional extra: pip install -e .[vllm])")
pytestmark = pytest.mark.vllm

from mechopd.config import TrainConfig  # noqa: E402
from mechopd.generate.sampler import sample  # noqa: E402
from mechopd.generate.settings import SamplingSettings  # noqa: E402
from mechopd.train.trainer import Trainer  # noqa: E402
from tests.vllm.conftest import max_weight_diff  # noqa: E402


def _cfg(student, steps: int) -> TrainConfig:
    return TrainConfig(
        task="rules",
        student=str(student),
        method="nca",
        estimator="full",
        batch_size=4,
        steps=steps,
        lr=1e-2,
        save_every=2,
        eval_every=0,
        seed=3,
        rollout_engine="vllm",
    )


def _greedy(trainer: Trainer, decoder: str) -> list[list[int]]:
    ids = [trainer._render(ex.prompt, None) for ex in trainer.pool[:6]]
    engine = trainer.engine if decoder == "vllm" else decoder
    st = SamplingSettings.for_model(trainer.tokenizer, trainer.student, max_new_tokens=10, greedy=True, engine=engine)
    return sample(trainer.student, ids, st).responses


def test_vllm_weights_follow_the_trainer_and_a_resumed_run_resyncs(hd32_rules_organism, tmp_path, readable_weights):
    out = tmp_path / "run"
    tr = Trainer(_cfg(hd32_rules_organism, 3), out, progress=False)
    assert max_weight_diff(tr.engine, tr.student) == 0.0  # synced at start
    for _ in range(3):
        tr.train_step()
        assert max_weight_diff(tr.engine, tr.student) == 0.0  # after every optimizer step
    assert tr.engine.loads == 4
    assert _greedy(tr, "vllm") == _greedy(tr, "lean")
    trained = {n: p.detach().clone() for n, p in tr.student.named_parameters()}
    tr.save(out / "checkpoints" / "step-3")  # save_every=2 wrote step-2 in the run; step-3 written here
    tr.engine.close()
    del tr
    # a resumed run builds its engine from the checkpoint and syncs it before its first rollout
    res = Trainer(_cfg(hd32_rules_organism, 5), out, resume=True, progress=False)
    assert res.step == 3
    assert all(float((p.detach() - trained[n]).abs().max()) == 0.0 for n, p in res.student.named_parameters())
    assert max_weight_diff(res.engine, res.student) == 0.0
    res.run()
    assert max_weight_diff(res.engine, res.student) == 0.0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    assert [r["step"] for r in lines if "loss" in r][-2:] == [4, 5]
    assert all(r["samples"] == 4 for r in lines if "loss" in r)
