"""Per-term gradient statistics of the loop (`train.gradstats`) against a slow reference on a tiny model."""

from __future__ import annotations

import math
import re

import numpy as np
import torch

from mechopd.train import gradstats


def _terms(model, seed=0):
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(seed))
    logits = model(input_ids=ids).logits
    return {
        "opd": 0.7 * logits.pow(2).mean(),
        "nca": 0.3 * logits[..., :5].logsumexp(-1).mean(),
        "sym": logits[:, -1].tanh().sum(),
    }


def _reference(model, seed):
    """Every term's gradient by its own forward + backward, the statistics by explicit loops in float64."""
    named = list(model.named_parameters())
    grads = {}
    for t in ("opd", "nca", "sym"):
        model.zero_grad(set_to_none=True)
        _terms(model, seed)[t].backward()
        grads[t] = [np.zeros(p.numel()) if p.grad is None else p.grad.double().reshape(-1).numpy() for _, p in named]
    ref = {}
    flat = {t: np.concatenate(g) for t, g in grads.items()}
    for t in flat:
        ref[f"grad/norm/{t}"] = math.sqrt(sum(float(x) ** 2 for x in flat[t]))
    pairs = [("opd", "nca"), ("opd", "sym"), ("nca", "sym")]
    for a, b in pairs:
        ref[f"grad/cos/{a}__{b}"] = float(flat[a] @ flat[b] / np.linalg.norm(flat[a]) / np.linalg.norm(flat[b]))
        groups = {}
        for k, (name, _) in enumerate(named):
            m = re.search(r"layers\.(\d+)\.", name)
            module = [p for p in name.split(".") if p not in ("weight", "bias")][-1]
            groups.setdefault(f"{m.group(1) if m else 'none'}.{module}", []).append(k)
        for g, idx in groups.items():
            ga = np.concatenate([grads[a][k] for k in idx])
            gb = np.concatenate([grads[b][k] for k in idx])
            na, nb = np.linalg.norm(ga), np.linalg.norm(gb)
            ref[f"grad/cos_group/{a}__{b}/{g}"] = float(ga @ gb / (na * nb)) if na > 0 and nb > 0 else None
    mags = np.stack([np.abs(flat[t]) for t in ("opd", "nca", "sym")])
    counted = mags.max(0) > 0
    winner = np.array([int(np.argmax(col)) for col in mags[:, counted].T])
    for i, t in enumerate(("opd", "nca", "sym")):
        ref[f"grad/dominance/{t}"] = float((winner == i).mean())
    return ref


def test_grad_stats_match_a_slow_reference(tiny_qwen3):
    model = tiny_qwen3
    names, params = zip(*model.named_parameters())
    grads = gradstats.term_grads(_terms(model, seed=4), list(params))
    got = gradstats.grad_stats(grads, list(names))
    ref = _reference(model, seed=4)
    assert set(got) == set(ref)
    assert "grad/cos_group/opd__nca/0.q_proj" in got and "grad/cos_group/opd__nca/none.embed_tokens" in got
    for k, v in ref.items():
        if v is None:
            assert got[k] is None, k
        else:
            assert math.isclose(got[k], v, rel_tol=1e-4, abs_tol=1e-6), (k, got[k], v)
    assert math.isclose(sum(got[f"grad/dominance/{t}"] for t in ("opd", "nca", "sym")), 1.0)
    model.zero_grad(set_to_none=True)


def test_summed_term_gradients_equal_one_backward_of_the_total(tiny_qwen3):
    model = tiny_qwen3
    params = list(model.parameters())
    model.zero_grad(set_to_none=True)
    sum(_terms(model, seed=5).values()).backward()
    expected = [p.grad.clone() for p in params]
    gradstats.set_summed_grads(params, gradstats.term_grads(_terms(model, seed=5), params))
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.grad, e, atol=1e-5, rtol=1e-4)
    norms = gradstats.term_norms(_terms(model, seed=5), params)
    assert set(norms) == {"opd", "nca", "sym"} and all(v > 0 for v in norms.values())
    model.zero_grad(set_to_none=True)
