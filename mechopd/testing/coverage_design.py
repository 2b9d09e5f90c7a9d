"""Coverage of the claims' item-level interval on the real studies' designs (#53), through `stats.hier_bootstrap`
itself (item resamples, the exact bound at zero counts), not the grid's closed-form stand-in (`testing.coverage`).

Cells (`DESIGN_CELLS`), each a proportion over a seed's items with seed effects normal on the logit scale (SD
``spread``) around logit(p):

* ``harm``: Harm on n = 5, 10 or 15 items right without the context per seed (the real study's 7–13), p = 0.2;
* ``zero``: a rare event, p = 0.02 on 10 items: most seeds count 0, some seeds all 0 (the exact bound's case);
* ``clusters``: fresh facts per seed (the fact-pool study: seed × handbook), 12 facts × 4 paraphrases, a fact's
  paraphrases sharing a logit effect (SD ``tau``); target: the population of facts;
* ``seed1``: one seed (a one-seed study, the default demo's shape) of few facts with many paraphrases and a large
  ``tau``: its interval is the item level alone, so it is where the within-seed resampling unit decides coverage;
  target: THIS seed's model on the population of facts (E over facts for the drawn seed effect);
* ``shared``: the same 54 items on every seed (the older real-model study), item logits drawn once (SD ``tau``);
  target: THESE items (the mean over them of each item's expected outcome over seeds) — such a design speaks for its
  items only; its population coverage is printed beside it, not claimed.

Each replication is resampled both ways within a seed: by item (``coverage_items``, the reference) and by fact
cluster (``coverage``, what `hier_bootstrap` does when the evaluation saved each item's cluster); items without a
cluster (``harm``, ``zero``, ``shared``) are their own clusters, where the two coincide bit for bit.

The truth of each cell is computed, not assumed: the population mean by a large Monte Carlo draw, these items' mean
by Gauss–Hermite quadrature over the seed effect. Boundary error: the share of replications whose interval says
"holds" for ``p ≥ bar`` (and for ``p ≤ bar``) with the truth exactly on the bar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mechopd.core.stats import hier_bootstrap


@dataclass(frozen=True)
class Cell:
    name: str
    kind: str  # harm, zero, clusters, seed1, shared
    seeds: int
    items: int  # items per seed (clusters: facts × paraphrases)
    p: float
    spread: float = 0.3  # seed SD on the logit scale
    tau: float = 0.0  # fact / item SD on the logit scale
    per_fact: int = 1


DESIGN_CELLS = (
    *(Cell(f"Harm on {n} right items, {s} seeds", "harm", s, n, 0.2) for n in (5, 10, 15) for s in (3, 6)),
    *(Cell(f"rare event 0.02 on 10 items, {s} seeds", "zero", s, 10, 0.02) for s in (3, 6)),
    *(
        Cell(f"fact clusters 12 × 4, fresh per seed, {s} seeds", "clusters", s, 48, 0.3, 0.3, 1.0, 4)
        for s in (3, 6, 10)
    ),
    *(Cell(f"shared 54 items (these items), {s} seeds", "shared", s, 54, 0.3, 0.3, 1.5) for s in (3, 6, 10)),
    *(Cell(f"fact clusters {f} × {48 // f}, tau 1.5, 1 seed", "seed1", 1, 48, 0.3, 0.3, 1.5, 48 // f) for f in (6, 12)),
)
_GH = np.polynomial.hermite_e.hermegauss(40)  # nodes and weights for E[f(Z)], Z ~ N(0, 1)


def _sig(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def expected(logits: np.ndarray, spread: float) -> np.ndarray:
    """E[sigmoid(a + spread · Z)] per logit a (Gauss–Hermite, 40 nodes)."""
    z, w = _GH
    return (_sig(np.asarray(logits)[..., None] + spread * z) * w).sum(-1) / w.sum()


def population_truth(cell: Cell, rng: np.random.Generator, draws: int = 400_000) -> float:
    """E over seeds (and facts) of an item's outcome probability, by Monte Carlo."""
    base = math.log(cell.p / (1 - cell.p))
    return float(expected(base + cell.tau * rng.standard_normal(draws), cell.spread).mean())


def replicate(cell: Cell, rng: np.random.Generator) -> tuple[list[tuple[np.ndarray, ...]], float | None]:
    """One study of the cell: per seed its 0/1 item outcomes, and the truth for these items (shared items) or for
    this seed's model (``seed1``); None: the population truth."""
    base = math.log(cell.p / (1 - cell.p))
    fixed = base + cell.tau * rng.standard_normal(cell.items) if cell.kind == "shared" else None
    seeds: list[tuple[np.ndarray, ...]] = []
    these = None
    for _ in range(cell.seeds):
        e = cell.spread * rng.standard_normal()
        if fixed is not None:
            logit = fixed + e
        else:
            facts = cell.tau * rng.standard_normal(cell.items // cell.per_fact)
            logit = base + e + np.repeat(facts, cell.per_fact)
            if cell.kind == "seed1":
                these = float(expected(np.array(base + e), cell.tau))  # this seed's model, E over facts
        seeds.append((rng.random(cell.items) < _sig(logit),))
    return seeds, (float(expected(fixed, cell.spread).mean()) if fixed is not None else these)


def cluster_ids(cell: Cell) -> np.ndarray | None:
    """Each item's fact (``[items]``) where the cell's items are paraphrases of facts; None otherwise."""
    return np.repeat(np.arange(cell.items // cell.per_fact), cell.per_fact) if cell.per_fact > 1 else None


def _interval(seeds: list[tuple[np.ndarray, ...]], seed: int, clusters: np.ndarray | None) -> tuple[float, float]:
    st = hier_bootstrap(
        seeds,
        lambda a: a[0].mean(1),
        seed=seed,
        bounds=(0.0, 1.0),
        trials=lambda a: np.full(a[0].shape[0], a[0].shape[1], np.float64),
        clusters=None if clusters is None else [clusters] * len(seeds),
    )
    return (st["low"], st["high"]) if st["low"] is not None else (math.nan, math.nan)


def cell_coverage(cell: Cell, reps: int, rng: np.random.Generator) -> dict[str, float]:
    """``coverage`` (of the cell's target, resampling fact clusters within a seed where the cell has them),
    ``coverage_items`` (the same replications resampled by item), ``population`` (shared items: of the population
    mean), ``err_ge`` / ``err_le`` (false "holds" of p ≥ truth / p ≤ truth with the truth on the bar), ``width``
    (mean)."""
    pop = population_truth(cell, rng)
    clusters = cluster_ids(cell)
    hit = hit_items = pop_hit = ge = le = 0
    width = 0.0
    for _ in range(reps):
        seeds, these = replicate(cell, rng)
        truth = pop if these is None else these
        boot = int(rng.integers(1 << 30))
        low, high = _interval(seeds, boot, clusters)
        if clusters is not None:
            il, ih = _interval(seeds, boot, None)
            hit_items += il - 1e-9 <= truth <= ih + 1e-9
        else:
            hit_items += low - 1e-9 <= truth <= high + 1e-9
        hit += low - 1e-9 <= truth <= high + 1e-9
        pop_hit += low - 1e-9 <= pop <= high + 1e-9
        ge += low >= truth + 1e-9  # the whole interval above the true value on the bar: "p ≥ bar" holds wrongly
        le += high <= truth - 1e-9
        width += high - low
    return {
        "coverage": hit / reps,
        "coverage_items": hit_items / reps,
        "population": pop_hit / reps,
        "err_ge": ge / reps,
        "err_le": le / reps,
        "width": width / reps,
        "truth": pop,
    }
