"""Alignment is exact under byte-level BPE: mechopd concatenates token ids, it never re-tokenises text.

(a) the response ids scored in both views are exactly the ids the student sampled (the trainer, the probes);
(b) with a tokenizer BUILT so that merges span the prompt/response boundary, re-tokenising prompt + response text would
    shift the response; mechopd's batch holds the sampled ids and scores them like an unpadded forward of
    prompt ids + response ids;
(c) the hidden state compared at response token t is the state of the same token in both views.
"""

from __future__ import annotations

import pytest
import torch

from mechopd.core.views import RenderSpec, build_two_view_batch, render_prompt_ids
from mechopd.generate.sampler import sample
from mechopd.generate.scorer import response_logits
from mechopd.generate.settings import SamplingSettings
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks.base import get_task
from mechopd.testing.zoo import FAMILY, tiny_model, train_bpe, wrap_tokenizer

from .helpers import FAMILIES, NO_CONTEXT_SYSTEM, TEMPLATE_KWARGS

ANSWER = "<answer>B</answer>"


@pytest.fixture(scope="module")
def boundary_checkpoint(tmp_path_factory):
    """A Qwen3 checkpoint whose BPE has merges across the generation prompt / response boundary."""
    fam = FAMILY["qwen3"]
    texts = [f"assistant\n{ANSWER}"] * 200 + ["Which drug is first-line?", "Formulary rule one.", "user", "system"]
    tok = wrap_tokenizer(train_bpe(texts, list(fam.specials), vocab_size=400, use_regex=False), fam)
    out = tmp_path_factory.mktemp("boundary") / "ckpt"
    model = tiny_model(fam, tok, len(tok) + 8, seed=3)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _spec(family: str) -> RenderSpec:
    return RenderSpec("system", NO_CONTEXT_SYSTEM[family], dict(TEMPLATE_KWARGS[family]))


def test_the_built_tokenizer_merges_across_the_boundary(boundary_checkpoint):
    tok = load_tokenizer(boundary_checkpoint)
    prompt = render_prompt_ids(tok, "Which drug is first-line?", None, RenderSpec())
    text = tok.decode(prompt)
    resp = tok(ANSWER, add_special_tokens=False)["input_ids"]
    joint = tok(text + ANSWER, add_special_tokens=False)["input_ids"]
    assert joint[: len(prompt)] != prompt  # a merge swallowed the prompt's last characters ...
    assert len(joint) < len(prompt) + len(resp)  # ... so re-tokenising text would shift the response


def test_boundary_merges_cannot_shift_the_response(boundary_checkpoint):
    tok, model = load_tokenizer(boundary_checkpoint), load_model(boundary_checkpoint)
    prompts, contexts = ["Which drug is first-line?", "Formulary rule one."], ["Formulary rule one.", "system"]
    responses = [
        tok(ANSWER, add_special_tokens=False)["input_ids"],
        tok("B</answer>", add_special_tokens=False)["input_ids"],
    ]
    spec = RenderSpec()
    batch = build_two_view_batch(tok, prompts, contexts, responses, spec)
    for i, r in enumerate(responses):
        assert batch.response_ids[i, : len(r)].tolist() == r
        for which, ctx in (("x", None), ("c", contexts[i])):
            ids = getattr(batch, f"input_ids_{which}")
            cols = getattr(batch, f"cols_{which}")
            assert ids[i, cols[i, : len(r)]].tolist() == r
            # the scored logits equal an unpadded forward of (prompt ids + response ids): concatenation, not text
            direct = torch.tensor([render_prompt_ids(tok, prompts[i], ctx, spec) + r])
            with torch.no_grad():
                ref = model(direct).logits[0, -len(r) - 1 : -1]
                got = response_logits(model, batch, which)[i, : len(r)]
            assert torch.allclose(got, ref, atol=1e-4)


def test_the_trainer_never_retokenises_responses(boundary_checkpoint, zoo, tmp_path, monkeypatch):
    """(a) in the trainer: the batch it scores holds exactly the sampled ids, in both views; the only texts it
    tokenises are rendered prompts (never prompt + response)."""
    import mechopd.train.trainer as tr
    from mechopd.config import TrainConfig

    sampled, scored, texts = [], [], []
    real_sample, real_assemble = tr.sample_rows, tr.assemble_two_views
    monkeypatch.setattr(tr, "sample_rows", lambda *a, **k: sampled.append(real_sample(*a, **k)) or sampled[-1])
    monkeypatch.setattr(tr, "assemble_two_views", lambda *a, **k: scored.append(real_assemble(*a, **k)) or scored[-1])
    cfg = TrainConfig(
        task="jsonl",
        task_options=zoo.jsonl_options(max_new_tokens=6),
        student=str(boundary_checkpoint),
        method="nca",
        batch_size=3,
        steps=1,
        lr=1e-3,
        pool_size=6,
    )
    tok_type = type(load_tokenizer(boundary_checkpoint))
    real_call = tok_type.__call__
    monkeypatch.setattr(
        tok_type,
        "__call__",
        lambda self, text, *a, **k: (
            texts.extend([text] if isinstance(text, str) else text) or real_call(self, text, *a, **k)
        ),
    )
    trainer = tr.Trainer(cfg, tmp_path / "run", progress=False)  # renders the pool's prompts once (`prerender`)
    at_setup = len(texts)
    trainer.train_step()
    assert len(texts) == at_setup  # the step reads the prompts rendered at setup: it tokenises nothing
    batch, responses = scored[0], sampled[0]
    assert len(responses) == 3 and any(responses)
    for i, r in enumerate(responses):
        assert batch.response_ids[i, : len(r)].tolist() == list(r)
        assert batch.input_ids_x[i, batch.cols_x[i, : len(r)]].tolist() == list(r)
        assert batch.input_ids_c[i, batch.cols_c[i, : len(r)]].tolist() == list(r)
        assert int(batch.response_mask[i].sum()) == len(r)
    assert texts and all(t.endswith("<|im_start|>assistant\n") for t in texts)  # prompts only


@pytest.mark.parametrize("family", FAMILIES)
def test_probe_batches_hold_the_sampled_ids_and_compare_the_same_token(zoo, family):
    """(a) for the probes' sampled responses and (c) the states compared at index t belong to the same token: the
    ids the model receives at the compared columns are the response ids, and the captured embedding-site state at
    index t is the embedding of response token t, in both views."""
    from mechopd.probes.capture import capture_views
    from mechopd.probes.items import make_batches

    path = zoo.student(family)
    tok, model = load_tokenizer(path), load_model(path)
    task = get_task("jsonl", **zoo.jsonl_options(max_new_tokens=6))
    examples = task.examples("test", 3, 0)
    spec = _spec(family)
    prompt_ids = [render_prompt_ids(tok, ex.prompt, None, spec) for ex in examples]
    gen = sample(model, prompt_ids, SamplingSettings.for_model(tok, model, max_new_tokens=6, greedy=True))
    items = make_batches(tok, task, 3, 0, 3, model, spec, greedy=True)
    assert items.responses == gen.responses  # the probe scores exactly what the student sampled
    batch = next(iter(items))
    seen = []
    handle = model.get_input_embeddings().register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
    try:
        states = capture_views(model, batch, ["embed"], shared_prefix="off")
    finally:
        handle.remove()
    assert len(seen) == 2  # one forward per view
    shared = capture_views(model, batch, ["embed"])  # the shared-prefix path captures the same states
    for which in ("x", "c"):
        torch.testing.assert_close(shared[which]["embed"], states[which]["embed"], atol=1e-6, rtol=0)
    emb = model.get_input_embeddings()(batch.response_ids)
    m = batch.response_mask
    for which, ids in zip(("x", "c"), seen):
        at_cols = batch.response_hidden(ids.unsqueeze(-1), which).squeeze(-1)
        assert torch.equal(at_cols[m], batch.response_ids[m])
        assert torch.allclose(states[which]["embed"][m], emb[m], atol=1e-6)
