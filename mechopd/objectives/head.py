"""A loss head at the matmul floor: the OPD (two-view) and NCA (three-view) losses from hidden states and LM heads,
chunk by chunk of positions, the gradient computed in the same pass (`FusedHeadLoss`, a custom autograd function).

Per position t (weights m_t = mask_t / global token count, per term: `train.headstep`), logits z / T (docs/method.md
§1-2), the OPD term in each estimator of `objectives.divergences` (the logits path's functions, matched exactly):

    q_x = softmax(h_x W^T / T)   student, no context          f = softmax(h_t W_T^T / T)   teacher, context
    q_c = softmax(h_c W^T / T)   student, context (NCA only)
    L   = Σ_t m_t L_OPD,t + β Σ_t m'_t KL(sg[q_x,t] ‖ q_c,t)
    full:     L_OPD = KL(q_x ‖ f)                          ∂/∂z_x = q ⊙ (a − KL) / T,   a = log q_x − log f
    topk:     L_OPD = Σ_{S} q (a) (S = TopK(q_x, k))       ∂/∂z_x = [1_S q (a + 1) − q (L_OPD + Σ_S q)] / T
      + tail: + m_q (log m_q − log m_f), m = mass off S    + (b + 1) q (1_{∉S} − m_q) / T,   b = log m_q − log m_f
      renormalize: KL(q̄ ‖ f̄) on S                         ∂/∂z_x = 1_S q̄ (ā − L_OPD) / T
    sampled:  L_OPD = r · log q_x(y),  r = sg[log q_x(y) − log f(y)]     ∂/∂z_x = r (e_y − q) / T
    forward_full: L_OPD = KL(f ‖ q_x) (the ablation)      ∂/∂z_x = (q − f) / T
    NCA:      ∂/∂z_c = β m' (q_c − q_x) / T  (forward KL to the stop-gradient anchor; no gradient into q_x)
    ∂L/∂h_x = ∂L/∂z_x · W,   ∂L/∂h_c = ∂L/∂z_c · W,   ∂L/∂W = ∂L/∂z_x^T h_x + ∂L/∂z_c^T h_c

What is non-standard: the forward computes those gradients chunk by chunk and keeps only ``[N, d]`` and ``[V, d]``
results for backward (no ``[chunk, V]`` tensor outlives its chunk; autograd never sees the logits), so its cost is the
three matmuls of a bare LM-head forward + backward, plus the teacher's head matmul and a few elementwise passes over
``[chunk, V]`` (at most five ``[chunk, V]`` buffers at once, NCA; top-k adds ``[chunk, V]`` scratch for its tail).
Float64 inputs compute in float64, everything else in float32 (a bfloat16 head is upcast per call). The inner chunk is
one function with a fixed signature (`chunk_kernel`): a GPU kernel (Triton) can replace it behind
`fused_head_loss(..., kernel=...)`. The trainer calls this head through `train.headstep` (``loss_head``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from mechopd.objectives.losses import TermOptions


class ChunkOut(NamedTuple):
    """One chunk's results: gz / gzc ``[c, V]`` the logit gradients (already × weights / T; gzc None without h_c or at
    β = 0); per position ``[c]``: opd (the estimator's L_OPD value), nca (KL(q_x ‖ q_c), zeros without h_c), kl (the
    logged KL(q_x ‖ f): exact, or r for "sampled"), stat (top-k: the student's top-k mass; sampled: r; full: 0)."""

    gz: Tensor
    gzc: Tensor | None
    opd: Tensor
    nca: Tensor
    kl: Tensor
    stat: Tensor


# (hx, hc | None, ht, w, wt [V, d], tokens [c], m_opd [c], m_nca [c], T, beta, estimator options) -> ChunkOut
ChunkKernel = Callable[
    [Tensor, Tensor | None, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, float, float, TermOptions], ChunkOut
]


def _logp_(z: Tensor, T: float) -> Tensor:
    """In place: z ← log_softmax(z / T) ``[c, V]``."""
    if T != 1:
        z.div_(T)
    return z.sub_(torch.logsumexp(z, -1, keepdim=True))


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """``[c, V] x [c, V] -> [c]`` Σ_v a b per row, summed pairwise (a BLAS dot over V = 151936 float32 terms drifts by
    ~1e-4 relative, which the gradient's ``− KL`` term inherits); its ``[c, V]`` product lives for the call only."""
    return (a * b).sum(-1)


def _topk_parts(lq: Tensor, lf: Tensor, o: TermOptions) -> tuple[Tensor, ...]:
    """What top-k L_OPD reads of log q_x and log f (`divergences.reverse_kl_topk`): S's ids ``[c, k]``, log q_x and
    log f on S, and with a tail the log masses off S (log-sum-exp over the complement: no ``1 − Σ`` cancellation)."""
    V = lq.shape[-1]
    ids = lq.topk(min(o.topk, V), dim=-1).indices  # [c, k]
    ls, lt = lq.gather(-1, ids), lf.gather(-1, ids)
    if not (o.tail and not o.renormalize and o.topk < V):
        return ids, ls, lt
    return (
        ids,
        ls,
        lt,
        lq.scatter(-1, ids, float("-inf")).logsumexp(-1),
        lf.scatter(-1, ids, float("-inf")).logsumexp(-1),
    )


def _topk_grad(parts: tuple[Tensor, ...], d: Tensor, q: Tensor, o: TermOptions) -> tuple[Tensor, Tensor, Tensor]:
    """Top-k L_OPD: (∂/∂(z/T) written into d's buffer ``[c, V]``, value ``[c]``, the top-k mass ``[c]``)."""
    ids, ls, lt, *tail = parts
    mass = ls.logsumexp(-1).exp()  # Σ_S q_x, before any renormalisation
    if o.renormalize:
        ls, lt = ls - ls.logsumexp(-1, keepdim=True), lt - lt.logsumexp(-1, keepdim=True)
        qs = ls.exp()
        val = _rowdot(qs, ls - lt)
        return d.zero_().scatter_(-1, ids, qs * (ls - lt - val[:, None])), val, mass
    qs, a = ls.exp(), ls - lt
    val = _rowdot(qs, a)
    coef, gs = -(val + mass), qs * (a + 1)
    if tail:
        log_mq, log_mf = tail
        mq, b = log_mq.exp(), log_mq - log_mf
        val = val + mq * b
        coef, gs = coef + (b + 1) * (1 - mq), gs - (b + 1)[:, None] * qs
    return d.copy_(q).mul_(coef[:, None]).scatter_add_(-1, ids, gs), val, mass


def chunk_kernel(
    hx: Tensor,
    hc: Tensor | None,
    ht: Tensor,
    w: Tensor,
    wt: Tensor,
    y: Tensor,
    mo: Tensor,
    ma: Tensor,
    T: float,
    beta: float,
    o: TermOptions,
) -> ChunkOut:
    """One chunk of c positions (module docstring). hx, hc, ht: ``[c, d]``; w, wt: ``[V, d]`` (the common vocabulary);
    y ``[c]`` the sampled ids; mo / ma ``[c]`` the OPD / anchor weights."""
    three = hc is not None
    lq = _logp_(hx @ w.T, T)  # [c, V] log q_x
    lf = _logp_(ht @ wt.T, T)  # [c, V] log f
    if o.estimator == "sampled":
        lqy = lq.gather(-1, y[:, None])[:, 0]  # [c] log q_x(y)
        r = lqy - lf.gather(-1, y[:, None])[:, 0]  # [c] log q_x(y) − log f(y)
        q = lq.exp() if three else lq.exp_()
        g = lf.copy_(q).mul_(-r[:, None]).scatter_add_(-1, y[:, None], r[:, None])  # r (e_y − q)
        opd, kl, stat = r * lqy, r, r
    elif o.estimator == "forward_full":
        f = lf.exp()  # [c, V] f
        d = lf.neg_().add_(lq)  # [c, V] log q_x − log f
        q = lq.exp() if three else lq.exp_()
        kl = _rowdot(q, d)  # [c] KL(q_x ‖ f), the logged KL
        opd, stat = -_rowdot(f, d), torch.zeros_like(kl)  # [c] KL(f ‖ q_x)
        g = f.neg_().add_(q)  # q − f
    else:
        parts = _topk_parts(lq, lf, o) if o.estimator == "topk" else None
        d = lf.neg_().add_(lq)  # [c, V] log q_x − log f
        q = lq.exp() if three else lq.exp_()  # log q_x kept only for the NCA term
        kl = _rowdot(q, d)  # [c] KL(q_x ‖ f), exact
        if parts is not None:
            g, opd, stat = _topk_grad(parts, d, q, o)
        else:
            g, opd, stat = d.sub_(kl[:, None]).mul_(q), kl, torch.zeros_like(kl)
    g.mul_((mo / T)[:, None])  # ∂L/∂z_x
    if hc is None:  # not three
        return ChunkOut(g, None, opd, torch.zeros_like(opd), kl, stat)
    lqc = _logp_(hc @ w.T, T)  # [c, V] log q_c
    nca = _rowdot(q, lq) - _rowdot(q, lqc)  # [c] KL(q_x ‖ q_c)
    gc = lqc.exp_().sub_(q).mul_((beta * ma / T)[:, None]) if beta != 0 else None  # ∂L/∂z_c
    return ChunkOut(g, gc, opd, nca, kl, stat)


class HeadLoss(NamedTuple):
    """loss = Σ m·L_OPD + β Σ m'·KL(q_x ‖ q_c) (differentiable); the rest detached: opd = Σ m·L_OPD, nca = Σ m'·KL,
    kl = Σ m_s·(logged KL), stat = Σ m_s·(top-k mass | r | 0) (m_s: the stats weights, `fused_head_loss`)."""

    loss: Tensor
    opd: Tensor
    nca: Tensor
    kl: Tensor
    stat: Tensor


class FusedHeadLoss(torch.autograd.Function):
    """``loss, opd, nca, kl, stat = FusedHeadLoss.apply(hx, hc, ht, w, wt, y, mo, ma, ms, T, beta, chunk, kernel, o)``
    (`fused_head_loss` names the arguments). Gradients flow to hx, hc and w; ht, wt are targets; only ``loss`` is
    differentiable."""

    @staticmethod
    def forward(ctx, hx, hc, ht, w, wt, y, mo, ma, ms, T, beta, chunk, kernel, o):  # noqa: D102
        f = torch.float64 if torch.float64 in (hx.dtype, w.dtype) else torch.float32
        n, grad_w = hx.shape[0], w.requires_grad
        g_hx = hx.new_zeros(hx.shape, dtype=f)
        g_hc = None if hc is None else hc.new_zeros(hc.shape, dtype=f)
        g_w = w.new_zeros(w.shape, dtype=f) if grad_w else None
        sums = hx.new_zeros(4, dtype=f)  # Σ mo·opd, Σ ma·nca, Σ ms·kl, Σ ms·stat
        wf, wtf = w.detach().to(f), wt.detach().to(f)
        for i in range(0, n, chunk):
            s = slice(i, min(i + chunk, n))
            x = hx[s].detach().to(f)
            c = None if hc is None else hc[s].detach().to(f)
            mo_, ma_, ms_ = mo[s].to(f), ma[s].to(f), ms[s].to(f)
            out = kernel(x, c, ht[s].detach().to(f), wf, wtf, y[s], mo_, ma_, T, beta, o)
            torch.mm(out.gz, wf, out=g_hx[s])
            if grad_w:
                g_w.addmm_(out.gz.T, x)
            if out.gzc is not None:
                torch.mm(out.gzc, wf, out=g_hc[s])
                if grad_w:
                    g_w.addmm_(out.gzc.T, c)
            sums += torch.stack(
                [(mo_ * out.opd).sum(), (ma_ * out.nca).sum(), (ms_ * out.kl).sum(), (ms_ * out.stat).sum()]
            )
            del out
        ctx.save_for_backward(g_hx, *(() if g_hc is None else (g_hc,)), *(() if g_w is None else (g_w,)))
        ctx.has_c, ctx.grad_w, ctx.dtypes = g_hc is not None, grad_w, (hx.dtype, w.dtype)
        opd, nca, kl, stat = (t.clone() for t in sums.unbind())
        ctx.mark_non_differentiable(opd, nca, kl, stat)
        return opd + beta * nca, opd, nca, kl, stat

    @staticmethod
    def backward(ctx, grad, *_):  # noqa: D102
        saved, (dx, dw) = list(ctx.saved_tensors), ctx.dtypes
        g_hx = (saved.pop(0) * grad).to(dx)
        g_hc = (saved.pop(0) * grad).to(dx) if ctx.has_c else None
        g_w = (saved.pop(0) * grad).to(dw) if ctx.grad_w else None
        return g_hx, g_hc, None, g_w, *([None] * 10)


def fused_head_loss(
    hx: Tensor,
    w: Tensor,
    ht: Tensor,
    wt: Tensor,
    weights: Tensor,
    *,
    temperature: float = 1.0,
    hc: Tensor | None = None,
    beta: float = 0.0,
    chunk: int = 1024,
    options: TermOptions | None = None,
    tokens: Tensor | None = None,
    anchor_weights: Tensor | None = None,
    stats_weights: Tensor | None = None,
    kernel: ChunkKernel = chunk_kernel,
) -> HeadLoss:
    """OPD (``hc`` None) or NCA (``hc`` given, weight ``beta``) loss from hidden states ``[N, d]`` and heads ``[V, d]``
    (module docstring), L_OPD in ``options``' estimator (None: "full"; ``tokens`` ``[N]``: the sampled ids, needed by "sampled").
    weights ``[N]``: the OPD term's (mask / token count); anchor_weights: the NCA term's, stats_weights: the logged
    KL's and the estimator statistic's (both default to ``weights``). Backward fills hx, hc and w."""
    n, options = hx.shape[0], options or TermOptions("full")
    if not (
        ht.shape[0] == n
        and weights.shape == (n,)
        and w.shape[0] == wt.shape[0]
        and (hc is None or hc.shape == hx.shape)
    ):
        raise ValueError(
            f"fused_head_loss: shapes hx {tuple(hx.shape)}, ht {tuple(ht.shape)}, weights "
            f"{tuple(weights.shape)}, w {tuple(w.shape)}, wt {tuple(wt.shape)} do not line up"
        )
    if tokens is None:
        if options.estimator == "sampled":
            raise ValueError("fused_head_loss: the sampled estimator needs tokens (the sampled ids, [N])")
        tokens = torch.zeros(n, dtype=torch.long, device=hx.device)
    ma = weights if anchor_weights is None else anchor_weights
    ms = weights if stats_weights is None else stats_weights
    return HeadLoss(
        *FusedHeadLoss.apply(
            hx,
            hc,
            ht,
            w,
            wt,
            tokens.long(),
            weights,
            ma,
            ms,
            float(temperature),
            float(beta),
            int(chunk),
            kernel,
            options,
        )
    )
