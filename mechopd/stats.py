"""Training runs as the unit of replication: mean and a 95 % Student-t interval over seeds (a statistics leaf).

For a scalar measured once per run (a final accuracy, a mean cosine, a kept fraction) over n seeds:

    mean = (1/n) Σ_k v_k,   s = sqrt(Σ_k (v_k − mean)² / (n − 1)),   interval = mean ± t_{0.975, n−1} · s / sqrt(n)

The t quantile is computed (numeric integration of the t density, bisection), not looked up; with one seed there is no
interval (None). Undefined values (a Harm with no item right without the context) are left out and ``n`` counts the
defined ones. Nothing here reads a file: `mechopd.aggregate` (the orchestration), `mechopd.claims`, `mechopd.report`
and the figures import these functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

CI = 0.95
INTERVAL_NAME = "95 % Student-t interval over seeds (mean ± t·s/√n)"


def _t_cdf(x: float, df: int) -> float:
    """P(T ≤ x) for Student's t with `df` degrees of freedom (x ≥ 0), by Simpson's rule on the density."""
    logc = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    grid = np.linspace(0.0, x, 4001)
    dens = np.exp(logc - (df + 1) / 2 * np.log1p(grid ** 2 / df))
    h = x / 4000
    area = h / 3 * (dens[0] + dens[-1] + 4 * dens[1:-1:2].sum() + 2 * dens[2:-1:2].sum())
    return 0.5 + float(area)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (p in (0.5, 1)) of Student's t with `df` ≥ 1 degrees of freedom (bisection on `_t_cdf`)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def seed_stat(values: Sequence[float | None], ci: float = CI) -> dict[str, Any]:
    """``{"mean", "low", "high", "n", "values"}`` over the defined values; mean None when none is defined,
    low / high None with fewer than two."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    out: dict[str, Any] = {"mean": None, "low": None, "high": None, "n": len(vals), "values": vals}
    if not vals:
        return out
    mean = sum(vals) / len(vals)
    out["mean"] = mean
    if len(vals) >= 2:
        sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        half = t_quantile(0.5 + ci / 2, len(vals) - 1) * sd / math.sqrt(len(vals))
        out["low"], out["high"] = mean - half, mean + half
    return out


def fmt_stat(stat: dict[str, Any] | None, digits: int = 3, signed: bool = False) -> str:
    """``mean [low, high]`` (``n/a`` when undefined, the mean alone with one seed)."""
    if not stat or stat.get("mean") is None:
        return "n/a"
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    text = f.format(stat["mean"])
    if stat.get("low") is not None:
        text += f" [{f.format(stat['low'])}, {f.format(stat['high'])}]"
    return text
