"""``rollout_dtype: bfloat16`` (`mechopd.train.rollcopy`): the training rollouts come from a bfloat16 copy of the
float32 student, the copy follows every optimizer step, the default changes nothing, and the settings where a copy
means nothing are refused with one line (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mechopd.config import TrainConfig
from mechopd.generate.sampler import sample_rows, stable_seed
from mechopd.models import load_model
from mechopd.train.trainer import Trainer
from tests.cli.hostile import Hostile, check_in_workspace, train

ROWS = 8


def _cfg(student: Path, **kw) -> TrainConfig:
    base = dict(task="rules", batch_size=ROWS, steps=2, lr=3e-3, max_new_tokens=10, pool_size=16, seed=3)
    return TrainConfig(student=str(student), temperature=1.0, **{**base, **kw})


def _direct(model, tr: Trainer, ids: list[list[int]]) -> list[list[int]]:
    """The rows' responses sampled by `model` with the trainer's row seeds and settings, outside the trainer."""
    seeds = [stable_seed(tr.parts.cfg.seed, tr.step, i) % (2**31) for i in range(len(ids))]
    return sample_rows(model, ids, seeds, tr.parts.sampling.replace(batch_size=len(ids)))


def _bf16(path: Path):
    """The student's weights cast to bfloat16 parameter by parameter (buffers as loaded), made here by hand."""
    model = load_model(path)
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    return model.requires_grad_(False)


def test_bf16_rollouts_come_from_the_copy_which_follows_each_step(tiny_rules_organism, tmp_path):
    org = Path(tiny_rules_organism)
    tr = Trainer(_cfg(org, rollout_dtype="bfloat16"), tmp_path / "bf16", progress=False)
    copy = tr.parts.rollout_copy
    assert copy is not None and {p.dtype for p in copy.model.parameters()} == {torch.bfloat16}
    student = tr.parts.models.student
    assert {p.dtype for p in student.parameters()} == {torch.float32}  # the loss's model stays float32
    assert tr.evaluator.student is student  # evaluation (greedy included) reads the float32 student, not the copy
    examples = tr._examples()
    ids = [tr._render(ex.prompt, None) for ex in examples]
    got = tr.rollout(examples, range(ROWS))[2]
    assert got == _direct(_bf16(org), tr, ids)
    assert got != _direct(load_model(org), tr, ids)  # the float32 student would have drawn other ids here

    before = {n: p.detach().clone() for n, p in copy.model.named_parameters()}
    tr.train_step()
    own = dict(copy.model.named_parameters())
    moved = 0
    for n, p in student.named_parameters():
        assert torch.equal(own[n], p.detach().to(torch.bfloat16)), n  # refreshed: the cast of the updated weights
        moved += not torch.equal(own[n], before[n])
    assert moved > len(own) // 2  # the step moved the copy with the student
    tr.close()


def test_the_default_samples_from_the_student_itself(tiny_rules_organism, tmp_path):
    org = Path(tiny_rules_organism)
    tr = Trainer(_cfg(org), tmp_path / "same", progress=False)
    assert tr.parts.rollout_copy is None
    examples = tr._examples()
    ids = [tr._render(ex.prompt, None) for ex in examples]
    assert tr.rollout(examples, range(ROWS))[2] == _direct(load_model(org), tr, ids)
    tr.close()


def test_a_lora_student_copies_its_adapter_only(tiny_rules_organism, tmp_path):
    """A LoRA student's copy casts the frozen base once and re-casts only the adapter's A and B after a step."""
    tr = Trainer(_cfg(Path(tiny_rules_organism), rollout_dtype="bfloat16", lora_rank=4), tmp_path / "l", progress=False)
    copy = tr.parts.rollout_copy
    assert copy is not None
    tr.train_step()
    own = dict(copy.model.named_parameters())
    trained = [(n, p) for n, p in tr.parts.models.student.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n, _ in trained)
    for n, p in trained:
        assert torch.equal(own[n], p.detach().to(torch.bfloat16)), n
    tr.close()


def test_the_follow_terms_rollout_samples_from_the_copy_too(tiny_rules_organism, tmp_path, monkeypatch):
    """The c′ batch (`train.otherbatch`) is a training rollout too: drawn by the copy, never the float32 student."""
    import mechopd.train.otherbatch as O

    drawn = []
    real = O.sample_rows
    monkeypatch.setattr(O, "sample_rows", lambda m, *a, **k: drawn.append(m) or real(m, *a, **k))
    cfg = _cfg(Path(tiny_rules_organism), rollout_dtype="bfloat16", follow_weight=1.0, batch_size=4, steps=1)
    with Trainer(cfg, tmp_path / "f", progress=False) as tr:
        rec = tr.train_step()
        copy = tr.parts.rollout_copy
        assert copy is not None and drawn and all(m is copy.model for m in drawn)
    assert rec["loss/follow"] >= 0.0


REFUSED = [
    Hostile("config", "bf16-student", lambda o, w: train(o, w, "--set", "rollout_dtype=bfloat16", "--set",
            "dtype=bfloat16"), "rollout_dtype=bfloat16 needs dtype: float32"),
    Hostile("config", "bf16-vllm", lambda o, w: train(o, w, "--set", "rollout_dtype=bfloat16", "--set",
            "rollout_engine=vllm"), "set rollout_engine=auto or rollout_dtype=same"),
    Hostile("config", "bf16-fsdp", lambda o, w: train(o, w, "--set", "rollout_dtype=bfloat16", "--set",
            "sharding=fsdp"), "rollout_dtype=bfloat16 needs sharding: none"),
    Hostile("config", "bf16-typo", lambda o, w: train(o, w, "--set", "rollout_dtype=bf16"), "rollout_dtype"),
]  # fmt: skip


@pytest.mark.parametrize("case", REFUSED, ids=[c.name for c in REFUSED])
def test_refused_where_a_copy_means_nothing(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    check_in_workspace(case, Path(tiny_rules_organism), tmp_path, monkeypatch, capsys)
