"""Coverage of every interval type the claims use, and the false-"holds" rate of every threshold and
non-inferiority rule at its boundary, by simulating the demo's structure (issue #44; `mechopd.testing.coverage`).

Grid (defaults): seeds 2, 3, 5, 8; between-seed SD 0, 0.05, 0.15, 0.3; items 100 and 400; quantities: a proportion
near 0 (0.05) and near 0.5, a paired difference, a ratio of per-token means (the item-level interval,
`stats.hier_bootstrap` = `stats.floored_t` on the seeds' values and item variances) and the seed-level t-intervals
(`stats.seed_stat`, `stats.scaled_stat` on log, log1m, logit, Fisher z). Then the demo's own setting through the real
`hier_bootstrap` (3 seeds × 200 items, OPD Harm 0.345, between-seed SD 0.155) next to its grid counterpart.

Prints, per interval type, the coverage at nominal 95 % on every cell and its minimum; per rule, the boundary error
rate on every cell and its maximum; then the real studies' design cells through `hier_bootstrap` itself
(`mechopd.testing.coverage_design`: Harm on 5–15 right items, a rare event with seeds at zero counts, fact clusters
fresh per seed, one seed of few facts with many paraphrases (where the within-seed unit decides: the fact cluster is
resampled, the item resample printed beside it), the same items shared across seeds with "these items" as the
target); PASS when every coverage is
≥ 0.93 and every boundary error ≤ 0.05 (exit 1 on a FAIL). Monte Carlo error of a share p over R replications: sqrt(p(1 − p)/R) (R = 2000: ±0.005 at 0.95).

    python bench/coverage.py [--reps 2000] [--seeds 2,3,5,8] [--spreads 0,0.05,0.15,0.3] [--items 100,400]
                             [--design-reps 400] [--design-only]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from mechopd.core.stats import hier_bootstrap
from mechopd.testing.coverage import QUANTITIES, RULES, SCALED, Grid, clipped_mean, mc_error, run_grid
from mechopd.testing.coverage_design import DESIGN_CELLS, cell_coverage

COVER_MIN, ERROR_MAX = 0.93, 0.05
DEMO = {"seeds": 3, "items": 200, "harm": 0.345, "sd": 0.155}


def _table(title: str, keys: list[str], data: dict, grid: Grid, worst) -> list[float]:
    """One block: a row per key × seeds, a column per spread × items; returns each key's worst value."""
    cols = [(sd, n) for sd in grid.spreads for n in grid.items]
    print(f"\n{title}\n{'':44s}" + "".join(f"{f'σ={sd:g},n={n}':>13s}" for sd, n in cols))
    out = []
    for key in keys:
        for s in grid.seeds:
            row = [data[(key, s, sd, n)] for sd, n in cols]
            print(f"{key[:36]:36s} S={s:<4d}" + "".join(f"{v:13.3f}" for v in row))
        out.append(worst(data[(key, s, sd, n)] for s in grid.seeds for sd, n in cols))
    return out


def demo_check(reps: int, rng: np.random.Generator) -> tuple[float, float]:
    """Coverage at the demo's setting through `hier_bootstrap` itself (per-seed item arrays, 1000 item resamples)."""
    s, n, mu, sd = DEMO["seeds"], DEMO["items"], DEMO["harm"], DEMO["sd"]
    truth = clipped_mean(mu, sd, 0.0, 1.0)
    hits = 0
    for _ in range(reps):
        p = np.clip(mu + sd * rng.standard_normal(s), 0, 1)
        seeds = [(rng.random(n) < pk,) for pk in p]
        st = hier_bootstrap(seeds, lambda a: a[0].mean(1), seed=int(rng.integers(1 << 30)), bounds=(0.0, 1.0))
        hits += st["low"] - 1e-9 <= truth <= st["high"] + 1e-9
    return hits / reps, truth


def design_check(reps: int, rng: np.random.Generator) -> bool:
    """The real studies' design cells (`coverage_design.DESIGN_CELLS`): coverage of the cell's target ≥ COVER_MIN and
    each one-sided false "holds" at the bar ≤ ERROR_MAX; shared items also print their population coverage (not
    claimed: such a design speaks for its items). "coverage" resamples fact clusters within a seed where the cell has
    them (what the claims do when the evaluation saved clusters); "by item" is the item resample on the same
    replications, printed as the reference (not judged)."""
    print(
        f"\nDesign cells through hier_bootstrap itself ({reps} replications each; target: the population, or these items)"
    )
    print(f"{'':50s}{'coverage':>10s}{'by item':>9s}{'population':>12s}{'≥ bar':>8s}{'≤ bar':>8s}{'width':>8s}")
    ok = True
    for cell in DESIGN_CELLS:
        r = cell_coverage(cell, reps, rng)
        good = r["coverage"] >= COVER_MIN and max(r["err_ge"], r["err_le"]) <= ERROR_MAX
        ok &= good
        print(
            f"  {'PASS' if good else 'FAIL'}  {cell.name:42s}{r['coverage']:10.3f}{r['coverage_items']:9.3f}"
            f"{r['population']:12.3f}"
            f"{r['err_ge']:8.3f}{r['err_le']:8.3f}{r['width']:8.3f}"
        )
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seeds", default="2,3,5,8")
    ap.add_argument("--spreads", default="0,0.05,0.15,0.3")
    ap.add_argument("--items", default="100,400")
    ap.add_argument("--demo-reps", type=int, default=400, help="replications of the demo check (real hier_bootstrap)")
    ap.add_argument("--design-reps", type=int, default=400, help="replications of each design cell (hier_bootstrap)")
    ap.add_argument("--design-only", action="store_true", help="only the design cells (the #53 designs)")
    a = ap.parse_args()
    if a.design_only:
        t0 = time.perf_counter()
        ok = design_check(a.design_reps, np.random.default_rng(Grid().seed + 2))
        print(f"  {'PASS' if ok else 'FAIL'}  design cells ({time.perf_counter() - t0:.0f} s)")
        return 0 if ok else 1
    grid = Grid(
        seeds=tuple(int(x) for x in a.seeds.split(",")),
        spreads=tuple(float(x) for x in a.spreads.split(",")),
        items=tuple(int(x) for x in a.items.split(",")),
        reps=a.reps,
    )
    t0 = time.perf_counter()
    cov, err = run_grid(grid)
    kinds = list(QUANTITIES + SCALED)
    low = _table("Coverage at nominal 95 % (interval type × seeds; columns: spread σ, items n)", kinds, cov, grid, min)
    high = _table("False 'holds' at the boundary (true value on the bar)", [r[0] for r in RULES], err, grid, max)
    rng = np.random.default_rng(grid.seed + 1)
    demo, truth = demo_check(a.demo_reps, rng)
    print(
        f"\nDemo setting through hier_bootstrap itself (S=3, n=200, Harm {DEMO['harm']}, SD {DEMO['sd']}; θ={truth:.4f})"
    )
    print(f"  coverage {demo:.3f} ± {mc_error(demo, a.demo_reps):.3f} over {a.demo_reps} replications")
    print(f"\nSummary (R={grid.reps} per cell, Monte Carlo error ±{mc_error(0.95, grid.reps):.3f} at 0.95)")
    ok = demo >= COVER_MIN - 2 * mc_error(demo, a.demo_reps)
    for kind, v in zip(kinds, low):
        print(f"  {'PASS' if v >= COVER_MIN else 'FAIL'}  min coverage {v:.3f}  {kind}")
        ok &= v >= COVER_MIN
    for rule, v in zip(RULES, high):
        print(f"  {'PASS' if v <= ERROR_MAX else 'FAIL'}  max boundary error {v:.3f}  {rule[0]}")
        ok &= v <= ERROR_MAX
    ok &= design_check(a.design_reps, np.random.default_rng(grid.seed + 2))
    print(f"  {'PASS' if ok else 'FAIL'}  overall ({time.perf_counter() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
