"""TA-OPD's per-position signals (docs/method.md §3): compatibility C, union divergence D, top-K entropy H, raw KL.

Shared by the selectors (`mechopd.objectives.select`) and the teachability probe. Union sets are built by
concatenating the two top-K id lists and de-duplicating after a sort (``[.., 2K]``, never a ``[.., vocab]`` mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from mechopd.config.terms import C_MODES, D_MODES, SignalOptions  # declared once, with the config fields
from mechopd.core.errors import ConfigError
from mechopd.objectives.divergences import _check_mask

FLOOR = 1e-12  # the released code's probability floor (d_mode="floored")


# ---------------------------------------------------------------------------------------------------------------------
# Signals
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TeachabilityStats:
    """Raw per-position signals, all ``[batch, seq]`` float, detached, 0 at invalid positions.

    C: compatibility mass; D: divergence on the union support; H: entropy (nats) of the student's renormalised top-K;
    kl_full: full-vocabulary ``KL(p_t ‖ p_s)`` (the "raw KL" the paper contrasts with the decomposition), or None
    when not asked for: no selector reads it (the trainer skips it; the teachability probe reports it).
    """

    C: Tensor
    D: Tensor
    H: Tensor
    kl_full: Tensor | None = None


OPTIONAL_SIGNALS = ("kl_full",)  # the TeachabilityStats fields that may be None (the last ones, in field order)


def cat_stats(parts: Sequence[TeachabilityStats], dim: int) -> TeachabilityStats:
    """Every field of ``parts`` concatenated along ``dim`` (1: chunks of positions, 0: micro-batches of rows), by
    name; a field left None in the parts stays None."""
    names = [f.name for f in fields(TeachabilityStats) if getattr(parts[0], f.name) is not None]
    return TeachabilityStats(**{n: torch.cat([getattr(p, n) for p in parts], dim) for n in names})


def teachability_stats(
    student_logp: Tensor,
    teacher_logp: Tensor,
    mask: Tensor,
    k: int = SignalOptions.k,
    c_mode: str = SignalOptions.c_mode,
    d_mode: str = SignalOptions.d_mode,
    kl_full: bool = True,
) -> TeachabilityStats:
    """Per-position TA-OPD signals (no gradient). ``K = min(k, vocab)``.

        S_t = TopK(p_s, K),  T_t = TopK(p_t, K),  U_t = S_t ∪ T_t
        C_t exact        = Σ_{v∈S_t} p_t(v)                          (paper)
        C_t lower_bound  = Σ_{v∈S_t ∩ T_t} p_t(v)                    (released code's default: the teacher's
                                                                      probabilities are only known on T_t)
        D_t union        = KL(p̄_t ‖ p̄_s),  p̄ = p / Σ_{U_t} p  on U_t                           (paper)
        D_t floored      = Σ_{v∈U_t} p̃_t(v) (log p̃_t(v) − log p̃_s(v)),                         (released code)
                           p̃_s(v) = max(p_s(v)/Σ_{S_t} p_s · [v∈S_t], 1e-12),
                           p̃_t(v) = max(p_t(v)/Σ_{T_t} p_t · [v∈T_t], 1e-12)
                           i.e. each model is renormalised on its OWN top-K and the ids it does not list are floored:
                           teacher mass off the student's list dominates D.
        H_t              = −Σ_{v∈S_t} p̄_s(v) log p̄_s(v),  p̄_s = p_s / Σ_{S_t} p_s   (nats; the released code divides
                           by log K, a constant that Norm() removes)
        kl_full_t        = Σ_v p_t(v) (log p_t(v) − log p_s(v))

    student_logp, teacher_logp: ``[batch, seq, vocab]``; mask: ``[batch, seq]`` bool. ``kl_full=False`` leaves
    ``kl_full`` None: the selectors never read it, and at a real vocabulary it is four passes over ``[batch, seq,
    vocab]`` and three temporaries of that size per chunk (the trainer passes False).
    """
    _check_choice("k", k, None)
    _check_choice("c_mode", c_mode, C_MODES)
    _check_choice("d_mode", d_mode, D_MODES)
    _check_inputs(student_logp, teacher_logp, mask)
    with torch.no_grad():
        ls_all, lt_all = _fp32(student_logp), _fp32(teacher_logp)
        kk = min(k, ls_all.shape[-1])
        ids_s = ls_all.topk(kk, dim=-1).indices  # S_t, [B, T, K]
        ids_t = lt_all.topk(kk, dim=-1).indices  # T_t, [B, T, K]
        stats = {
            "C": _compat_mass(lt_all, ids_s, ids_t, c_mode),
            "D": (_union_kl if d_mode == "union" else _floored_kl)(ls_all, lt_all, ids_s, ids_t),
            "H": _topk_entropy(ls_all, ids_s),
        }
        if kl_full:
            stats["kl_full"] = (lt_all.exp() * (lt_all - ls_all)).sum(-1)
        zero = torch.zeros((), dtype=ls_all.dtype, device=ls_all.device)
        return TeachabilityStats(**{name: torch.where(mask, v, zero) for name, v in stats.items()})


def _compat_mass(lt_all: Tensor, ids_s: Tensor, ids_t: Tensor, c_mode: str) -> Tensor:
    """C = Σ_{v∈S} p_t(v) (exact) or Σ_{v∈S∩T} p_t(v) (lower_bound). ``[B, T, V] -> [B, T]``."""
    pt_on_s = lt_all.gather(-1, ids_s).exp()  # p_t(v), v ∈ S, [B, T, K]
    if c_mode == "lower_bound":
        pt_on_s = pt_on_s * _member(ids_s, ids_t)  # keep v ∈ S ∩ T
    return pt_on_s.sum(-1).clamp(0.0, 1.0)


def _union_ids(ids_s: Tensor, ids_t: Tensor) -> tuple[Tensor, Tensor]:
    """Sorted ``[B, T, 2K]`` ids of S ∪ T with duplicates, and a bool ``first`` marking one copy of each id."""
    ids, _ = torch.cat([ids_s, ids_t], dim=-1).sort(dim=-1)
    first = torch.ones_like(ids, dtype=torch.bool)
    first[..., 1:] = ids[..., 1:] != ids[..., :-1]
    return ids, first


def _union_kl(ls_all: Tensor, lt_all: Tensor, ids_s: Tensor, ids_t: Tensor) -> Tensor:
    """Paper's D: ``KL(p̄_t ‖ p̄_s)`` with both renormalised on U = S ∪ T. ``[B, T]``."""
    ids, first = _union_ids(ids_s, ids_t)
    ls = ls_all.gather(-1, ids).masked_fill(~first, float("-inf"))  # log p_s on U (each id once), [B, T, 2K]
    lt = lt_all.gather(-1, ids).masked_fill(~first, float("-inf"))
    ls = ls - ls.logsumexp(-1, keepdim=True)  # log p̄_s
    lt = lt - lt.logsumexp(-1, keepdim=True)  # log p̄_t
    terms = torch.where(first, lt.exp() * (lt - ls), torch.zeros_like(lt))
    return terms.sum(-1)


def _floored_kl(ls_all: Tensor, lt_all: Tensor, ids_s: Tensor, ids_t: Tensor) -> Tensor:
    """Released code's D: each model renormalised on its own top-K, unlisted ids floored at 1e-12. ``[B, T]``."""
    ids, first = _union_ids(ids_s, ids_t)
    ps = _own_topk_probs(ls_all, ids, ids_s).clamp_min(FLOOR)  # p̃_s on U, [B, T, 2K]
    pt = _own_topk_probs(lt_all, ids, ids_t).clamp_min(FLOOR)  # p̃_t on U
    terms = pt * (pt.log() - ps.log())
    return torch.where(first, terms, torch.zeros_like(terms)).sum(-1)


def _own_topk_probs(logp_all: Tensor, ids: Tensor, own_ids: Tensor) -> Tensor:
    """``p(v) / Σ_{own} p`` for v in the model's own top-K list, 0 otherwise; evaluated at ``ids`` ``[B, T, M]``."""
    log_norm = logp_all.gather(-1, own_ids).logsumexp(-1, keepdim=True)  # log Σ_{own} p
    probs = (logp_all.gather(-1, ids) - log_norm).exp()
    return probs * _member(ids, own_ids)


def _member(ids: Tensor, of: Tensor) -> Tensor:
    """``[.., M]`` bool: ``ids[.., m] ∈ of[.., :]`` (per position)."""
    return (ids.unsqueeze(-1) == of.unsqueeze(-2)).any(-1)


def _topk_entropy(ls_all: Tensor, ids_s: Tensor) -> Tensor:
    """H = −Σ_{v∈S} p̄_s(v) log p̄_s(v) on the student's renormalised top-K. ``[B, T]``."""
    ls = ls_all.gather(-1, ids_s)
    ls = ls - ls.logsumexp(-1, keepdim=True)
    return -(ls.exp() * ls).sum(-1)


# ---------------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------------


def _fp32(x: Tensor) -> Tensor:
    """Detached, in at least float32 (bf16/fp16 are upcast; float64 stays float64)."""
    return x.detach().to(torch.promote_types(x.dtype, torch.float32))


def _check_choice(field: str, value, allowed: tuple[str, ...] | None) -> None:
    if allowed is None:  # an integer >= 1
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"{field}={value!r} is invalid: it must be an integer >= 1 (TA-OPD default K={SignalOptions.k})"
            )
    elif value not in allowed:
        raise ConfigError(f"{field}={value!r} is unknown: use one of {', '.join(allowed)}")


def _check_inputs(student_logp: Tensor, teacher_logp: Tensor, mask: Tensor) -> None:
    if student_logp.dim() != 3 or student_logp.shape != teacher_logp.shape:
        raise ValueError(
            f"expected two [batch, seq, vocab] log-prob tensors of one shape, got {tuple(student_logp.shape)} and "
            f"{tuple(teacher_logp.shape)} (different vocab sizes: apply divergences.common_vocab to the logits first)"
        )
    _check_mask(mask, student_logp.shape[:-1])
