"""The lean decode loop is pinned to `generate` (greedy) and is batch-invariant with per-row seeds."""

from __future__ import annotations

import pytest
import torch

from mechopd.train.rollout import sample, stop_ids
from mechopd.views import RenderSpec, left_pad, render_prompt_ids
from tests.conftest import tiny_model

PROMPTS = ["apply the rule to : 3 1 4", "apply the rule to : 1 5 9 2 6", "apply the rule to : 7", "apply the rule to :"]


def _ids(tok):
    return [render_prompt_ids(tok, p, None, RenderSpec("system")) for p in PROMPTS]


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_greedy_matches_generate(organism_tokenizer, arch):
    tok = organism_tokenizer
    model = tiny_model(tok, arch, seed=3)
    ids = _ids(tok)
    stop = stop_ids(tok, model)
    ours = sample(model, ids, max_new_tokens=10, stop=stop, pad_id=tok.pad_token_id, greedy=True)
    x, m = left_pad(ids, tok.pad_token_id)
    ref = model.generate(input_ids=x, attention_mask=m, max_new_tokens=10, do_sample=False, eos_token_id=stop,
                         pad_token_id=tok.pad_token_id)[:, x.shape[1]:].tolist()
    for got, want in zip(ours.responses, ref):
        cut = next((i for i, t in enumerate(want) if t in stop), None)
        want = want[: cut + 1] if cut is not None else want
        assert got == want


def test_row_seeds_make_sampling_batch_invariant(organism_tokenizer, tiny_qwen3):
    tok = organism_tokenizer
    ids = _ids(tok)
    stop = stop_ids(tok, tiny_qwen3)
    kw = dict(max_new_tokens=12, stop=stop, pad_id=tok.pad_token_id, temperature=1.0)
    full = sample(tiny_qwen3, ids, row_seeds=[11, 12, 13, 14], **kw).responses
    halves = sample(tiny_qwen3, ids[:2], row_seeds=[11, 12], **kw).responses + \
        sample(tiny_qwen3, ids[2:], row_seeds=[13, 14], **kw).responses
    assert full == halves
    other = sample(tiny_qwen3, ids, row_seeds=[21, 22, 23, 24], **kw).responses
    assert other != full  # the seeds matter


def test_inverse_cdf_sampling_follows_the_distribution(organism_tokenizer, tiny_qwen3):
    """First-token frequencies over many seeds match softmax(logits / T) (chi-square-free tolerance check)."""
    tok = organism_tokenizer
    ids = [_ids(tok)[0]] * 2000
    stop = stop_ids(tok, tiny_qwen3)
    out = sample(tiny_qwen3, ids, max_new_tokens=1, stop=stop, pad_id=tok.pad_token_id, temperature=0.7,
                 row_seeds=list(range(2000))).responses
    first = torch.tensor([r[0] for r in out])
    with torch.no_grad():
        x, m = left_pad(ids[:1], tok.pad_token_id)
        p = torch.softmax(tiny_qwen3(input_ids=x, attention_mask=m).logits[0, -1] / 0.7, -1)
    freq = torch.bincount(first, minlength=p.numel()).float() / len(first)
    assert (freq - p).abs().max() < 0.015
