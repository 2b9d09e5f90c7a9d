"""Heads padded past the tokenizer (as Qwen2.5's 151665-id tokenizer on a 151936-row head) and a student head larger
than its teacher's (Qwen2.5-7B's 152064 rows over 3B's 151936): no id the tokenizer does not know is ever sampled,
scored as a target or fed to the teacher; the larger student trains on the common ids (docs/method.md)."""

from __future__ import annotations

import json

import pytest
import torch

from mechopd.core.views import RenderSpec, build_two_view_batch, render_prompt_ids
from mechopd.generate.sampler import sample
from mechopd.generate.scorer import score_views
from mechopd.generate.settings import SamplingSettings, known_vocab
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks.base import get_task


def _padding_loving(model, n: int):
    """`model` with +30 on the logits of every head row past the tokenizer (ids >= n): unmasked, they win."""
    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[n:] = 30.0
    model.lm_head = biased
    return model


@pytest.mark.parametrize("engine", ["lean", "hf"])
def test_padding_rows_are_never_sampled(zoo, engine):
    tok = load_tokenizer(zoo.student("qwen3"))
    model = _padding_loving(load_model(zoo.student("qwen3")), len(tok))
    assert model.config.vocab_size > len(tok)
    task = get_task("jsonl", **zoo.jsonl_options())
    ids = [render_prompt_ids(tok, ex.prompt, None, RenderSpec("system")) for ex in task.examples("test", 4, 0)]
    st = SamplingSettings.for_model(tok, model, max_new_tokens=8, engine=engine)
    assert st.vocab == len(tok)
    for settings in (st, st.replace(greedy=True)):
        drawn = [t for r in sample(model, ids, settings, [1, 2, 3, 4]).responses for t in r]
        assert drawn and max(drawn) < len(tok)
    unmasked = sample(model, ids, st.replace(vocab=None), [1, 2, 3, 4]).responses  # the test can fail
    assert max(t for r in unmasked for t in r) >= len(tok)


def test_scorer_refuses_target_ids_outside_the_vocabulary(zoo):
    tok = load_tokenizer(zoo.student("qwen3"))
    model = load_model(zoo.student("qwen3"))
    ex = get_task("jsonl", **zoo.jsonl_options()).examples("test", 2, 0)
    ok = build_two_view_batch(tok, [e.prompt for e in ex], [e.context for e in ex], [[5, 6], [7]], RenderSpec("system"))
    score_views(model, ok, ("x",), temperature=1.0, vocab=len(tok), grad=False)
    bad = build_two_view_batch(
        tok, [e.prompt for e in ex], [e.context for e in ex], [[5, len(tok)], [7]], RenderSpec("system")
    )
    with pytest.raises(ValueError, match=f"response id {len(tok)} is outside the scored vocabulary"):
        score_views(model, bad, ("x",), temperature=1.0, vocab=len(tok), grad=False)
    big = model.config.vocab_size  # past the head itself (what crashed a smaller teacher's embedding)
    worse = build_two_view_batch(
        tok, [e.prompt for e in ex], [e.context for e in ex], [[5, big], [7]], RenderSpec("system")
    )
    with pytest.raises(ValueError, match="outside the scored vocabulary"):
        score_views(model, worse, ("c",), temperature=1.0, grad=False)


def test_student_head_larger_than_the_teacher_trains_on_the_common_ids(zoo, tmp_path, monkeypatch):
    """Student = the zoo's teacher (head padded to a multiple of 64, +64), teacher = the zoo's student (+8): the
    rollout draws only ids both heads and the tokenizer know, the run completes, its losses are finite."""
    import mechopd.train.trainer as T
    from mechopd.config import TrainConfig

    big, small = zoo.teacher("qwen3"), zoo.student("qwen3")
    tok = load_tokenizer(big)
    heads = [json.loads((p / "config.json").read_text())["vocab_size"] for p in (big, small)]
    assert heads[0] > heads[1] > len(tok)
    drawn: list[int] = []
    real = T.sample_rows
    monkeypatch.setattr(T, "sample_rows", lambda *a, **k: [drawn.extend(r) or r for r in real(*a, **k)])
    cfg = TrainConfig(
        task="jsonl",
        task_options=zoo.jsonl_options(max_new_tokens=8),
        student=str(big),
        teacher=str(small),
        method="nca",
        batch_size=4,
        steps=2,
        lr=1e-3,
        pool_size=8,
        temperature=2.0,
    )
    tr = T.Trainer(cfg, tmp_path / "run", progress=False)
    assert tr.vocab == known_vocab(tok) == len(tok) and tr.sampling.vocab == tr.vocab
    tr.run()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert len(drawn) > 20 and max(drawn) < len(tok)
