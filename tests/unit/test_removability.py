"""Removability metrics over paired outcomes: hand-computed fixtures, bootstrap vs a slow reference, regimes, tables."""

from __future__ import annotations

import csv
import io
import json
import random
from dataclasses import dataclass

import numpy as np
import pytest

from mechopd.core.errors import ConfigError, DataError
from mechopd.evaluation.removability import (
    METRICS,
    MIN_VALID_RESAMPLES,
    RegimeThresholds,
    classify_regime,
    compare_table,
    resample_blocks,
    summarize,
)


def rec(cx: bool, cxc: bool, lx: float = 100.0, lxc: float = 100.0) -> dict:
    return {"correct_x": cx, "correct_xc": cxc, "len_x": lx, "len_xc": lxc}


def cells(rr: int, rw: int, wr: int, ww: int) -> list[dict]:
    """Records from the 2x2 table: rr right in both, rw right without c only, wr right with c only, ww neither."""
    return [rec(True, True)] * rr + [rec(True, False)] * rw + [rec(False, True)] * wr + [rec(False, False)] * ww


def random_records(n: int, seed: int, p_x: float = 0.7, p_xc: float = 0.6) -> list[dict]:
    r = random.Random(seed)
    return [rec(r.random() < p_x, r.random() < p_xc, r.randint(50, 200), r.randint(60, 260)) for _ in range(n)]


def slow_metrics(rows: list[dict]) -> dict[str, float | None]:
    """Plain-Python reference for one item set (None where undefined)."""
    n = len(rows)
    right_x = [r for r in rows if r["correct_x"]]
    wrong_x = [r for r in rows if not r["correct_x"]]
    mean_lx = sum(r["len_x"] for r in rows) / n
    mean_lxc = sum(r["len_xc"] for r in rows) / n
    return {
        "acc_x": len(right_x) / n,
        "acc_xc": sum(r["correct_xc"] for r in rows) / n,
        "harm": sum(not r["correct_xc"] for r in right_x) / len(right_x) if right_x else None,
        "help": sum(r["correct_xc"] for r in wrong_x) / len(wrong_x) if wrong_x else None,
        "both_correct": sum(r["correct_x"] and r["correct_xc"] for r in rows) / n,
        "delta_len": (mean_lxc - mean_lx) / mean_lx if mean_lx else None,
    }


# ---------------------------------------------------------------------------------------- hand-computed values
def test_hand_computed_fixture():
    records = cells(rr=6, rw=2, wr=1, ww=1)
    for i, r in enumerate(records):  # len_x all 100; len_xc 130 for the first five items -> mean 115
        records[i] = {**r, "len_xc": 130.0 if i < 5 else 100.0}
    s = summarize(records, n_boot=200)
    values = {m: s[m]["value"] for m in METRICS}
    assert values == pytest.approx(
        {"acc_x": 0.8, "acc_xc": 0.7, "harm": 0.25, "help": 0.5, "both_correct": 0.6, "delta_len": 0.15}
    )
    assert (s["n"], s["n_right_x"], s["n_wrong_x"]) == (10, 8, 2)
    json.dumps(s, allow_nan=False)  # JSON-serialisable, NaN-free


def test_no_item_right_without_context():
    s = summarize(cells(rr=0, rw=0, wr=3, ww=7), n_boot=200)
    assert s["harm"] == {"value": None, "low": None, "high": None, "n_boot_valid": 0}
    assert (s["n_right_x"], s["n_wrong_x"]) == (0, 10)
    assert s["acc_x"]["value"] == 0.0 and s["help"]["value"] == pytest.approx(0.3)
    assert s["regime"] == "B" and "undefined" in s["regime_reason"]
    json.dumps(s, allow_nan=False)


def test_all_items_right():
    s = summarize(cells(rr=12, rw=0, wr=0, ww=0), n_boot=200)
    assert s["help"]["value"] is None and s["help"]["low"] is None and s["n_wrong_x"] == 0
    edge = 0.025 ** (1 / 12)  # never a zero-width interval: the exact bound at 0 (12) events of 12 (#53)
    assert s["harm"]["value"] == 0.0 and (s["harm"]["low"], s["harm"]["high"]) == pytest.approx((0.0, 1 - edge))
    for m in ("acc_x", "acc_xc", "both_correct"):
        assert (s[m]["value"], s[m]["low"], s[m]["high"]) == pytest.approx((1.0, edge, 1.0))
    assert s["regime"] == "C"


def test_all_items_wrong():
    s = summarize(cells(rr=0, rw=0, wr=0, ww=9), n_boot=200)
    assert s["harm"]["value"] is None and s["help"]["value"] == 0.0
    assert s["acc_x"]["value"] == s["acc_xc"]["value"] == s["both_correct"]["value"] == 0.0
    assert s["regime"] == "X" and "collapsed" in s["regime_reason"]  # never "views agree"


@pytest.mark.parametrize(
    ("acc_x", "acc_xc", "regime"),
    [(0.05, 0.05, "X"), (0.0, 0.04, "X"), (0.06, 0.05, "C"), (0.0, 1.0, "B"), (1.0, 0.0, "A")],
)
def test_collapsed_is_its_own_regime(acc_x, acc_xc, regime):
    from mechopd.evaluation.removability import classify_regime

    assert classify_regime(acc_x, acc_xc, None)[0] == regime


def test_zero_mean_length_leaves_delta_len_undefined():
    s = summarize([rec(True, True, 0, 5), rec(False, True, 0, 7)], n_boot=50)
    assert s["delta_len"] == {"value": None, "low": None, "high": None, "n_boot_valid": 0}


def test_records_may_be_objects():
    @dataclass
    class Outcome:
        correct_x: bool
        correct_xc: bool
        len_x: float
        len_xc: float

    dicts = random_records(30, seed=4)
    objects = [Outcome(**d) for d in dicts]
    assert summarize(objects, n_boot=100) == summarize(dicts, n_boot=100)


# ------------------------------------------------------------------------------------------------- bootstrap
def test_bootstrap_matches_slow_reference_on_the_same_resamples():
    records = random_records(37, seed=1)
    s = summarize(records, n_boot=300, seed=5, ci=0.9)
    per_metric: dict[str, list[float]] = {m: [] for m in METRICS}
    for block in resample_blocks(len(records), 300, seed=5):
        for row in block:
            for m, v in slow_metrics([records[i] for i in row]).items():
                if v is not None:
                    per_metric[m].append(v)
    reference = slow_metrics(records)
    for m in METRICS:
        lo, hi = np.quantile(per_metric[m], [0.05, 0.95])
        assert s[m]["value"] == pytest.approx(reference[m])
        assert (s[m]["low"], s[m]["high"]) == pytest.approx((lo, hi))
        assert s[m]["n_boot_valid"] == len(per_metric[m])


def test_resamples_with_empty_conditioning_set_are_skipped():
    records = cells(rr=1, rw=0, wr=0, ww=19)  # one item right without c: ~36 % of resamples miss it
    s = summarize(records, n_boot=400, seed=2)
    missing = sum(0 not in set(row) for block in resample_blocks(20, 400, seed=2) for row in block)
    assert 0 < missing < 400
    assert s["harm"]["n_boot_valid"] == 400 - missing
    assert s["acc_x"]["n_boot_valid"] == 400


def test_too_few_valid_resamples_give_no_interval():
    records = random_records(25, seed=3)
    few = summarize(records, n_boot=MIN_VALID_RESAMPLES - 1)
    assert all(few[m]["low"] is None and few[m]["high"] is None for m in METRICS)
    assert few["acc_x"]["value"] is not None and few["acc_x"]["n_boot_valid"] == MIN_VALID_RESAMPLES - 1
    enough = summarize(records, n_boot=MIN_VALID_RESAMPLES)
    assert all(enough[m]["low"] is not None for m in METRICS)
    none = summarize(records, n_boot=0)
    assert none["harm"]["low"] is None and none["harm"]["value"] == summarize(records, n_boot=50)["harm"]["value"]


def test_bootstrap_reproducible_per_seed_and_different_across_seeds():
    records = random_records(80, seed=7)
    a, b = summarize(records, seed=11, n_boot=300), summarize(records, seed=11, n_boot=300)
    c = summarize(records, seed=12, n_boot=300)
    assert a == b
    assert any((a[m]["low"], a[m]["high"]) != (c[m]["low"], c[m]["high"]) for m in METRICS)
    assert all(a[m]["value"] == c[m]["value"] for m in METRICS)


def test_intervals_contain_point_estimates_and_narrow_with_n():
    for seed in range(3):
        s = summarize(random_records(150, seed=seed), n_boot=500, seed=seed)
        for m in METRICS:
            assert s[m]["low"] <= s[m]["value"] <= s[m]["high"], (m, s[m])
    small = summarize(random_records(40, seed=0), n_boot=500)
    large = summarize(random_records(640, seed=0), n_boot=500)
    assert large["acc_x"]["high"] - large["acc_x"]["low"] < (small["acc_x"]["high"] - small["acc_x"]["low"]) / 2


def test_one_resample_serves_every_metric():
    """Identical views: Acc_x, Acc_xc and BothCorrect are the same statistic per resample, so their intervals agree
    only if every metric is computed on the same resamples."""
    records = [rec(r["correct_x"], r["correct_x"]) for r in random_records(60, seed=9)]
    s = summarize(records, n_boot=300)
    bounds = {m: (s[m]["low"], s[m]["high"]) for m in ("acc_x", "acc_xc", "both_correct")}
    assert len(set(bounds.values())) == 1
    right = s["n_right_x"]  # Harm 0 of the items right without c: the exact bound, never [0, 0] (#53)
    assert (s["harm"]["low"], s["harm"]["high"]) == pytest.approx((0.0, 1 - 0.025 ** (1 / right)))


# ----------------------------------------------------------------------------------------------------- regimes
@pytest.mark.parametrize(
    ("acc_x", "acc_xc", "harm", "expected"),
    [
        (0.50, 0.48, 0.05, "A"),  # gap exactly -drop_min
        (0.50, 0.4801, 0.05, "C"),  # just inside
        (0.50, 0.4799, 0.05, "A"),  # just beyond
        (0.50, 0.50, 0.10, "A"),  # harm exactly harm_high
        (0.50, 0.50, 0.0999, "C"),
        (0.50, 0.50, 0.1001, "A"),
        (0.50, 0.52, 0.05, "B"),  # gap exactly gain_min
        (0.50, 0.5199, 0.05, "C"),
        (0.50, 0.5201, 0.05, "B"),
        (0.55, 0.57, 0.05, "B"),  # 0.57 - 0.55 = 0.01999... in floats: still "at" the threshold
        (0.50, 0.60, 0.12, "A"),  # high harm overrides a net gain
        (0.50, 0.60, None, "B"),
        (0.00, 0.00, None, "X"),  # collapsed, never "views agree"
        (0.50, 0.47, None, "A"),
    ],
)
def test_regime_at_and_around_thresholds(acc_x, acc_xc, harm, expected):
    regime, reason = classify_regime(acc_x, acc_xc, harm, RegimeThresholds())
    assert regime == expected
    assert reason.startswith(expected) and f"{acc_xc - acc_x:+.3f}" in reason


def test_regime_reason_names_the_deciding_threshold():
    assert "drop_min" in classify_regime(0.6, 0.5, 0.05)[1]
    assert "harm = 0.150 ≥ harm_high = 0.100" in classify_regime(0.5, 0.5, 0.15)[1]
    assert "gain_min = 0.020" in classify_regime(0.5, 0.6, 0.0)[1]


def test_custom_thresholds_change_the_regime_and_are_reported():
    records = cells(rr=40, rw=3, wr=0, ww=57)  # gap -0.03, harm 3/43 ~ 0.07
    assert summarize(records, n_boot=0)["regime"] == "A"
    loose = RegimeThresholds(drop_min=0.05, harm_high=0.2, gain_min=0.05)
    s = summarize(records, n_boot=0, thresholds=loose)
    assert s["regime"] == "C" and s["thresholds"] == {"drop_min": 0.05, "harm_high": 0.2, "gain_min": 0.05}
    assert summarize(records, n_boot=0, thresholds=RegimeThresholds(harm_high=0.06, drop_min=0.5))["regime"] == "A"


def test_summarize_regime_from_counts_at_thresholds():
    assert summarize(cells(rr=48, rw=2, wr=0, ww=50), n_boot=0)["regime"] == "A"  # gap -0.02 exactly
    assert summarize(cells(rr=50, rw=0, wr=2, ww=48), n_boot=0)["regime"] == "B"  # gap +0.02, harm 0
    assert summarize(cells(rr=50, rw=0, wr=1, ww=49), n_boot=0)["regime"] == "C"  # gap +0.01


# ------------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("records", "needle"),
    [
        ([], "no paired records"),
        ([rec(True, True), {"correct_x": True, "len_x": 1, "len_xc": 1}], "record 1: missing field 'correct_xc'"),
        ([rec("yes", True)], "'correct_x'"),
        ([rec(True, True, -1.0)], "'len_x'"),
        ([rec(True, True, 10, float("nan"))], "'len_xc'"),
        ([rec(True, True, 10, "long")], "'len_xc'"),
    ],
)
def test_bad_records_raise_data_error(records, needle):
    with pytest.raises(DataError, match=needle):
        summarize(records)


@pytest.mark.parametrize(("kwargs", "needle"), [({"n_boot": -1}, "n_boot"), ({"ci": 1.0}, "ci"), ({"ci": 0}, "ci")])
def test_bad_options_raise_config_error(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        summarize(cells(1, 1, 1, 1), **kwargs)


def test_thresholds_validate():
    with pytest.raises(ConfigError, match="drop_min"):
        RegimeThresholds(drop_min=-0.1)
    with pytest.raises(ConfigError, match="harm_high"):
        RegimeThresholds(harm_high=1.5)


# -------------------------------------------------------------------------------------------------- comparison
def test_compare_table_markdown_and_csv():
    opd = summarize(random_records(100, seed=1), n_boot=200)
    nca = summarize(cells(rr=0, rw=0, wr=4, ww=6), n_boot=200)
    markdown, text = compare_table({"opd|v1": opd, "nca": nca})
    lines = markdown.splitlines()
    assert lines[0] == "| model | n | Acc_x | Acc_xc | Harm | Help | BothCorrect | Δlen | regime |"
    assert lines[1].count("|") == lines[0].count("|")
    row_opd, row_nca = lines[2], lines[3]
    assert row_opd.startswith("| opd\\|v1 | 100 | ")
    acc = opd["acc_x"]
    assert f"{acc['value']:.3f} [{acc['low']:.3f}, {acc['high']:.3f}]" in row_opd
    assert f"{opd['delta_len']['value']:+.3f} [" in row_opd and row_opd.endswith(f"| {opd['regime']} |")
    assert row_nca.split(" | ")[4] == "n/a"  # harm undefined: no item right without c
    assert "drop_min=0.02" in markdown and "95%" in markdown

    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["model"] for r in rows] == ["opd|v1", "nca"]
    assert float(rows[0]["harm"]) == opd["harm"]["value"]
    assert float(rows[0]["acc_xc_ci_low"]) == opd["acc_xc"]["low"]
    assert rows[1]["harm"] == rows[1]["harm_ci_low"] == "" and rows[1]["regime"] == nca["regime"]
    assert float(rows[1]["threshold_harm_high"]) == 0.1 and rows[1]["n"] == "10"


def test_compare_table_rejects_bad_input():
    with pytest.raises(ConfigError, match="no summaries"):
        compare_table({})
    broken = summarize(cells(2, 1, 1, 2), n_boot=0)
    del broken["harm"]
    with pytest.raises(DataError, match="'m1' lacks 'harm'"):
        compare_table({"m1": broken})
