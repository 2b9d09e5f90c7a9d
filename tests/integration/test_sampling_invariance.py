"""Every caller of the one sampler (generate.sampler.sample_rows) is batch-size invariant: batch 1 == batch N.

Row seeds come from (seed, item uid) in the probes and the evaluation, from (seed, step, global row) in the trainer;
the batch a row shares never enters its seed, and the uniforms of a row are drawn from its own generator.
"""

from __future__ import annotations

import pytest
import torch

from mechopd.config.sections import RolloutOptions
from mechopd.core.views import RenderSpec, render_prompt_ids
from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
from mechopd.generate.sampler import sample, sample_rows
from mechopd.generate.settings import SamplingSettings, stop_ids
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks.base import get_task


def _prompts(tok, task, n):
    spec = RenderSpec(task.placement)
    examples = task.examples("train", n, 0)
    return examples, [render_prompt_ids(tok, e.prompt, None, spec) for e in examples]


def test_sample_rows_is_batch_size_invariant_and_needs_seeds(organism_tokenizer, tiny_qwen3):
    tok = organism_tokenizer
    _, ids = _prompts(tok, get_task("rules"), 6)
    st = SamplingSettings(max_new_tokens=8, stop=stop_ids(tok, tiny_qwen3), pad_id=tok.pad_token_id, temperature=1.0)
    one = sample_rows(tiny_qwen3, ids, list(range(6)), st.replace(batch_size=1))
    assert one == sample_rows(tiny_qwen3, ids, list(range(6)), st.replace(batch_size=6))
    assert one == sample_rows(tiny_qwen3, ids, list(range(6)), st.replace(batch_size=4))
    assert one != sample_rows(tiny_qwen3, ids, list(range(10, 16)), st.replace(batch_size=6))  # the seeds matter
    with pytest.raises(ValueError, match="seed"):
        sample_rows(tiny_qwen3, ids, None, st.replace(batch_size=2))
    with pytest.raises(ValueError, match="row_seeds"):
        sample(tiny_qwen3, ids, st)  # no shared-generator path left to fall into


def test_sample_rows_shares_one_prefix_for_every_chunk(organism_tokenizer, tiny_qwen3):
    """shared_prefix "auto" is decided once over all prompts: a chunk of one row prefills the same shared prefix as a
    chunk of six, so a row's arithmetic does not depend on batch_size (a per-chunk decision flipped a sampled token
    where a uniform fell within 1e-6 of a CDF step: found by comparing the redesign to the old code step by step)."""
    tok = organism_tokenizer
    _, ids = _prompts(tok, get_task("rules"), 6)
    st = SamplingSettings(max_new_tokens=4, stop=stop_ids(tok, tiny_qwen3), pad_id=tok.pad_token_id, temperature=1.0)
    for batch_size in (1, 4, 6):
        paths: list[int] = []
        sample_rows(
            tiny_qwen3, ids, list(range(6)), st.replace(batch_size=batch_size, shared_prefix="auto"), paths=paths
        )
        assert len(set(paths)) == 1 and paths[0] >= 8, (batch_size, paths)  # one decision, the prefix really shared
        off: list[int] = []
        sample_rows(tiny_qwen3, ids, list(range(6)), st.replace(batch_size=batch_size, shared_prefix="off"), paths=off)
        assert set(off) == {0}


def test_trainer_rollout_honours_shared_prefix_off(tiny_rules_organism, tmp_path, monkeypatch):
    """`shared_prefix: off` reaches the rollout too (it was passed to scoring and evaluation only)."""
    import mechopd.train.trainer as T
    from mechopd.config import TrainConfig

    seen = []
    real = T.sample_rows
    monkeypatch.setattr(T, "sample_rows", lambda *a, **k: seen.append(a[3].shared_prefix) or real(*a, **k))
    for mode in ("off", "auto"):
        cfg = TrainConfig(
            task="rules",
            student=str(tiny_rules_organism),
            steps=1,
            batch_size=4,
            lr=1e-3,
            shared_prefix=mode,
            pool_size=8,
        )
        tr = T.Trainer(cfg, tmp_path / mode, progress=False)
        tr.rollout(tr._examples(), range(4))
    assert seen == ["off", "auto"]


def test_trainer_rollout_batch_one_equals_batch_n(tiny_rules_organism, tmp_path):
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import Trainer

    cfg = TrainConfig(
        student=str(tiny_rules_organism), steps=1, batch_size=5, max_new_tokens=6, pool_size=16, temperature=1.0
    )
    tr = Trainer(cfg, tmp_path / "run", progress=False)
    examples = tr._examples()
    full = tr.rollout(examples, range(0, 5))
    rows = [tr.rollout(examples, range(i, i + 1)) for i in range(5)]
    assert full[2] == [r[2][0] for r in rows]  # response ids, row by row
    assert full[0] == [r[0][0] for r in rows] and full[1] == [r[1][0] for r in rows]
    assert full[3]["train_acc_x"] == sum(r[3]["train_acc_x"] for r in rows)


def test_evaluation_batch_one_equals_batch_n(tiny_rules_organism):
    m, tok = load_model(tiny_rules_organism), load_tokenizer(tiny_rules_organism)
    task = get_task("rules")
    kw = dict(n=4, seed=2, samples=2, temperature=1.0, n_boot=10)
    one = evaluate_model(m, tok, task, EvalConfig(batch_size=1, **kw))
    many = evaluate_model(m, tok, task, EvalConfig(batch_size=16, **kw))
    assert one["records"] == many["records"]


def test_similarity_responses_batch_one_equals_batch_n(organism_tokenizer, tiny_qwen3):
    from mechopd.probes.items import sample_responses

    task = get_task("rules")
    ex = task.examples("test", 5, 0)
    kw = dict(rollout=RolloutOptions(max_new_tokens=8, temperature=1.0), seed=3)
    one = sample_responses(tiny_qwen3, organism_tokenizer, task, ex, RenderSpec("system"), batch_size=1, **kw)
    assert one == sample_responses(tiny_qwen3, organism_tokenizer, task, ex, RenderSpec("system"), batch_size=5, **kw)


def test_gradients_batch_one_equals_batch_n(organism_tokenizer, tiny_qwen3):
    from mechopd.probes.gradients import sample_batch

    task = get_task("rules")
    ex = task.examples("train", 5, 0)
    kw = dict(rollout=RolloutOptions(temperature=1.0, max_new_tokens=8), seed=4)
    one = sample_batch(tiny_qwen3, organism_tokenizer, task, ex, RenderSpec("system"), batch_size=1, **kw)
    many = sample_batch(tiny_qwen3, organism_tokenizer, task, ex, RenderSpec("system"), **kw)
    assert torch.equal(one.response_ids, many.response_ids) and torch.equal(one.input_ids_c, many.input_ids_c)


def test_teachability_bank_batch_one_equals_batch_n(organism_tokenizer, tiny_qwen3):
    from mechopd.probes.teachability_bank import build_bank

    task = get_task("rules")
    one = build_bank(tiny_qwen3, organism_tokenizer, task, 5, 0, temperature=1.0, batch_size=1)
    many = build_bank(tiny_qwen3, organism_tokenizer, task, 5, 0, temperature=1.0, batch_size=5)
    assert one.responses == many.responses and one.uids == many.uids
