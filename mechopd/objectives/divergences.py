"""Per-position divergences of on-policy distillation (docs/method.md §1–2): OPD estimators, NCA, the ablations.

The conventions (log-probabilities computed once, views aligned column for column, ``[batch, seq]`` outputs) are in
`mechopd.objectives.losses`, which registers these as loss terms.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from mechopd.config.terms import EstimatorOptions

# ---------------------------------------------------------------------------------------------------------------------
# Vocabulary alignment and reduction
# ---------------------------------------------------------------------------------------------------------------------


def common_vocab(*logits: Tensor) -> tuple[Tensor, ...]:
    """Slice every ``[..., vocab_i]`` tensor to the smallest vocabulary ``min_i vocab_i`` (a view, no copy).

    Teacher and student of one tokenizer family can differ only by padding rows (Qwen2.5-3B: 151936 ids, 7B: 152064).
    Apply this to the LOGITS, before ``log_softmax``: the distributions are then normalised over the common ids only,
    so the padding rows carry no mass in either model.
    """
    if not logits:
        raise ValueError("common_vocab needs at least one tensor")
    vocab = min(x.shape[-1] for x in logits)
    return tuple(x[..., :vocab] for x in logits)


def token_mean(per_pos: Tensor, mask: Tensor) -> Tensor:
    """Token mean over the real response tokens of the batch: ``Σ_{b,t} per_pos·mask / Σ_{b,t} mask``.

    per_pos: ``[batch, seq]``; mask: ``[batch, seq]`` bool. Raises ``ValueError`` on an empty mask (a silent NaN or 0
    would hide a rollout with no response tokens).
    """
    _check_mask(mask, per_pos.shape)
    count = int(mask.sum())
    if count == 0:
        raise ValueError("token_mean: the mask selects no response token (all responses empty or fully masked)")
    return torch.where(mask, per_pos, torch.zeros_like(per_pos)).sum() / count


# ---------------------------------------------------------------------------------------------------------------------
# Per-position divergences
# ---------------------------------------------------------------------------------------------------------------------


def _kl(p_logp: Tensor, q_logp: Tensor) -> Tensor:
    """``KL(p ‖ q) = Σ_v p(v) (log p(v) − log q(v))`` over the last axis. ``[..., V] -> [...]``."""
    return (p_logp.exp() * (p_logp - q_logp)).sum(-1)


def reverse_kl_full(student_logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """OPD loss per position over the full vocabulary (teacher detached).

        KL(q_x ‖ f) = Σ_v q_x(v) (log q_x(v) − log f(v))

    student_logp, teacher_logp: ``[batch, seq, vocab]`` -> ``[batch, seq]``. The gradient is analytic through ``q_x``.
    """
    _check_pair(student_logp, teacher_logp)
    return _kl(student_logp, teacher_logp.detach())


def forward_kl_full(student_logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """Estimator ``forward_full``: GKD's on-policy FORWARD KL per position, over the full vocabulary (teacher
    detached). An ablation: NOT the papers' OPD, which is the reverse KL (:func:`reverse_kl_full`).

        KL(f ‖ q_x) = Σ_v f(v) (log f(v) − log q_x(v))          ∂/∂z_x(v) = q_x(v) − f(v)   (logits z_x, T = 1)

    Still on-policy: the positions are the student's own sampled rollout ``y ~ q_x``; only the divergence per
    position changes. The pull on a token's logit is ``f(v) − q_x(v)``, set by the TEACHER's probability, where the
    reverse KL's is ``q_x(v)·(log q_x(v) − log f(v) − KL)``, set by the student's (docs/method.md §1).
    student_logp, teacher_logp: ``[batch, seq, vocab]`` -> ``[batch, seq]``.
    """
    _check_pair(student_logp, teacher_logp)
    return _kl(teacher_logp.detach(), student_logp)


class TopKKL(NamedTuple):
    """Per-position top-k reverse KL ``kl [batch, seq]`` and the student's captured top-k mass ``mass`` (detached)."""

    kl: Tensor
    mass: Tensor


def reverse_kl_topk(
    student_logp: Tensor,
    teacher_logp: Tensor,
    k: int = EstimatorOptions.topk,
    renormalize: bool = EstimatorOptions.renormalize,
    tail: bool = EstimatorOptions.tail,
) -> TopKKL:
    """OPD loss per position summed over the student's top-k ids ``S = TopK(q_x, k)`` (ids picked without gradient).

        KL_k(q_x ‖ f)      = Σ_{v∈S} q_x(v) (log q_x(v) − log f(v))
        renormalize=True:   Σ_{v∈S} q̄(v) (log q̄(v) − log f̄(v)),   q̄ = q_x / Σ_{S} q_x,   f̄ = f / Σ_{S} f
        tail=True:          KL_k + m_q (log m_q − log m_f),   m_q = 1 − Σ_{S} q_x,   m_f = 1 − Σ_{S} f

    Without the tail bucket the sum can be lowered by pushing student mass out of ``S``; the tail term penalises it.
    The tail masses are computed as log-sum-exp over the complement of ``S`` (no ``1 − Σ`` cancellation).
    With ``k ≥ vocab`` this is exactly :func:`reverse_kl_full` (the tail is empty).

    student_logp, teacher_logp: ``[batch, seq, vocab]``. Returns ``TopKKL(kl [batch, seq], mass [batch, seq])`` where
    ``mass = Σ_{v∈S} q_x(v)`` (detached, before renormalisation) is for logging.
    """
    _check_pair(student_logp, teacher_logp)
    teacher_logp = teacher_logp.detach()
    vocab = student_logp.shape[-1]
    ids = student_logp.detach().topk(min(k, vocab), dim=-1).indices  # [B, T, k]
    ls = student_logp.gather(-1, ids)  # log q_x on S, [B, T, k]
    lt = teacher_logp.gather(-1, ids)  # log f on S
    mass = ls.detach().logsumexp(-1).exp()
    if renormalize:
        ls = ls - ls.logsumexp(-1, keepdim=True)
        lt = lt - lt.logsumexp(-1, keepdim=True)
    kl = _kl(ls, lt)
    if tail and k < vocab:
        outside = torch.ones_like(student_logp, dtype=torch.bool).scatter(-1, ids, False)  # complement of S
        log_mq = student_logp.masked_fill(~outside, float("-inf")).logsumexp(-1)  # log(1 − Σ_S q_x)
        log_mf = teacher_logp.masked_fill(~outside, float("-inf")).logsumexp(-1)  # log(1 − Σ_S f)
        kl = kl + log_mq.exp() * (log_mq - log_mf)
    return TopKKL(kl, mass)


class SampledKL(NamedTuple):
    """Surrogate per-token ``loss [batch, seq]`` and the detached ``log_ratio = log q_x(y_t) − log f(y_t)``."""

    loss: Tensor
    log_ratio: Tensor


def sampled_token_kl(student_logp: Tensor, teacher_logp: Tensor, tokens: Tensor) -> SampledKL:
    """Sampled-token OPD estimator (Thinking-Machines style; TA-OPD's code uses it), on the sampled ids ``y_t``.

        A_t    = −sg[log q_x(y_t) − log f(y_t)]          (per-token advantage, detached)
        loss_t = −A_t · log q_x(y_t)                     ∇ loss_t = sg[log q_x(y_t) − log f(y_t)] · ∇ log q_x(y_t)

    Because ``y_t ~ q_x``, ``E[∇ loss_t] = ∇ KL(q_x ‖ f)`` per position. The VALUE of ``loss_t`` is NOT a KL; log
    ``log_ratio`` instead, the unbiased single-sample estimate of ``KL(q_x ‖ f)``.

    student_logp, teacher_logp: ``[batch, seq, vocab]``; tokens: ``[batch, seq]`` long (the sampled response ids; any
    valid id at padded positions). Returns ``SampledKL(loss [batch, seq], log_ratio [batch, seq] detached)``.
    """
    _check_pair(student_logp, teacher_logp)
    if tokens.shape != student_logp.shape[:-1]:
        raise ValueError(f"tokens shape {tuple(tokens.shape)} != logp shape[:-1] {tuple(student_logp.shape[:-1])}")
    idx = tokens.long().unsqueeze(-1)
    logq = student_logp.gather(-1, idx).squeeze(-1)  # log q_x(y_t), [B, T]
    logf = teacher_logp.gather(-1, idx).squeeze(-1)  # log f(y_t)
    return sampled_token_kl_on_tokens(logq, logf)


def sampled_token_kl_on_tokens(student_token_logp: Tensor, teacher_token_logp: Tensor) -> SampledKL:
    """`sampled_token_kl` from ``log q_x(y_t)`` and ``log f(y_t)`` alone (``[batch, seq]`` each; the trainer computes
    them as ``z_y/T − logsumexp(z/T)``, never the full ``[batch, seq, vocab]`` log-probabilities)."""
    if student_token_logp.shape != teacher_token_logp.shape or student_token_logp.dim() != 2:
        raise ValueError(
            f"expected two [batch, seq] token log-probs of one shape, got "
            f"{tuple(student_token_logp.shape)} and {tuple(teacher_token_logp.shape)}"
        )
    log_ratio = (student_token_logp - teacher_token_logp.detach()).detach()
    advantage = -log_ratio
    return SampledKL(-advantage * student_token_logp, log_ratio)


def nca_anchor(student_nctx_logp: Tensor, student_ctx_logp: Tensor) -> Tensor:
    """No-Context Anchoring term per position: forward KL to the stop-gradient no-context view.

        KL(sg[q_x] ‖ q_c) = Σ_v sg[q_x](v) (log sg[q_x](v) − log q_c(v))

    ``q_x`` gets NO gradient from this term (it moves only through OPD); ``q_c`` is pulled to ``q_x``.
    student_nctx_logp, student_ctx_logp: ``[batch, seq, vocab]`` -> ``[batch, seq]``.
    """
    _check_pair(student_nctx_logp, student_ctx_logp)
    return _kl(student_nctx_logp.detach(), student_ctx_logp)


def dual_opd_ctx(student_ctx_logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """DualOPD ablation's extra term: also distil the with-context student to the teacher (teacher detached).

        KL(q_c ‖ f) = Σ_v q_c(v) (log q_c(v) − log f(v))     (estimator forward_full: KL(f ‖ q_c), `forward_kl_full`)

    student_ctx_logp, teacher_logp: ``[batch, seq, vocab]`` -> ``[batch, seq]``.
    """
    return reverse_kl_full(student_ctx_logp, teacher_logp)


def sym_kl(student_nctx_logp: Tensor, student_ctx_logp: Tensor) -> Tensor:
    """SymKL ablation: symmetric KL between the two student views, NO stop-gradient (it pulls ``q_x`` too).

        ½ [KL(q_x ‖ q_c) + KL(q_c ‖ q_x)]

    student_nctx_logp, student_ctx_logp: ``[batch, seq, vocab]`` -> ``[batch, seq]``.
    """
    _check_pair(student_nctx_logp, student_ctx_logp)
    return 0.5 * (_kl(student_nctx_logp, student_ctx_logp) + _kl(student_ctx_logp, student_nctx_logp))


# ---------------------------------------------------------------------------------------------------------------------
# Shape checks (programming errors, not user errors)
# ---------------------------------------------------------------------------------------------------------------------


def _check_pair(a: Tensor, b: Tensor) -> None:
    if a.dim() != 3 or a.shape != b.shape:
        raise ValueError(
            f"expected two [batch, seq, vocab] log-prob tensors of one shape, got {tuple(a.shape)} and "
            f"{tuple(b.shape)} (different vocab sizes: apply common_vocab to the logits first)"
        )


def _check_mask(mask: Tensor, shape: torch.Size) -> None:
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
    if mask.shape != shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != values shape {tuple(shape)}")
