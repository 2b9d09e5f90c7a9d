"""Training runs as the unit of replication: mean and a 95 % Student-t interval over seeds (a statistics leaf).

For a scalar measured once per run (a final accuracy, a mean cosine, a kept fraction) over n seeds:

    mean = (1/n) Σ_k v_k,   s = sqrt(Σ_k (v_k − mean)² / (n − 1)),   interval = mean ± t_{0.975, n−1} · s / sqrt(n)

The t quantile is computed (numeric integration of the t density, bisection), not looked up; with one seed there is no
interval (None). Undefined values (a Harm with no item right without the context) are left out and ``n`` counts the
defined ones. Nothing here reads a file: `mechopd.report.aggregate` (the orchestration), `mechopd.report.claims`, `mechopd.report`
and the figures import these functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

CI = 0.95
INTERVAL_NAME = "95 % Student-t interval over seeds (mean ± t·s/√n)"


def _t_cdf(x: float, df: int) -> float:
    """P(T ≤ x) for Student's t with `df` degrees of freedom (x ≥ 0), by Simpson's rule on the density."""
    logc = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    grid = np.linspace(0.0, x, 4001)
    dens = np.exp(logc - (df + 1) / 2 * np.log1p(grid**2 / df))
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


# ------------------------------------------------------------------------------------- scales for bounded values
# A t-interval is made on a scale where the quantity is unbounded, then mapped back, so it never leaves the
# quantity's range: "log" for positive quantities (KLs, norm ratios: the interval of log v), "log1m" for quantities
# at most 1 whose distance to 1 matters (cosines near 1: the interval of log(1 − v)), "logit" for quantities inside
# (0, 1) (|cos|: the interval of log(v / (1 − v))), "fisher" for correlations and cosines in (−1, 1) (atanh),
# "linear" otherwise.
SCALES = ("linear", "log", "log1m", "logit", "fisher")


def _to(v: float, scale: str) -> float | None:
    if scale == "log":
        return math.log(v) if v > 0 else None
    if scale == "log1m":
        return math.log(1.0 - v) if v < 1 else None
    if scale == "logit":
        return math.log(v / (1.0 - v)) if 0 < v < 1 else None
    if scale == "fisher":
        return math.atanh(v) if -1 < v < 1 else None
    return v


def _back(z: float, scale: str) -> float:
    if scale == "logit":
        return 1.0 / (1.0 + math.exp(-z))
    if scale == "fisher":
        return math.tanh(z)
    return math.exp(z) if scale == "log" else 1.0 - math.exp(z) if scale == "log1m" else z


def scaled_stat(values: Sequence[float | None], scale: str = "linear", ci: float = CI) -> dict[str, Any]:
    """`seed_stat` with the t-interval made on ``scale`` (`SCALES`) and mapped back: ``mean`` is the back-mapped
    mean of the transformed values (the geometric mean for "log"), ``low`` / ``high`` the back-mapped interval ends,
    so the interval stays inside the quantity's range. A value outside the scale's domain (≤ 0 for "log", ≥ 1 for
    "log1m", outside (0, 1) for "logit") is undefined there and left out (``n`` counts the rest; ``values`` keeps the raw defined ones)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    raw = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    z = [t for t in (_to(v, scale) for v in raw) if t is not None]
    st = seed_stat(z, ci)
    out = {**st, "values": raw, "n": len(z), "scale": scale}
    if st["mean"] is not None:
        ends = [_back(st[k], scale) for k in ("low", "high")] if st["low"] is not None else [None, None]
        out["mean"] = _back(st["mean"], scale)
        out["low"], out["high"] = (min(ends), max(ends)) if ends[0] is not None else (None, None)
    return out


# ------------------------------------------------------------------------------ hierarchical bootstrap (seeds × items)
N_BOOT = 1000
ItemFn = Callable[[tuple[np.ndarray, ...]], np.ndarray]  # per-item arrays [B, n] each -> one value per row [B]


def hier_bootstrap(
    seeds: Sequence[tuple[np.ndarray, ...] | None], fn: ItemFn, n_boot: int = N_BOOT, seed: int = 0, ci: float = CI
) -> dict[str, Any]:
    """Mean over seeds of a per-seed statistic of item outcomes, with a two-level percentile bootstrap interval.

    seeds: per training seed, the item arrays the statistic reads (each ``[n_k]``, aligned item for item; None: the
    seed lacks them); fn: arrays ``[B, n]`` -> ``[B]`` values, NaN where undefined (e.g. a Harm with no item right
    without the context). Point: ``values[k] = fn(seed k's items)``, ``mean`` = their mean over the defined seeds.
    Interval: each of `n_boot` replicates draws S seeds with replacement among the S that have data, then, for each
    drawn seed, its items with replacement, and averages fn over the drawn seeds (undefined draws left out); the
    interval is the central `ci` share of the replicates. A statistic of proportions therefore stays in its range
    (no interval leaves [0, 1]), and a seed that disagrees widens it. Deterministic for (data, n_boot, seed).
    """
    have = [(k, a) for k, a in enumerate(seeds) if a is not None and len(a[0]) > 0]
    values = [float(fn(tuple(x[None, :] for x in a))[0]) for _, a in have]
    defined = [v for v in values if math.isfinite(v)]
    out: dict[str, Any] = {
        "mean": (sum(defined) / len(defined)) if defined else None,
        "low": None,
        "high": None,
        "n": len(defined),
        "values": defined,
        "method": "hierarchical bootstrap (seeds, items)",
    }
    if not defined or n_boot < 1:
        return out
    rng = np.random.default_rng(seed)
    s = len(have)
    pick = rng.integers(0, s, size=(n_boot, s))  # which seed fills slot j of replicate b
    reps = np.full((n_boot, s), np.nan)
    for j, (_, arrays) in enumerate(have):
        where = pick == j  # every slot seed j fills gets its own resample of seed j's items
        idx = rng.integers(0, len(arrays[0]), size=(int(where.sum()), len(arrays[0])))
        reps[where] = np.asarray(fn(tuple(x[idx] for x in arrays)), float)
    ok = np.isfinite(reps)
    count = ok.sum(1)
    rep = np.where(ok, reps, 0.0).sum(1)[count > 0] / count[count > 0]  # mean over the defined draws
    if len(rep) >= 10:
        out["low"], out["high"] = (float(v) for v in np.quantile(rep, [(1 - ci) / 2, 1 - (1 - ci) / 2]))
    return out
