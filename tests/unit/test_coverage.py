"""The claims' intervals keep their promise on a small version of bench/coverage.py (issue #44): coverage at nominal
95 % at least 93 % and every rule's false "holds" at its boundary at most 5 %, each within its Monte Carlo error; and
the seeds × items interval (`stats.floored_t` / `hier_bootstrap`) is the t-interval over seeds with the item floor."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechopd.core.stats import floored_t, hier_bootstrap, t_quantile
from mechopd.testing.coverage import QUANTITIES, RULES, SCALED, Grid, centre_for, clipped_mean, mc_error, run_grid

SMALL = Grid(seeds=(3,), spreads=(0.0, 0.155), items=(200,), reps=1500)


def test_small_grid_covers_and_boundary_errors_stay_at_five_percent() -> None:
    cov, err = run_grid(SMALL)
    assert len(cov) == len(QUANTITIES + SCALED) * 2 and len(err) == len(RULES) * 2
    for key, p in cov.items():
        assert p + 2 * mc_error(p, SMALL.reps) >= 0.93, (key, p)
    for key, p in err.items():
        assert p - 2 * mc_error(p, SMALL.reps) <= 0.05, (key, p)


def test_a_percentile_bootstrap_over_three_seeds_would_fail_the_same_check() -> None:
    """The check can fail: the interval the claims used before (percentiles of resampled seed means) undercovers."""
    rng = np.random.default_rng(0)
    p = np.clip(0.345 + 0.155 * rng.standard_normal((1500, 3)), 0, 1)
    v = rng.binomial(200, p) / 200
    means = v[:, rng.integers(0, 3, (400, 3))].mean(-1)  # [reps, 400] resampled means over seeds
    low, high = np.quantile(means, [0.025, 0.975], axis=1)
    truth = clipped_mean(0.345, 0.155, 0.0, 1.0)
    share = float(np.mean((low <= truth) & (truth <= high)))
    assert share + 2 * mc_error(share, 1500) < 0.93


def test_floored_t_is_the_t_interval_unless_the_seeds_agree_more_than_their_items_allow() -> None:
    v, w = np.array([0.2, 0.4, 0.9]), np.full(3, 1e-4)
    low, high = floored_t(v, w)
    sd = np.std(v, ddof=1)
    assert high - v.mean() == pytest.approx(t_quantile(0.975, 2) * sd / math.sqrt(3))
    tied_low, tied_high = floored_t(np.full(3, 0.5), np.full(3, 0.01), bounds=(0.0, 1.0))
    assert tied_high - 0.5 == pytest.approx(t_quantile(0.975, 2) * 0.1 / math.sqrt(3)) and tied_low > 0
    assert floored_t(np.array([0.9, 0.99]), np.zeros(2), bounds=(0.0, 1.0))[1] == 1.0
    with pytest.raises(ValueError):
        floored_t(np.array([0.5]), np.array([0.1]))


def test_hier_bootstrap_uses_each_seeds_item_variance_as_the_floor() -> None:
    rng = np.random.default_rng(1)
    seeds = [(rng.random(200) < 0.5,) for _ in range(3)]
    fn = lambda a: a[0].mean(1)  # noqa: E731
    st = hier_bootstrap(seeds, fn, bounds=(0.0, 1.0))
    vals = np.array(st["values"])
    w = vals * (1 - vals) / 200  # what the item bootstrap estimates
    low, high = floored_t(vals, w)
    assert st["low"] == pytest.approx(float(low), abs=0.02) and st["high"] == pytest.approx(float(high), abs=0.02)
    ratio = hier_bootstrap([(rng.gamma(4, 0.25, 100),) for _ in range(3)], fn, scale="log")
    assert ratio["mean"] == pytest.approx(float(np.exp(np.mean(np.log(ratio["values"])))))
    assert 0 < ratio["low"] < ratio["mean"] < ratio["high"]


def test_the_boundary_centre_gives_the_clipped_mean_asked_for() -> None:
    m = centre_for(0.2, 0.3, -0.8, 0.8)
    assert (
        clipped_mean(m, 0.3, -0.8, 0.8) == pytest.approx(0.2, abs=1e-9) and m > 0.2
    )  # the nearer bound (0.8) pulls the mean down
    z = np.clip(0.1 + 0.3 * np.random.default_rng(2).standard_normal(400_000), 0, 1)
    assert clipped_mean(0.1, 0.3, 0.0, 1.0) == pytest.approx(float(z.mean()), abs=2e-3)


def test_design_cells_cover_at_zero_counts_few_right_items_and_shared_items() -> None:
    """The real studies' designs through hier_bootstrap (#53), a few replications each: the rare event's seeds at zero
    counts get the exact bound (never a point), Harm on 5 items and shared items (target: these items) cover."""
    import numpy as np

    from mechopd.testing.coverage_design import DESIGN_CELLS, cell_coverage

    rng = np.random.default_rng(0)
    cells = {c.name: c for c in DESIGN_CELLS}
    for name in (
        "rare event 0.02 on 10 items, 3 seeds",
        "Harm on 5 right items, 6 seeds",
        "shared 54 items (these items), 6 seeds",
    ):
        r = cell_coverage(cells[name], 80, rng)
        assert r["coverage"] >= 0.9 and r["width"] > 0 and max(r["err_ge"], r["err_le"]) <= 0.06, (name, r)


def test_hier_bootstrap_resamples_whole_clusters() -> None:
    """Items in clusters of 8 that share their outcome (paraphrases of one fact): the item resample sees 48
    independent items, the cluster resample 6 facts, so its item variance is ~8× larger; clusters of one are the item
    resample bit for bit; unequal clusters (a varying resample size) work; a misaligned cluster array is refused."""
    fact = np.array([1, 0, 0, 1, 0, 0], bool)
    seeds = [(np.repeat(fact, 8),), (np.repeat(np.roll(fact, 1), 8),)]
    fn = lambda a: a[0].mean(1)  # noqa: E731
    ids = [np.repeat(np.arange(6), 8)] * 2
    items, facts = (
        hier_bootstrap(seeds, fn, bounds=(0.0, 1.0)),
        hier_bootstrap(seeds, fn, bounds=(0.0, 1.0), clusters=ids),
    )
    assert 5 < facts["var_item"] / items["var_item"] < 12
    single = hier_bootstrap(seeds, fn, bounds=(0.0, 1.0), clusters=[np.arange(48)] * 2)
    assert (single["low"], single["high"], single["var_item"]) == (items["low"], items["high"], items["var_item"])
    uneven = hier_bootstrap(seeds, fn, clusters=[np.r_[np.zeros(5), np.arange(43) + 1]] * 2)
    assert uneven["var_item"] > 0 and uneven["low"] is not None
    with pytest.raises(ValueError):
        hier_bootstrap(seeds, fn, clusters=[np.arange(47)] * 2)


def test_one_seed_of_few_facts_covers_only_when_its_facts_are_resampled() -> None:
    """The design cell where the within-seed unit decides (#53): one seed of 6 facts × 8 paraphrases, tau 1.5. The
    item resample under-covers this seed's model on the population of facts; the cluster resample covers."""
    from mechopd.testing.coverage_design import DESIGN_CELLS, cell_coverage

    cell = {c.name: c for c in DESIGN_CELLS}["fact clusters 6 × 8, tau 1.5, 1 seed"]
    r = cell_coverage(cell, 120, np.random.default_rng(3))
    assert r["coverage_items"] < 0.85 and r["coverage"] >= 0.9, r


def test_an_exact_bound_counts_a_facts_paraphrases_as_one_unit() -> None:
    """0 events on 48 items that are 6 facts × 8 paraphrases: the exact bound is "0 of 6" (upper 1 − 0.025^(1/6)),
    not "0 of 48"; without clusters it stays "0 of 48"."""
    seeds = [(np.zeros(48, bool),)]
    kw = dict(bounds=(0.0, 1.0), trials=lambda a: np.full(a[0].shape[0], a[0].shape[1], np.float64))
    plain = hier_bootstrap(seeds, lambda a: a[0].mean(1), **kw)
    facts = hier_bootstrap(seeds, lambda a: a[0].mean(1), clusters=[np.repeat(np.arange(6), 8)], **kw)
    assert plain["exact"] == "0 of 48" and facts["exact"] == "0 of 6"
    assert facts["high"] == pytest.approx(1 - 0.025 ** (1 / 6))
