"""A loss head at the matmul floor: the OPD (two-view) and NCA (three-view) losses from hidden states and LM heads,
chunk by chunk of positions, the gradient computed in the same pass (`FusedHeadLoss`, a custom autograd function).

Per position t (weight m_t = mask_t / global token count), logits z / T, full vocabulary (docs/method.md §1-2):

    q_x = softmax(h_x W^T / T)   student, no context          f = softmax(h_t W_T^T / T)   teacher, context
    q_c = softmax(h_c W^T / T)   student, context (NCA only)
    L   = Σ_t m_t [ KL(q_x,t ‖ f_t) + β · KL(sg[q_x,t] ‖ q_c,t) ]

and the gradients, analytic (the sampled response's ids play no part in the full estimator):

    ∂L/∂z_x = m/T · q_x ⊙ (log q_x − log f − KL(q_x ‖ f))      (reverse KL through q_x, no REINFORCE term)
    ∂L/∂z_c = m/T · β · (q_c − q_x)                             (forward KL to the stop-gradient anchor)
    ∂L/∂h_x = ∂L/∂z_x · W,   ∂L/∂h_c = ∂L/∂z_c · W,   ∂L/∂W = ∂L/∂z_x^T h_x + ∂L/∂z_c^T h_c

What is non-standard: the forward computes those gradients chunk by chunk and keeps only ``[N, d]`` and ``[V, d]``
results for backward (no ``[chunk, V]`` tensor outlives its chunk; autograd never sees the logits), so its cost is the
three matmuls of a bare LM-head forward + backward, plus the teacher's head matmul and a few elementwise passes over
``[chunk, V]`` (at most five ``[chunk, V]`` float32 buffers at once, NCA). The inner chunk is one function with a
fixed signature (`chunk_full`): a GPU kernel (Triton) can replace it behind `fused_head_loss(..., kernel=...)`.
Only the full-vocabulary estimator is implemented here; the trainer does not call this head yet (`train.step` scores
through `scorer.head_logits` + `losses.total_loss`).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

# (hx, hc | None, ht, w, wt, weights [c], T, beta) -> (grad z_x [c, V], grad z_c [c, V] | None, opd [c], nca [c])
ChunkKernel = Callable[[Tensor, Tensor | None, Tensor, Tensor, Tensor, Tensor, float, float],
                       tuple[Tensor, Tensor | None, Tensor, Tensor]]


def _logp_(z: Tensor, T: float) -> Tensor:
    """In place: z ← log_softmax(z / T) ``[c, V]`` (float32)."""
    if T != 1:
        z.div_(T)
    return z.sub_(torch.logsumexp(z, -1, keepdim=True))


def chunk_full(hx: Tensor, hc: Tensor | None, ht: Tensor, w: Tensor, wt: Tensor, m: Tensor, T: float,
               beta: float) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
    """One chunk of c positions (module docstring): the logit gradients (already × m_t) and the per-position losses.

    hx, hc, ht: ``[c, d]``; w, wt: ``[V, d]`` (the common vocabulary); m: ``[c]`` weights."""
    lq = _logp_(hx @ w.T, T)  # [c, V] log q_x
    g = _logp_(ht @ wt.T, T).neg_().add_(lq)  # [c, V] log q_x − log f
    three = hc is not None and beta != 0
    q = lq.exp() if three else lq.exp_()  # [c, V] q_x (log q_x kept only for the NCA term)
    opd = _rowdot(q, g)  # [c] KL(q_x ‖ f)
    g.sub_(opd[:, None]).mul_(q).mul_((m / T)[:, None])  # ∂L/∂z_x
    if not three:
        return g, None, opd, torch.zeros_like(opd)
    lqc = _logp_(hc @ w.T, T)  # [c, V] log q_c
    nca = _rowdot(q, lq) - _rowdot(q, lqc)  # [c] KL(q_x ‖ q_c)
    gc = lqc.exp_().sub_(q).mul_((beta * m / T)[:, None])  # ∂L/∂z_c
    return g, gc, opd, nca


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """``[c, V] x [c, V] -> [c]`` Σ_v a b per row, summed pairwise (a BLAS dot over V = 151936 float32 terms drifts by
    ~1e-4 relative, which the gradient's ``− KL`` term inherits); its ``[c, V]`` product lives for the call only."""
    return (a * b).sum(-1)


class FusedHeadLoss(torch.autograd.Function):
    """``loss, opd_sum, nca_sum = FusedHeadLoss.apply(hx, hc, ht, w, wt, weights, T, beta, chunk, kernel)``.

    hx, hc (None: OPD), ht: ``[N, d]``; w (student head), wt (teacher head): ``[V, d]``, already cut to the common
    vocabulary; weights ``[N]`` (mask / global token count). Gradients flow to hx, hc and w; ht, wt are targets.
    ``opd_sum`` / ``nca_sum``: Σ m_t KL per term (not differentiable), for the logs."""

    @staticmethod
    def forward(ctx, hx, hc, ht, w, wt, weights, T, beta, chunk, kernel):  # noqa: D102
        n = hx.shape[0]
        g_hx = torch.zeros_like(hx, dtype=torch.float32)
        g_hc = None if hc is None else torch.zeros_like(hc, dtype=torch.float32)
        g_w = torch.zeros_like(w, dtype=torch.float32)
        opd_sum = hx.new_zeros((), dtype=torch.float32)
        nca_sum = opd_sum.clone()
        wf, wtf = w.detach().float(), wt.detach().float()
        for i in range(0, n, chunk):
            s = slice(i, min(i + chunk, n))
            x = hx[s].detach().float()
            c = None if hc is None else hc[s].detach().float()
            m = weights[s].float()
            gz, gzc, opd, nca = kernel(x, c, ht[s].detach().float(), wf, wtf, m, T, beta)
            torch.mm(gz, wf, out=g_hx[s])
            g_w.addmm_(gz.T, x)
            if gzc is not None:
                torch.mm(gzc, wf, out=g_hc[s])
                g_w.addmm_(gzc.T, c)
            opd_sum += (m * opd).sum()
            nca_sum += (m * nca).sum()
            del gz, gzc
        ctx.save_for_backward(g_hx, g_w, *(() if g_hc is None else (g_hc,)))
        ctx.has_c = g_hc is not None
        ctx.mark_non_differentiable(opd_sum, nca_sum)
        loss = opd_sum + beta * nca_sum
        return loss, opd_sum, nca_sum

    @staticmethod
    def backward(ctx, grad, _g_opd, _g_nca):  # noqa: D102
        g_hx, g_w, *rest = ctx.saved_tensors
        g_hc = (rest[0] * grad) if ctx.has_c else None
        return g_hx * grad, g_hc, None, g_w * grad, None, None, None, None, None, None


def fused_head_loss(hx: Tensor, w: Tensor, ht: Tensor, wt: Tensor, weights: Tensor, *, temperature: float = 1.0,
                    hc: Tensor | None = None, beta: float = 0.0, chunk: int = 1024,
                    kernel: ChunkKernel = chunk_full) -> tuple[Tensor, Tensor, Tensor]:
    """OPD (``hc`` None) or NCA (``hc`` given, weight ``beta``) loss from hidden states ``[N, d]`` and heads
    ``[V, d]`` (module docstring); returns (loss, Σ m·KL(q_x‖f), Σ m·KL(q_x‖q_c)); backward fills hx, hc, w."""
    if not (hx.shape == ht.shape[:1] + hx.shape[1:] and weights.shape == hx.shape[:1] and w.shape[0] == wt.shape[0]):
        raise ValueError(f"fused_head_loss: shapes hx {tuple(hx.shape)}, ht {tuple(ht.shape)}, weights "
                         f"{tuple(weights.shape)}, w {tuple(w.shape)}, wt {tuple(wt.shape)} do not line up")
    return FusedHeadLoss.apply(hx, hc, ht, w, wt, weights, float(temperature), float(beta), int(chunk), kernel)
