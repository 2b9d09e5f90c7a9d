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
ZERO_WIDTH = 1e-12  # an interval narrower than this (relative) is a point: never printed as an interval
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
        if sd <= ZERO_WIDTH * max(1.0, abs(mean)):  # identical seeds: no replication variance, no interval
            out["degenerate"] = f"every seed gives {mean:.4g}: the seeds do not vary, so they make no interval"
            return out
        half = t_quantile(0.5 + ci / 2, len(vals) - 1) * sd / math.sqrt(len(vals))
        out["low"], out["high"] = mean - half, mean + half
        out.update(se=sd / math.sqrt(len(vals)), df=len(vals) - 1, var_seed=sd**2, var_item=0.0, items=0)
    return out


def fmt_stat(stat: dict[str, Any] | None, digits: int = 3, signed: bool = False) -> str:
    """``mean [low, high]`` (``n/a`` when undefined, the mean alone with one seed, ``mean (no interval: …)`` for a
    statistic with no informative unit, ``mean [low, high] (k of N, exact)`` for a Clopper–Pearson bound)."""
    if not stat or stat.get("mean") is None:
        return "n/a"
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    if stat.get("low") is not None and digits < 6 and f.format(stat["low"]) == f.format(stat["high"]):
        return fmt_stat(stat, digits + 1, signed)  # a narrow interval is printed with the digits that show its width
    text = f.format(stat["mean"])
    if stat.get("low") is not None:
        text += f" [{f.format(stat['low'])}, {f.format(stat['high'])}]"
    if stat.get("exact"):
        text += f" ({stat['exact']}, exact)"
    elif stat.get("degenerate"):
        text += " (no interval: no informative unit)"
    return text


def never_a_point(
    value: float | None, low: float | None, high: float | None, units: int, ci: float = CI
) -> tuple[float | None, float | None]:
    """An item-bootstrap interval of a proportion ``value`` over ``units`` informative units, with a zero-width one
    at 0 or 1 replaced by the exact bound (`exact_bound`); ``(low, high)`` unchanged otherwise (no unit: None, None)."""
    if value is None or low is None or high is None or high - low > ZERO_WIDTH or value not in (0.0, 1.0):
        return low, high
    return exact_bound(0 if value == 0.0 else units, units, ci) if units >= 1 else (None, None)


def exact_bound(events: int, trials: int, ci: float = CI) -> tuple[float, float]:
    """The Clopper–Pearson interval of a proportion at a boundary count (0 or ``trials`` events of ``trials`` ≥ 1):

        0 of N:  [0, 1 − (α/2)^(1/N)],   N of N:  [(α/2)^(1/N), 1],   α = 1 − ci

    (at 95 % the upper end is ≈ 3.7/N: the rule of three's two-sided form). Between the boundaries the claims use
    the t-interval (`floored_t`), which is never zero-width there."""
    if trials < 1 or events not in (0, trials):
        raise ValueError(f"exact_bound is the boundary case: 0 or {trials} events of {trials} >= 1, got {events}")
    edge = ((1 - ci) / 2) ** (1 / trials)
    return (0.0, 1.0 - edge) if events == 0 else (edge, 1.0)


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


def on_scale(v: float, scale: str) -> float | None:
    """``v`` on ``scale`` (`SCALES`); None outside the scale's domain."""
    return _to(v, scale)


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


def _item_replicates(
    arrays: tuple[np.ndarray, ...],
    fn: ItemFn,
    n_boot: int,
    rng: np.random.Generator,
    clusters: np.ndarray | None = None,
) -> np.ndarray:
    """``n_boot`` values of fn on resamples (with replacement) of one seed's items, NaN where undefined. With
    ``clusters`` (``[n]``, one id per item, e.g. the fact an item paraphrases) whole clusters are resampled: C of the
    seed's C clusters drawn with replacement, each with all its items (a resample of unequal clusters has a varying
    item count; fn is called once per count)."""
    n = len(arrays[0])
    if clusters is None:
        idx = rng.integers(0, n, size=(n_boot, n))
        return np.asarray(fn(tuple(x[idx] for x in arrays)), np.float64)
    _, inv = np.unique(np.asarray(clusters), return_inverse=True)
    members = [np.flatnonzero(inv == c) for c in range(int(inv.max()) + 1)]
    pick = rng.integers(0, len(members), size=(n_boot, len(members)))  # [B, C] cluster draws
    sizes = np.array([len(m) for m in members])
    if np.all(sizes == sizes[0]):
        idx = np.stack(members)[pick].reshape(n_boot, -1)  # [B, C · size]
        return np.asarray(fn(tuple(x[idx] for x in arrays)), np.float64)
    rows = [np.concatenate([members[c] for c in p]) for p in pick]
    lengths = np.array([len(r) for r in rows])
    out = np.empty(n_boot, np.float64)
    for length in np.unique(lengths):
        sel = np.flatnonzero(lengths == length)
        idx = np.stack([rows[i] for i in sel])
        out[sel] = np.asarray(fn(tuple(x[idx] for x in arrays)), np.float64)
    return out


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
    trials: ItemFn | None = None,
    clusters: Sequence[np.ndarray | None] | None = None,
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

    Never a point (`_boundary`): a proportion (``trials`` given: arrays -> the informative units of each row, its
    denominator) at 0 or 1 in every seed gets the exact Clopper–Pearson bound on the pooled units (`exact_bound`,
    ``"exact": "0 of N"``; a paired difference of two 0/1 outcomes in ``bounds`` (−1, 1) at ±1 likewise, mapped
    affinely: every unit at +1 gives [2L − 1, 1] with L the exact lower bound of the share at +1; every unit at 0 —
    no item differs — gives [−U, U] with U the exact upper bound of the discordant share at 0 of N); any other statistic whose interval would be zero-width has no informative unit —
    ``low`` / ``high`` None and ``"degenerate"`` says why (`verdicts.decide`: not measurable). The result also carries
    ``se`` / ``df`` (on ``scale``), ``var_seed`` (s²), ``var_item`` (w̄) and ``items`` (mean n_k) for the p-value and
    the MDE (`p_value`, `mde`). Deterministic for (data, n_boot, seed).

    ``clusters`` (per seed, aligned with ``seeds``: an id per item, or None): the item level resamples whole clusters
    (a fact with all its paraphrases) instead of single items, so w_k keeps the noise of which facts a seed drew
    (docs/method.md §8, the cluster rule); with one seed the interval is then v ± t_{0.975, C−1} · se over its C
    clusters, se = sqrt(C / (C − 1)) · sd(resamples), made on the logit for a proportion in (0, 1) (delta method:
    se / (v (1 − v))) and mapped back (bench/coverage.py, one seed of 6 facts × 8 paraphrases: the percentile interval
    covered 0.88, the linear t 0.91 with 0.07 false "≤", this 0.97); None everywhere is the item resample, bit for bit.
    """
    cl = _checked_clusters(seeds, clusters)
    have_cl = [c for a, c in zip(seeds, cl) if a is not None and len(a[0]) > 0]
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
        "scale": scale,
        "items": float(np.mean([len(a[0]) for a, g in zip(have, ok) if g])) if ok.any() else 0.0,
    }
    if not ok.any() or n_boot < 1:
        return out
    kept = [a for a, good in zip(have, ok) if good]
    kept_cl = [c for c, good in zip(have_cl, ok) if good]
    if trials is not None and bounds is not None and _boundary(out, raw[ok], kept, trials, bounds, ci, kept_cl):
        return out
    rng = np.random.default_rng(seed)
    reps = [_to_array(_item_replicates(a, fn, n_boot, rng, c), scale) for a, c in zip(kept, kept_cl)]
    if len(reps) == 1:
        one = reps[0][np.isfinite(reps[0])]
        if len(one) < 10:
            return out
        got = _one_seed_ends(out, one, float(z[ok][0]), kept_cl[0], bounds, scale, ci)
        if got is None:
            return out
        ends = got
    else:
        w = np.array([float(np.var(r[np.isfinite(r)], ddof=1)) if np.isfinite(r).sum() >= 2 else 0.0 for r in reps])
        ends = [_back(float(v), scale) for v in floored_t(z[ok], w, ci)]
        s2, wbar = float(np.var(z[ok], ddof=1)), float(w.mean())
        out.update(se=math.sqrt(max(s2, wbar) / len(reps)), df=len(reps) - 1, var_seed=s2, var_item=wbar)
    return _set_interval(out, ends, bounds, trials, kept, kept_cl, ci)


def _set_interval(
    out: dict[str, Any],
    ends: list[float],
    bounds: tuple[float, float] | None,
    trials: ItemFn | None,
    kept: list[tuple[np.ndarray, ...]],
    kept_cl: list[np.ndarray | None],
    ci: float,
) -> dict[str, Any]:
    """`hier_bootstrap`'s last step: ``ends`` clipped to ``bounds`` into ``out``; never a zero-width interval (a paired
    difference with every item concordant takes the exact bound on its units; anything else is "degenerate")."""
    low, high = min(ends), max(ends)
    low, high = (max(low, bounds[0]), min(high, bounds[1])) if bounds is not None else (low, high)
    if high - low <= ZERO_WIDTH * max(1.0, abs(out["mean"])) and trials is not None and bounds == (-1.0, 1.0):
        units = _units(kept, trials, kept_cl)
        if units >= 1 and abs(out["mean"]) <= ZERO_WIDTH:  # every item concordant: |d| ≤ the discordant share
            u = exact_bound(0, units, ci)[1]
            out.update(low=-u, high=u, exact=f"0 of {units} items differ")
            exact_se(out, ci)
            return out
    if high - low <= ZERO_WIDTH * max(1.0, abs(out["mean"])):
        out["degenerate"] = f"every resample of every seed gives {out['mean']:.4g}: no item varies the statistic"
        return out
    out["low"], out["high"] = low, high
    return out


def _checked_clusters(
    seeds: Sequence[tuple[np.ndarray, ...] | None], clusters: Sequence[np.ndarray | None] | None
) -> list[np.ndarray | None]:
    """`hier_bootstrap`'s ``clusters`` checked against ``seeds`` (one array per seed, one id per item); None: none."""
    if clusters is not None and len(clusters) != len(seeds):
        raise ValueError(f"hier_bootstrap: {len(clusters)} cluster arrays for {len(seeds)} seeds")
    cl: list[np.ndarray | None] = list(clusters) if clusters is not None else [None] * len(seeds)
    for a, c in zip(seeds, cl):
        if a is not None and c is not None and len(c) != len(a[0]):
            raise ValueError(f"hier_bootstrap: {len(c)} cluster ids for {len(a[0])} items")
    return cl


def _one_seed_ends(
    out: dict[str, Any],
    one: np.ndarray,
    m1: float,
    clusters: np.ndarray | None,
    bounds: tuple[float, float] | None,
    scale: str,
    ci: float,
) -> list[float] | None:
    """One seed's interval ends (`hier_bootstrap`, S = 1) from its finite resamples ``one`` (on ``scale``) and its
    value ``m1``; fills ``out``'s se / df / variances. With clusters: v ± t_{0.975, C−1} · se, se = sqrt(C / (C − 1))
    · sd(resamples), on the logit for a proportion (delta method: se / (v (1 − v))); one cluster: None and
    ``out["degenerate"]`` says why. Without: the central ``ci`` share of the resamples."""
    n_cl = len(np.unique(clusters)) if clusters is not None else 0
    if clusters is not None and n_cl < 2:
        out["degenerate"] = "one cluster: a seed of one fact has no within-seed replication"
        return None
    if clusters is None:
        out.update(se=float(np.std(one, ddof=1)), df=0, var_seed=0.0, var_item=float(np.var(one, ddof=1)))
        return [_back(float(v), scale) for v in np.quantile(one, [(1 - ci) / 2, 1 - (1 - ci) / 2])]
    se1 = float(np.std(one, ddof=1)) * math.sqrt(n_cl / (n_cl - 1))  # few clusters: t over C − 1 df
    half1 = t_quantile(0.5 + ci / 2, n_cl - 1) * se1
    out.update(se=se1, df=n_cl - 1, var_seed=0.0, var_item=se1**2)
    if bounds == (0.0, 1.0) and scale == "linear" and 0.0 < m1 < 1.0:  # a proportion: the t-interval on the logit
        lg, sl = math.log(m1 / (1.0 - m1)), half1 / (m1 * (1.0 - m1))
        return [1.0 / (1.0 + math.exp(-(lg + d))) for d in (-sl, sl)]
    return [_back(m1 + d, scale) for d in (-half1, half1)]


def _boundary(
    out: dict[str, Any],
    values: np.ndarray,
    seeds: Sequence[tuple[np.ndarray, ...]],
    trials: ItemFn,
    bounds: tuple[float, float],
    ci: float,
    clusters: Sequence[np.ndarray | None] | None = None,
) -> bool:
    """A proportion at the same bound (0 or 1) in every seed: the exact bound on the pooled informative units
    (`_units`), set in ``out`` (True); no unit at all: degenerate (True); else False (the t-interval applies)."""
    at = [b for b in bounds if np.all(np.abs(values - b) <= ZERO_WIDTH)]
    if not at:
        return False
    units = _units(seeds, trials, clusters)
    if units < 1:
        out["degenerate"] = "no informative unit in any seed"
        return True
    events = 0 if at[0] == bounds[0] else units
    lo, hi = exact_bound(events, units, ci)  # on the share of units at the upper bound, mapped onto ``bounds``
    out["low"], out["high"] = bounds[0] + (bounds[1] - bounds[0]) * lo, bounds[0] + (bounds[1] - bounds[0]) * hi
    out["exact"] = f"{events} of {units}"
    exact_se(out, ci)
    return True


def _units(
    seeds: Sequence[tuple[np.ndarray, ...]], trials: ItemFn, clusters: Sequence[np.ndarray | None] | None = None
) -> int:
    """The informative units an exact bound counts, pooled over seeds. With a seed's items in C clusters of its n
    items, its u informative items count as ceil(u · C / n) units: paraphrases of one fact are one unit (the
    effective sample size when a fact's paraphrases agree), so "0 of N" is not N paraphrases of a few facts."""
    total = 0.0
    for k, a in enumerate(seeds):
        u = float(trials(tuple(x[None, :] for x in a))[0])
        c = None if clusters is None else clusters[k]
        total += u if c is None else math.ceil(round(u * len(np.unique(c)) / len(a[0]), 9))
    return int(round(total))


def exact_se(out: dict[str, Any], ci: float) -> None:
    """An exact interval's se for the MDE: its width over 2 z_{(1+ci)/2} (normal df; no variance components, so no
    design is proposed, and no p: `p_value` leaves an exact statistic to its interval)."""
    out.update(se=(out["high"] - out["low"]) / (2 * _z(0.5 + ci / 2)), df=0, var_seed=None, var_item=None)


def p_value(stat: dict[str, Any], bar: float, op: str) -> float | None:
    """One-sided p of the verdict's direction for ``stat OP bar``: the t statistic (mean − bar)/se on the stat's
    scale with its df (a normal tail with one seed's item bootstrap), P(T ≥ |t|) when the mean sits on the side the
    verdict took; None without an se (an exact or degenerate statistic: the interval alone decides it)."""
    se, df = stat.get("se"), stat.get("df")
    if se is None or stat.get("mean") is None or se <= 0 or stat.get("exact"):
        return None
    z_mean, z_bar = _to(stat["mean"], stat.get("scale", "linear")), _to(bar, stat.get("scale", "linear"))
    if z_mean is None or z_bar is None:
        return None
    t = abs(z_mean - z_bar) / se
    tail = 0.5 * math.erfc(t / math.sqrt(2)) if not df else 1.0 - _t_cdf(t, int(df))
    return max(float(tail), 0.0)


POWER = 0.8


def mde(stat: dict[str, Any], ci: float = CI, power: float = POWER) -> float | None:
    """Minimum detectable effect at ``power`` of a statistic with the run's own se and df, on its scale:

        MDE = (t_{(1+ci)/2, df} + t_{power, df}) · se

    (the distance from the bar a true value needs for the interval to clear the bar with probability ``power``);
    None without an se."""
    se, df = stat.get("se"), stat.get("df")
    if se is None:
        return None
    q = (lambda p: t_quantile(p, int(df))) if df else _z
    return (q(0.5 + ci / 2) + q(power)) * float(se)


def _z(p: float) -> float:
    return t_quantile(p, 10_000)


def design_for(stat: dict[str, Any], effect: float, ci: float = CI, power: float = POWER) -> tuple[int, int] | None:
    """Seeds × items that would detect ``effect`` (a distance from the bar, on the stat's scale) at ``power``, from
    the run's variance components: Var(v̄) = (σ²_seed + c / n) / S with c = w̄ · n (item variance per item) and
    σ²_seed = max(s² − w̄, 0); the fewest seeds S (≤ 200) at the run's items n, else at 4 n. None without components
    or with no effect."""
    if stat.get("var_item") is None or stat.get("var_seed") is None or not effect or not stat.get("items"):
        return None
    n = max(int(round(stat["items"])), 1)
    c, s2 = float(stat["var_item"]) * n, max(float(stat.get("var_seed") or 0.0) - float(stat["var_item"]), 0.0)
    for items in (n, 4 * n):
        for seeds in range(2, 201):
            q = t_quantile(0.5 + ci / 2, seeds - 1) + t_quantile(power, seeds - 1)
            if q * math.sqrt((s2 + c / items) / seeds) <= abs(effect):
                return seeds, items
    return None
