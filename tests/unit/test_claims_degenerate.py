"""Claims that know when they cannot speak (#53): no zero-width interval anywhere — a proportion at 0 or n events of n
gets its exact (Clopper–Pearson) bound, a paired difference with no item that differs its exact bound on the
discordant share, and a statistic with no informative unit is "not measurable (design: …)", never a point; every
fragile or failing part prints its MDE. Each test drives one degenerate state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mechopd.core.stats import exact_bound, fmt_stat, hier_bootstrap, mde, seed_stat
from mechopd.report import claims
from mechopd.report.verdicts import FAILS, NA_DESIGN, NA_FRAGILE, decide
from tests.unit.claim_runs import seed_runs


def _prop(*per_seed: np.ndarray) -> dict:
    return hier_bootstrap(
        [(x,) for x in per_seed],
        lambda a: a[0].mean(1),
        bounds=(0.0, 1.0),
        trials=lambda a: np.full(a[0].shape[0], a[0].shape[1], np.float64),
    )


def test_zero_events_of_n_get_the_exact_upper_bound_not_a_point() -> None:
    st = _prop(np.zeros(40, bool), np.zeros(60, bool))
    assert st["low"] == 0.0 and st["high"] == pytest.approx(1 - 0.025 ** (1 / 100))  # ≈ 3.7 / 100
    assert st["exact"] == "0 of 100" and "(0 of 100, exact)" in fmt_stat(st)


def test_n_events_of_n_get_the_exact_lower_bound() -> None:
    st = _prop(np.ones(10, bool), np.ones(10, bool), np.ones(10, bool))
    assert st["high"] == 1.0 and st["low"] == pytest.approx(0.025 ** (1 / 30)) and st["low"] < 1.0


def test_the_exact_bound_is_the_clopper_pearson_edge_and_refuses_an_inner_count() -> None:
    assert exact_bound(0, 1) == (0.0, 0.975) and exact_bound(3, 3)[0] == pytest.approx(0.025 ** (1 / 3))
    with pytest.raises(ValueError):
        exact_bound(1, 3)


def test_a_paired_difference_where_no_item_differs_gets_the_discordant_bound() -> None:
    same = np.arange(50) % 2 == 0
    st = hier_bootstrap(
        [(same, same), (same, same)],
        lambda a: a[0].mean(1) - a[1].mean(1),
        bounds=(-1.0, 1.0),
        trials=lambda a: np.full(a[0].shape[0], a[0].shape[1], np.float64),
    )
    u = 1 - 0.025 ** (1 / 100)
    assert (st["low"], st["high"]) == pytest.approx((-u, u)) and "0 of 100 items differ" in st["exact"]


def test_a_statistic_no_item_can_move_is_not_measurable_never_a_point() -> None:
    """Every item's margin 0 in every seed (no reverted group changes any probe item): no interval at all."""
    zero = np.zeros(8)
    st = hier_bootstrap([(zero,), (zero,), (zero,)], lambda a: a[0].mean(1))
    assert st["low"] is None and st["high"] is None and st["degenerate"]
    d = decide(st, 0.0, ">", "q+k − vo")
    assert d.verdict.startswith(NA_DESIGN) and "q+k − vo" in d.verdict
    assert "[" not in fmt_stat(st) and "no informative unit" in fmt_stat(st)


def test_seeds_that_do_not_vary_make_no_interval() -> None:
    st = seed_stat([1.13, 1.13, 1.13])
    assert st["low"] is None and st["degenerate"] and decide(st, 1.5, ">=").verdict.startswith(NA_DESIGN)


def test_a_fragile_or_failing_part_prints_its_mde_and_the_design_that_would_decide_it() -> None:
    rng = np.random.default_rng(0)
    seeds = [(rng.random(100) < p,) for p in (0.12, 0.08, 0.10)]
    st = hier_bootstrap(seeds, lambda a: a[0].mean(1), bounds=(0.0, 1.0))
    d = decide(st, 0.1, ">=", "Harm")
    assert d.verdict == NA_FRAGILE and f"MDE {mde(st):.3g}" in d.note and "seeds × " in d.note
    far = decide(st, 0.5, ">=", "Harm")
    assert far.verdict == FAILS and "MDE" in far.note


def test_no_row_of_a_study_prints_a_zero_width_interval(tmp_path: Path) -> None:
    """NCA Harm 0 on every item, NCA + follow right on every item: bounds, never [x, x]."""
    import re

    runs = seed_runs(tmp_path, {}, {}, {"acc_x": {"nca_follow": 1.0}, "acc_xc": {"nca_follow": 1.0}})
    text = claims.claims_markdown(claims.evaluate_claims(runs))
    pairs = re.findall(r"\[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]", text)
    assert pairs and all(a != b for a, b in pairs)


def test_the_report_states_what_its_intervals_speak_for(tmp_path: Path) -> None:
    """The synthetic seeds share their items (u000…): the intervals speak for these items, not the population."""
    from mechopd.runset import runsets

    line = claims.target_line(runsets(seed_runs(tmp_path, {}, {})))
    assert line.startswith("Target: these items — 200 items are shared by every seed")


def test_a_runs_own_tables_print_no_point_interval() -> None:
    """The per-run removability summary (`removability.summarize`) and following entry: every item wrong, every
    length equal: the exact bound on the proportions, no interval for Δlen."""
    from mechopd.evaluation.following import _entry
    from mechopd.evaluation.removability import summarize

    recs = [
        {"uid": f"u{i}", "sample": 0, "correct_x": False, "correct_xc": False, "len_x": 5, "len_xc": 5}
        for i in range(24)
    ]
    s = summarize(recs, n_boot=50)
    assert (s["acc_x"]["low"], s["acc_x"]["high"]) == pytest.approx(exact_bound(0, 24))
    assert s["delta_len"]["low"] is None and s["harm"]["value"] is None
    e = _entry(np.ones((24, 3)), 50, 0, 0.95)
    assert e["high"] == 1.0 and e["low"] == pytest.approx(0.025 ** (1 / 24))
