"""`objectives.head`: the fused OPD / NCA loss head equals the plain reference (scorer log-softmax, the registered
divergences, token mean, autograd) in loss and in every gradient, for any chunk size, temperature and vocabulary cut."""

from __future__ import annotations

import pytest
import torch

from mechopd.generate.scorer import to_logp
from mechopd.objectives.divergences import nca_anchor, reverse_kl_full
from mechopd.objectives.head import chunk_kernel, fused_head_loss

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
    loss, opd, nca, *_ = fused_head_loss(
        hx, w[:V], ht, wt[:V], weights, temperature=T, hc=hc if three else None, beta=beta, chunk=chunk
    )
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
    """A kernel with `chunk_kernel`'s signature replaces it (the interface a Triton kernel takes)."""
    hx, hc, ht, w, wt, mask = _inputs(1)
    calls = []

    def kernel(*args):
        calls.append(args[0].shape[0])
        return chunk_kernel(*args)

    w_ = w.detach()[:V]
    a = fused_head_loss(hx, w_, ht, wt[:V], mask.float(), hc=hc, beta=0.5, chunk=5, kernel=kernel)[0]
    b = fused_head_loss(hx, w_, ht, wt[:V], mask.float(), hc=hc, beta=0.5, chunk=5)[0]
    assert calls == [5, 5, 3] and torch.equal(a, b)


# --- every estimator against the logits path (`losses.method_terms` + `total_loss`), float64 -----------------------

ESTIMATOR_CASES = {  # name: TermOptions fields
    "full": dict(estimator="full"),
    "topk": dict(estimator="topk", topk=7),
    "topk-tail": dict(estimator="topk", topk=7, tail=True),
    "topk-renorm": dict(estimator="topk", topk=7, renormalize=True),
    "topk-k>=V": dict(estimator="topk", topk=V + 3, tail=True),
    "sampled": dict(estimator="sampled"),
    "forward_full": dict(estimator="forward_full"),  # the ablation KL(f ‖ q_x); its logged KL stays KL(q_x ‖ f)
}


def _logits_path(method, opts, hx, hc, ht, w, wt, mask, keep, y, T, beta, selected):
    """The trainer's logits path on [1, N, V]: log-softmax (as `scorer.to_logp`, in float64), the registered terms,
    `total_loss`."""
    from mechopd.objectives.losses import LossInputs, method_terms, total_loss

    terms = method_terms(method, beta, nca_positions="selected" if selected else "all", **opts)
    lq, lc, lf = _lp64(hx @ w.T, T), _lp64(hc @ w.T, T) if method == "nca" else None, _lp64(ht @ wt.T, T)
    inputs = LossInputs(student_nctx=lq, student_ctx=lc, teacher=lf, tokens=y[None]).with_tokens()
    return total_loss(terms, inputs, mask[None], None if keep is None else keep[None])


def _lp64(z, T):
    return torch.log_softmax(z[None, :, :V] / T, -1)  # [1, N, V], float64 (`scorer.to_logp` casts to float32)


@pytest.mark.parametrize("method", ["opd", "nca"])
@pytest.mark.parametrize("case", sorted(ESTIMATOR_CASES))
@pytest.mark.parametrize("T, chunk, selected", [(1.0, 1024, False), (0.7, 4, True), (1.3, 1, False)])
def test_every_estimator_equals_the_logits_path(method, case, T, chunk, selected):
    from mechopd.objectives.losses import TermOptions

    hx, hc, ht, w, wt, mask = _inputs(2)
    hx, hc, ht, wt = (t.detach().double() for t in (hx, hc, ht, wt))
    w = w.detach().double().requires_grad_()
    hx.requires_grad_(), hc.requires_grad_()
    g = torch.Generator().manual_seed(5)
    keep = mask & (torch.rand(N, generator=g) > 0.4)
    keep[mask.nonzero()[0]] = True  # at least one kept token
    y = torch.randint(0, V, (N,), generator=g)
    opts, beta = ESTIMATOR_CASES[case], 0.6
    three = method == "nca"
    ref = _logits_path(method, opts, hx, hc, ht, w, wt, mask, keep, y, T, beta, selected)
    ref.loss.backward()
    want = {"hx": hx.grad, "hc": hc.grad, "w": w.grad}
    hx.grad = hc.grad = w.grad = None
    den, den_k = mask.sum(), (mask & keep).sum()
    wo = (mask & keep).double() / den_k  # the OPD term is selectable: a keep-mask applies
    wa = wo if selected else mask.double() / den
    out = fused_head_loss(
        hx,
        w[:V],
        ht,
        wt[:V],
        wo,
        temperature=T,
        hc=hc if three else None,
        beta=beta,
        chunk=chunk,
        options=TermOptions(**opts),
        tokens=y,
        anchor_weights=wa,
        stats_weights=mask.double() / den,
    )
    out.loss.backward()
    close = dict(rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out.loss, ref.loss.detach(), **close)
    torch.testing.assert_close(out.opd, ref.logs["loss/opd"], **close)
    if three:
        torch.testing.assert_close(out.nca, ref.logs["loss/nca"], **close)
    stat = {"topk": "opd/topk_mass", "sampled": "opd/kl_estimate"}.get(opts["estimator"])
    if stat:
        torch.testing.assert_close(out.stat, ref.logs[stat], **close)
    lq, lf = _lp64(hx @ w.T, T), _lp64(ht @ wt.T, T)
    kl = (
        reverse_kl_full(lq, lf)[0]
        if opts["estimator"] != "sampled"
        else (lq[0].gather(-1, y[:, None]) - lf[0].gather(-1, y[:, None]))[:, 0]
    )
    torch.testing.assert_close(out.kl, (kl * mask).sum().detach() / den, **close)
    torch.testing.assert_close(hx.grad, want["hx"], **close)
    torch.testing.assert_close(w.grad[:V], want["w"][:V], **close)
    if three:
        torch.testing.assert_close(hc.grad, want["hc"], **close)


def test_sampled_needs_tokens_and_fused_refuses_other_terms():
    from mechopd.config import check_loss_head
    from mechopd.core.errors import ConfigError
    from mechopd.objectives.losses import TermOptions

    hx, _, ht, w, wt, mask = _inputs(3)
    with pytest.raises(ValueError, match="needs tokens"):
        fused_head_loss(hx, w[:V], ht, wt[:V], mask.float(), options=TermOptions("sampled"))
    for method, sharding in (("dual_opd", "none"), ("sym_kl", "none"), ("nca", "fsdp")):
        with pytest.raises(ConfigError, match="loss_head=fused"):
            check_loss_head("fused", method, sharding)
    check_loss_head("fused", "nca", "none")
    check_loss_head("auto", "sym_kl", "fsdp")  # auto picks the logits path there (train.headstep)
