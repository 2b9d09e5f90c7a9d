"""TA-OPD's signals normalised over the rollout batch, and the decomposition the selectors score (docs/method.md §3).

``Norm(z) = clip((z − Q05)/(Q95 − Q05), 0, 1)`` over the valid positions of the WHOLE rollout batch (not per
sequence); ``D^L = D̃·C̃`` (learnable disagreement, the TA-OPD score), ``D^I = D̃·(1 − C̃)``. Re-exported by
`mechopd.objectives.select`, which ranks positions by these scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mechopd.config.terms import SignalOptions
from mechopd.core.errors import ConfigError
from mechopd.objectives.signals import TeachabilityStats, _check_mask, _fp32

FLAT_TOL = 1e-12  # Norm(z) is all zeros when Q95 − Q05 < FLAT_TOL (the released code's tolerance)


# ---------------------------------------------------------------------------------------------------------------------
# Normalised signals
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormalizedStats:
    """Batch-normalised signals in [0, 1] (``[batch, seq]``, 0 at invalid positions) and the TA-OPD decomposition.

    DL = D̃·C̃ (learnable disagreement, the TA-OPD score); DI = D̃·(1 − C̃) (incompatible disagreement).
    """

    H: Tensor
    D: Tensor
    C: Tensor
    DL: Tensor
    DI: Tensor


# ---------------------------------------------------------------------------------------------------------------------
# Normalisation and scores
# ---------------------------------------------------------------------------------------------------------------------


def quantile_norm(
    z: Tensor, mask: Tensor, q_low: float = SignalOptions.q_low, q_high: float = SignalOptions.q_high
) -> Tensor:
    """``Norm(z) = clip((z − Q_low)/(Q_high − Q_low), 0, 1)``, quantiles over the valid positions of the whole batch.

    Quantiles interpolate linearly between order statistics (numpy's default "linear" method). If
    ``Q_high − Q_low < 1e-12`` (a flat signal, or fewer than two distinct values) the result is all zeros, as in the
    released code. Invalid positions are 0. z: ``[batch, seq]``; mask: ``[batch, seq]`` bool. Non-finite values at
    valid positions raise ``ValueError``.
    """
    if not 0.0 <= q_low < q_high <= 1.0:
        raise ConfigError(f"quantiles q_low={q_low}, q_high={q_high} are invalid: need 0 <= q_low < q_high <= 1")
    _check_mask(mask, z.shape)
    z = _fp32(z)
    values = z[mask]
    out = torch.zeros_like(z)
    if values.numel() == 0:
        return out
    if not torch.isfinite(values).all():
        raise ValueError("quantile_norm: non-finite values at valid positions")
    ordered = values.sort().values
    lo, hi = _quantile(ordered, q_low), _quantile(ordered, q_high)
    if hi - lo < FLAT_TOL:
        return out
    normed = ((z - lo) / (hi - lo)).clamp(0.0, 1.0)
    return torch.where(mask, normed, out)


def _quantile(ordered: Tensor, q: float) -> float:
    """Linear-interpolation quantile of a sorted 1-D tensor (numpy ``method="linear"``)."""
    pos = q * (ordered.numel() - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    a, b = float(ordered[lo]), float(ordered[hi])
    return a + (b - a) * (pos - lo)


def normalize_stats(
    stats: TeachabilityStats, mask: Tensor, q_low: float = SignalOptions.q_low, q_high: float = SignalOptions.q_high
) -> NormalizedStats:
    """Batch-normalise H, D, C and form the decomposition ``D^L = D̃·C̃``, ``D^I = D̃·(1 − C̃)`` (0 off-mask)."""
    h, d, c = (quantile_norm(x, mask, q_low, q_high) for x in (stats.H, stats.D, stats.C))
    return NormalizedStats(H=h, D=d, C=c, DL=d * c, DI=d * (1.0 - c))  # d = 0 off-mask, so both are 0 there


def soft_or(a: Tensor, b: Tensor) -> Tensor:
    """Soft OR of two [0, 1] scores: ``a + b − a·b``."""
    return a + b - a * b
