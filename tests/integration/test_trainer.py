"""The one training loop on a tiny rules organism: methods, metrics, resume, refusal, NaN guard."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from mechopd.config import TrainConfig
from mechopd.errors import TrainingError
from mechopd.train.trainer import train

BASE = dict(task="rules", batch_size=8, steps=3, lr=1e-3, max_new_tokens=8, seed=1, pool_size=64)


def _cfg(student, **kw):
    return TrainConfig(student=str(student), **{**BASE, **kw})


def _weights(d):
    return load_file(str(d / "model.safetensors"))


@pytest.mark.parametrize("method,selector", [("opd", "full"), ("nca", "full"), ("opd", "ta_opd"), ("dual_opd", "full"),
                                             ("sym_kl", "random")])
def test_methods_run_and_log(tiny_rules_organism, tmp_path, method, selector):
    final = train(_cfg(tiny_rules_organism, method=method, selector=selector), tmp_path / "run", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]
    for r in lines:
        assert r["loss/opd"] >= 0 and r["tokens_per_s"] > 0 and 0 < r["kept_fraction"] <= 1
        assert torch.isfinite(torch.tensor(r["loss"]))
    if method == "nca":
        assert "loss/nca" in lines[0]
    if selector == "ta_opd":
        assert lines[0]["kept_fraction"] < 0.5
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(final)  # loadable HF checkpoint


def test_loss_falls_on_rules_organism(tiny_rules_organism, tmp_path):
    train(_cfg(tiny_rules_organism, steps=12, lr=3e-3, estimator="full"), tmp_path / "r", progress=False)
    kl = [json.loads(x)["kl/teacher_student"] for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert sum(kl[-3:]) / 3 < sum(kl[:3]) / 3


def test_resume_equals_uninterrupted(tiny_rules_organism, tmp_path):
    full = train(_cfg(tiny_rules_organism, steps=4, save_every=2, method="nca"), tmp_path / "a", progress=False)
    train(_cfg(tiny_rules_organism, steps=2, save_every=2, method="nca"), tmp_path / "b", progress=False)
    resumed = train(_cfg(tiny_rules_organism, steps=4, save_every=2, method="nca"), tmp_path / "b", resume=True,
                    progress=False)
    wa, wb = _weights(full), _weights(resumed)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5)
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_existing_run_is_refused_without_resume(tiny_rules_organism, tmp_path):
    train(_cfg(tiny_rules_organism, steps=1), tmp_path / "r", progress=False)
    before = (tmp_path / "r" / "metrics.jsonl").read_text()
    with pytest.raises(TrainingError, match="--resume"):
        train(_cfg(tiny_rules_organism, steps=1), tmp_path / "r", progress=False)
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == before


def test_nan_loss_stops_and_names_step_and_term(tiny_rules_organism, tmp_path):
    from mechopd.train.trainer import Trainer

    trainer = Trainer(_cfg(tiny_rules_organism, save_every=1), tmp_path / "r", progress=False)
    with torch.no_grad():  # NaN teacher in memory (a NaN checkpoint is refused at load time, see below)
        trainer.teacher.model.norm.weight.fill_(float("nan"))
    with pytest.raises(TrainingError, match=r"loss term 'opd' became nan at step 1"):
        trainer.run()
    assert not (tmp_path / "r" / "checkpoints").exists() and not (tmp_path / "r" / "final").exists()


def test_nan_teacher_checkpoint_is_refused_at_load(tiny_rules_organism, tmp_path):
    from mechopd.errors import ModelError
    from mechopd.models import atomic_save, load_model, load_tokenizer

    bad = load_model(tiny_rules_organism)
    with torch.no_grad():
        bad.model.norm.weight.fill_(float("nan"))
    atomic_save(bad, load_tokenizer(tiny_rules_organism), tmp_path / "nan_teacher")
    with pytest.raises(ModelError, match=r"nan_teacher/model.safetensors: tensor 'model.norm.weight' holds 32 NaN"):
        train(_cfg(tiny_rules_organism, teacher=str(tmp_path / "nan_teacher")), tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()
