"""`objectives.head`: the fused OPD / NCA loss head equals the plain reference (scorer log-softmax, the registered
divergences, token mean, autograd) in loss and in every gradient, for any chunk size, temperature and vocabulary cut."""

from __future__ import annotations

import pytest
import torch

from mechopd.generate.scorer import to_logp
from mechopd.objectives.divergences import nca_anchor, reverse_kl_full
from mechopd.objectives.head import chunk_full, fused_head_loss

N, D, V, PAD = 13, 8, 97, 5


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hx, hc, ht = (torch.randn(N, D, generator=g) for _ in range(3))
    w = (torch.randn(V + PAD, D, generator=g) * 0.7).requires_grad_()  # padding rows past the common vocabulary
    wt = torch.randn(V + 2 * PAD, D, generator=g) * 0.7
    mask = torch.rand(N, generator=g) > 0.3
    return hx.requires_grad_(), hc.requires_grad_(), ht, w, wt, mask


def _reference(hx, hc, ht, w, wt, mask, T, beta):
    lq = to_logp((hx @ w.T)[None], T, V)  # [1, N, V]
    lf = to_logp((ht @ wt.T)[None], T, V)
    per = reverse_kl_full(lq, lf)[0]
    if hc is not None:
        per = per + beta * nca_anchor(lq, to_logp((hc @ w.T)[None], T, V))[0]
    return (per * mask).sum() / mask.sum()


@pytest.mark.parametrize("three", [False, True], ids=["opd", "nca"])
@pytest.mark.parametrize("T, chunk", [(1.0, 1024), (0.7, 4), (1.3, 1)])
def test_fused_head_equals_the_reference_loss_and_gradients(three, T, chunk):
    hx, hc, ht, w, wt, mask = _inputs()
    beta = 0.5
    ref = _reference(hx, hc if three else None, ht, w, wt, mask, T, beta)
    ref.backward()
    want = {"hx": hx.grad.clone(), "w": w.grad.clone(), "hc": hc.grad.clone() if three else None}
    hx.grad = w.grad = hc.grad = None
    weights = mask.float() / mask.sum()
    loss, opd, nca = fused_head_loss(hx, w[:V], ht, wt[:V], weights, temperature=T, hc=hc if three else None,
                                     beta=beta, chunk=chunk)
    (2.0 * loss).backward()  # the incoming gradient scales every result
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(loss, opd + beta * nca, rtol=1e-6, atol=1e-7)
    assert (float(nca) > 0) == three
    torch.testing.assert_close(hx.grad, 2 * want["hx"], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.grad[:V], 2 * want["w"][:V], rtol=1e-4, atol=1e-6)
    assert float(w.grad[V:].abs().max()) == 0  # padding rows carry no mass, hence no gradient
    if three:
        torch.testing.assert_close(hc.grad, 2 * want["hc"], rtol=1e-4, atol=1e-6)
    else:
        assert hc.grad is None


def test_the_inner_chunk_is_replaceable():
    """A kernel with `chunk_full`'s signature replaces it (the interface a Triton kernel takes)."""
    hx, hc, ht, w, wt, mask = _inputs(1)
    calls = []

    def kernel(*args):
        calls.append(args[0].shape[0])
        return chunk_full(*args)

    w_ = w.detach()[:V]
    a = fused_head_loss(hx, w_, ht, wt[:V], mask.float(), hc=hc, beta=0.5, chunk=5, kernel=kernel)[0]
    b = fused_head_loss(hx, w_, ht, wt[:V], mask.float(), hc=hc, beta=0.5, chunk=5)[0]
    assert calls == [5, 5, 3] and torch.equal(a, b)
