"""Training runs as the unit of replication: mean and a 95 % Student-t interval over seeds (a statistics leaf).

For a scalar measured once per run (a final accuracy, a mean cosine, a kept fraction) over n seeds:

    mean = (1/n) Σ_k v_k,   s = sqrt(Σ_k (v_k − mean)² / (n − 1)),   interval = mean ± t_{0.975, n−1} · s / sqrt(n)

The t quantile is computed (numeric integration of the t density, bisection), not looked up; with one seed there is no
interval (None). A statistic of item outcomes (a proportion, a paired difference, a ratio of per-token means) is noisy
within a seed too: `hier_bootstrap` / `floored_t` make the same t-interval over the seeds' values with the seeds' own
item-level variance as a floor (docs/method.md §8; calibrated in bench/coverage.py). Undefined values (a Harm with no item right without the context) are left out and ``n`` counts the
defined ones. Nothing here reads a file: `mechopd.report.aggregate` (the orchestration), `mechopd.report.claims`, `mechopd.report`
and the figures import these functions.
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=256)
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


# ------------------------------------------------------------------ seeds × items: Student-t over seeds, item floor
N_BOOT = 1000
ItemFn = Callable[[tuple[np.ndarray, ...]], np.ndarray]  # per-item arrays [B, n] each -> one value per row [B]
HIER_METHOD = "hierarchical (seeds, items): Student-t over seeds, item-bootstrap variance floor"


def floored_t(
    values: np.ndarray, item_var: np.ndarray, ci: float = CI, bounds: tuple[float, float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The interval of the mean over S ≥ 2 seeds of a per-seed statistic whose value is itself noisy at the item level
    (vectorised over leading axes: ``values``, ``item_var`` ``[..., S]``; returns ``low``, ``high`` ``[...]``):

        v̄ = (1/S) Σ_k v_k,   s² = Σ_k (v_k − v̄)² / (S − 1),   w̄ = (1/S) Σ_k w_k,
        interval = v̄ ± t_{(1+ci)/2, S−1} · sqrt(max(s², w̄) / S),   clipped to ``bounds``

    where w_k is seed k's item-level variance of v_k. s² estimates Var(v_k) = σ²_seed + w (between-seed spread plus
    item noise), so the plain t-interval is exact for normal seed effects at any spread; the floor w̄ only widens it when
    the seeds agree more closely than their own item noise allows (chance with 2–3 seeds, and certain for a discrete
    statistic whose seeds tie), so it never covers less than the t-interval. Clipping to the quantity's range
    (``bounds``, e.g. (0, 1) for a proportion) never moves the true value out of the interval."""
    v, w = np.asarray(values, np.float64), np.asarray(item_var, np.float64)
    s = v.shape[-1]
    if s < 2:
        raise ValueError(f"floored_t needs at least 2 seeds, got {s}")
    mean = v.mean(-1)
    var = np.maximum(v.var(-1, ddof=1), np.where(np.isfinite(w), w, 0.0).mean(-1))
    half = t_quantile(0.5 + ci / 2, s - 1) * np.sqrt(var / s)
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = np.clip(low, *bounds), np.clip(high, *bounds)
    return low, high


def _item_replicates(arrays: tuple[np.ndarray, ...], fn: ItemFn, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` values of fn on resamples (with replacement) of one seed's items, NaN where undefined."""
    idx = rng.integers(0, len(arrays[0]), size=(n_boot, len(arrays[0])))
    return np.asarray(fn(tuple(x[idx] for x in arrays)), np.float64)


def _to_array(x: np.ndarray, scale: str) -> np.ndarray:
    """`_to` element by element: NaN outside the scale's domain."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = {
            "log": lambda v: np.where(v > 0, np.log(np.where(v > 0, v, 1.0)), np.nan),
            "log1m": lambda v: np.where(v < 1, np.log(np.where(v < 1, 1.0 - v, 1.0)), np.nan),
            "logit": lambda v: np.where((v > 0) & (v < 1), np.log(v / (1.0 - v)), np.nan),
            "fisher": lambda v: np.where(np.abs(v) < 1, np.arctanh(np.clip(v, -1 + 1e-12, 1 - 1e-12)), np.nan),
        }.get(scale, lambda v: v)(np.asarray(x, np.float64))
    return np.asarray(z, np.float64)


def hier_bootstrap(
    seeds: Sequence[tuple[np.ndarray, ...] | None],
    fn: ItemFn,
    n_boot: int = N_BOOT,
    seed: int = 0,
    ci: float = CI,
    bounds: tuple[float, float] | None = None,
    scale: str = "linear",
) -> dict[str, Any]:
    """Mean over seeds of a per-seed statistic of item outcomes, with an interval honest at a handful of seeds.

    seeds: per training seed, the item arrays the statistic reads (each ``[n_k]``, aligned item for item; None: the
    seed lacks them); fn: arrays ``[B, n]`` -> ``[B]`` values, NaN where undefined (e.g. a Harm with no item right
    without the context). Point: ``values[k] = fn(seed k's items)``, ``mean`` = their mean over the S defined seeds
    (on ``scale``, `SCALES`, mapped back: "log" gives the geometric mean, for ratios). Item level: per seed,
    `n_boot` resamples of its items give w_k = the variance of fn (on ``scale``) over the resamples (the item noise
    of v_k; undefined resamples left out). Interval (docs/method.md §8): with S ≥ 2, `floored_t` on the scale —
    v̄ ± t_{0.975, S−1} · sqrt(max(s², w̄) / S), mapped back and clipped to ``bounds``: the between-seed part takes
    the small-sample t quantile (a percentile bootstrap over 3 seed values has 10 distinct resampled means and covered
    77 % at the demo's spread), the item level is the floor that keeps a seed's own noise in. With S = 1: the central
    `ci` share of that seed's item resamples (an item-level interval; the verdict marks it one seed).
    Deterministic for (data, n_boot, seed).
    """
    have = [a for a in seeds if a is not None and len(a[0]) > 0]
    raw = np.array([float(fn(tuple(x[None, :] for x in a))[0]) for a in have], np.float64)
    z = _to_array(raw, scale)
    ok = np.isfinite(z)
    out: dict[str, Any] = {
        "mean": _back(float(z[ok].mean()), scale) if ok.any() else None,
        "low": None,
        "high": None,
        "n": int(ok.sum()),
        "values": [float(v) for v in raw[ok]],
        "method": HIER_METHOD,
    }
    if not ok.any() or n_boot < 1:
        return out
    rng = np.random.default_rng(seed)
    reps = [_to_array(_item_replicates(a, fn, n_boot, rng), scale) for a, good in zip(have, ok) if good]
    if len(reps) == 1:
        one = reps[0][np.isfinite(reps[0])]
        if len(one) < 10:
            return out
        ends = [_back(float(v), scale) for v in np.quantile(one, [(1 - ci) / 2, 1 - (1 - ci) / 2])]
    else:
        w = np.array([float(np.var(r[np.isfinite(r)], ddof=1)) if np.isfinite(r).sum() >= 2 else 0.0 for r in reps])
        ends = [_back(float(v), scale) for v in floored_t(z[ok], w, ci)]
    low, high = min(ends), max(ends)
    out["low"], out["high"] = (max(low, bounds[0]), min(high, bounds[1])) if bounds is not None else (low, high)
    return out
