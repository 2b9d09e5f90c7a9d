"""Coverage of the claims' intervals, measured by simulating the demo's structure (seeds × items), not assumed.

Each replication draws S per-seed true effects around a true mean θ with a between-seed spread σ, then n items per
seed, computes the per-seed statistic v_k and its item-level variance w_k, and makes the interval the claims make.
Coverage is the share of replications whose interval holds θ; a rule's boundary error rate is the share that says
"holds" when θ sits exactly on its bar (a correct 95 % two-sided interval: 2.5 %). Monte Carlo error: sqrt(p(1−p)/R).

Quantities (``QUANTITIES``), seed effects normal on the quantity's scale and clipped to its range (θ: the clipped
normal's mean, in closed form):

* ``prop0`` / ``prop50``: a proportion near 0 (0.05) / near 0.5; seed k's true p_k, items Bernoulli(p_k),
  v_k = the share right, w_k = v_k (1 − v_k) / n (what the item bootstrap's variance of a mean estimates). Near a
  bound the spread is capped at half the distance to it (σ ≤ 0.025 at 0.05): a wider spread piles seeds on the bound,
  and no interval from a handful of seeds sees the rare seed that carries the mean (``CAP``);
* ``diff``: a paired difference of two 0/1 outcomes per item, P(+1) = R_DISC + d_k/2, P(−1) = R_DISC − d_k/2,
  v_k = mean difference, w_k = its plug-in variance / n;
* ``ratio``: a ratio of per-token means (the lens KL and cosine-distance rows), items Gamma(4) with means 1 and
  1/ρ_k, log ρ_k ~ N(log θ, σ²); the interval is made on log v_k (w_k by the delta method: Var log v ≈ Var v / v²)
  and mapped back, so θ is the geometric mean over seeds, as `hier_bootstrap(..., scale="log")` reports it.

These use `stats.floored_t` (what `stats.hier_bootstrap` computes, with w_k from its item resamples). The seed-level
types (`stats.seed_stat`, `stats.scaled_stat` on "log", "log1m", "logit", "fisher") get per-seed values normal on
their own scale (spread σ plus a measurement noise 0.05·sqrt(100/n)) and are called as the claims call them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mechopd.core.options import option
from mechopd.core.stats import CI, floored_t, scaled_stat

R_DISC = 0.4  # paired difference: half the share of discordant items (so d_k ∈ [−0.8, 0.8])
QUANTITIES = ("prop0", "prop50", "diff", "ratio")
SCALED = ("linear", "log", "log1m", "logit", "fisher")
CENTRE = {"prop0": 0.05, "prop50": 0.5, "diff": 0.0, "ratio": 1.0}
RANGE = {"prop0": (0.0, 1.0), "prop50": (0.0, 1.0), "diff": (-2 * R_DISC, 2 * R_DISC)}
CAP = 0.5  # near a bound the seed spread is at most CAP × the distance to it
MEASURE_SD = 0.05  # seed-level quantities: measurement noise at 100 items
# boundary rules: (name, quantity or scale, op, bar); the rule "holds" when the whole interval passes the bar
RULES = (
    ("non-inferiority A − B ≥ −0.05", "diff", ">=", -0.05),
    ("Harm ≥ 0.10 (OPD degrades)", "prop", ">=", 0.10),
    ("Acc_x − Acc_xc ≥ 0.02 (OPD degrades)", "diff", ">=", 0.02),
    ("Acc_xc − Acc_x ≥ 0.2 (base uses the context)", "diff", ">=", 0.2),
    ("Harm_NCA − 0.5 Harm_OPD ≤ 0", "diff", "<=", 0.0),
    ("Harm_NCA − Harm_OPD < 0", "diff", "<", 0.0),
    ("KL_NCA / KL_OPD < 1 (lens, cosine order)", "ratio", "<", 1.0),
    ("norm ratio ≥ 1.5 (shallow, q/k: concentrated)", "log", ">=", 1.5),
    ("|cos(∇OPD, ∇NCA)| ≤ 0.1", "logit", "<=", 0.1),
    ("NCA / base distance ≤ 0.064 (NCA's cosine)", "ratio", "<=", 0.064),
    ("cosine ≥ 0.997 (log(1 − c) scale)", "log1m", ">=", 0.997),
    ("spread difference > 0 (teachability)", "linear", ">", 0.0),
)


@dataclass(frozen=True)
class Grid:
    """The simulated settings (issue #44: the demo has 3 seeds × 200 items, OPD Harm 0.345, between-seed SD 0.155)."""

    seeds: tuple[int, ...] = option((2, 3, 5, 8), help="training seeds per replication")
    spreads: tuple[float, ...] = option((0.0, 0.05, 0.15, 0.3), help="between-seed SD of the true effect")
    items: tuple[int, ...] = option((100, 400), help="items per seed")
    reps: int = option(2000, help="replications per cell")
    seed: int = option(0, help="random seed of the simulation")


def _phi(x: float) -> float:
    return math.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def _cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def clipped_mean(m: float, s: float, lo: float, hi: float) -> float:
    """E[clip(X, lo, hi)] for X ~ N(m, s²): lo·Φ(α) + hi·(1 − Φ(β)) + m·(Φ(β) − Φ(α)) + s·(φ(α) − φ(β)),
    α = (lo − m)/s, β = (hi − m)/s."""
    if s == 0:
        return min(max(m, lo), hi)
    a, b = (lo - m) / s, (hi - m) / s
    return lo * _cdf(a) + hi * (1 - _cdf(b)) + m * (_cdf(b) - _cdf(a)) + s * (_phi(a) - _phi(b))


def centre_for(theta: float, s: float, lo: float, hi: float) -> float:
    """The centre m whose clipped normal has mean θ (bisection; `clipped_mean` increases in m)."""
    a, b = lo - 10 * s - 1, hi + 10 * s + 1
    for _ in range(100):
        mid = (a + b) / 2
        a, b = (mid, b) if clipped_mean(mid, s, lo, hi) < theta else (a, mid)
    return (a + b) / 2


def spread_of(quantity: str, theta: float, sd: float) -> float:
    """The seed spread used: σ, capped near a bound of a bounded quantity (`CAP`)."""
    if quantity not in RANGE:
        return sd
    lo, hi = RANGE[quantity]
    return min(sd, CAP * min(theta - lo, hi - theta)) if quantity.startswith("prop") else sd


def draw(
    quantity: str, theta: float, s: int, sd: float, n: int, reps: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(v, w)`` ``[reps, s]``: per-seed statistics and their item-level variances, true mean θ (module docstring)."""
    if quantity == "ratio":
        log_rho = math.log(theta) + sd * rng.standard_normal((reps, s))
        a = rng.gamma(4.0, 0.25, (reps, s, n))
        b = rng.gamma(4.0, 0.25, (reps, s, n)) / np.exp(log_rho)[..., None]
        ma, mb = a.mean(-1), b.mean(-1)
        v = ma / mb
        cov = ((a - ma[..., None]) * (b - mb[..., None])).sum(-1) / (n - 1)
        rel = a.var(-1, ddof=1) / ma**2 + b.var(-1, ddof=1) / mb**2 - 2 * cov / (ma * mb)
        return np.log(v), rel / n
    lo, hi = RANGE[quantity]
    sigma = spread_of(quantity, theta, sd)
    eff = np.clip(centre_for(theta, sigma, lo, hi) + sigma * rng.standard_normal((reps, s)), lo, hi)
    if quantity.startswith("prop"):
        v = rng.binomial(n, eff) / n
        return v, v * (1 - v) / n
    pvals = np.stack([R_DISC + eff / 2, R_DISC - eff / 2, 1 - 2 * R_DISC + 0 * eff], -1)
    counts = rng.multinomial(n, pvals)
    v = (counts[..., 0] - counts[..., 1]) / n
    return v, ((counts[..., 0] + counts[..., 1]) / n - v**2) / n


def item_interval(quantity: str, v: np.ndarray, w: np.ndarray, ci: float = CI) -> tuple[np.ndarray, np.ndarray]:
    """The claims' interval of an item-level quantity (`floored_t`, proportions clipped to [0, 1]; a ratio's made on
    the log scale and mapped back)."""
    if quantity == "ratio":
        low, high = floored_t(v, w, ci)
        return np.exp(low), np.exp(high)
    return floored_t(v, w, ci, (0.0, 1.0) if quantity.startswith("prop") else None)


def _to(scale: str, x: float) -> float:
    return {"log": math.log, "log1m": lambda y: math.log(1 - y), "logit": lambda y: math.log(y / (1 - y))}.get(
        scale, math.atanh if scale == "fisher" else (lambda y: y)
    )(x)


def _back(scale: str, z: np.ndarray) -> np.ndarray:
    if scale == "log":
        return np.exp(z)
    if scale == "log1m":
        return 1 - np.exp(z)
    if scale == "logit":
        return 1 / (1 + np.exp(-z))
    return np.tanh(z) if scale == "fisher" else z


SCALE_TRUTH = {"linear": 0.0, "log": 1.0, "log1m": 0.997, "logit": 0.1, "fisher": 0.5}


def scaled_intervals(
    scale: str, theta: float, s: int, sd: float, n: int, reps: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``low``, ``high`` ``[reps]`` of `stats.scaled_stat` (linear: `seed_stat`) on per-seed values normal on the
    scale around the transformed θ (spread σ plus measurement noise), called once per replication."""
    noise = math.sqrt(sd**2 + MEASURE_SD**2 * 100 / n)
    z = _to(scale, theta) + noise * rng.standard_normal((reps, s))
    vals = _back(scale, z)
    out = np.empty((2, reps))
    for r in range(reps):
        st = scaled_stat(list(vals[r]), scale)
        out[:, r] = (st["low"], st["high"]) if st["low"] is not None else (np.nan, np.nan)
    return out[0], out[1]


def intervals_for(
    kind: str, theta: float, s: int, sd: float, n: int, reps: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The interval of one replication set for a quantity (`QUANTITIES`) or a seed-level scale (`SCALED`)."""
    if kind in SCALED:
        return scaled_intervals(kind, theta, s, sd, n, reps, rng)
    v, w = draw(kind, theta, s, sd, n, reps, rng)
    return item_interval(kind, v, w)


def coverage(kind: str, s: int, sd: float, n: int, reps: int, rng: np.random.Generator) -> float:
    """Share of replications whose interval holds the true mean (tolerance 1e-9)."""
    theta = SCALE_TRUTH[kind] if kind in SCALED else CENTRE[kind]
    low, high = intervals_for(kind, theta, s, sd, n, reps, rng)
    return float(np.mean((low <= theta + 1e-9) & (theta <= high + 1e-9)))


def passes(low: np.ndarray, high: np.ndarray, op: str, bar: float) -> np.ndarray:
    """The interval rule's "holds" (`verdicts.decide`): both ends on the passing side of ``bar`` (tolerance 1e-9)."""
    checks: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        ">=": lambda x: x >= bar - 1e-9,
        ">": lambda x: x > bar + 1e-9,
        "<=": lambda x: x <= bar + 1e-9,
        "<": lambda x: x < bar - 1e-9,
    }
    return checks[op](low) & checks[op](high)


def boundary_error(rule: tuple[str, str, str, float], s: int, sd: float, n: int, reps: int, rng) -> float:
    """Share of replications in which ``rule`` "holds" with the true value exactly on its bar."""
    _, kind, op, bar = rule
    kind = "prop0" if kind == "prop" else kind
    low, high = intervals_for(kind, bar, s, sd, n, reps, rng)
    return float(np.mean(passes(low, high, op, bar)))


def mc_error(p: float, reps: int) -> float:
    """Monte Carlo standard error of a simulated share: sqrt(p (1 − p) / R)."""
    return math.sqrt(max(p * (1 - p), 0.25 / reps) / reps)


def run_grid(grid: Grid) -> tuple[dict[tuple, float], dict[tuple, float]]:
    """``(coverage, errors)``: coverage[(kind, seeds, spread, items)] for every quantity and scale, and
    errors[(rule name, seeds, spread, items)] for every boundary rule (`RULES`), on the grid."""
    rng = np.random.default_rng(grid.seed)
    cov: dict[tuple, float] = {}
    err: dict[tuple, float] = {}
    for s in grid.seeds:
        for sd in grid.spreads:
            for n in grid.items:
                for kind in QUANTITIES + SCALED:
                    cov[(kind, s, sd, n)] = coverage(kind, s, sd, n, grid.reps, rng)
                for rule in RULES:
                    err[(rule[0], s, sd, n)] = boundary_error(rule, s, sd, n, grid.reps, rng)
    return cov, err
