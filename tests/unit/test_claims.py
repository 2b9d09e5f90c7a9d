"""Claims table (mechopd.report.claims): every row reaches every verdict it may give — holds, does not hold, each "not
measurable" reason, fragile — from synthetic per-seed runs with per-item records (tests/unit/claim_runs.py); the
statistics behind them (the seeds × items interval, scaled t-intervals, the interval rule)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mechopd.core.errors import DataError
from mechopd.core.stats import fmt_stat, hier_bootstrap, scaled_stat, seed_stat, t_quantile
from mechopd.report import claim_rules, claims, verdicts
from mechopd.report import mechanism_claims as mc
from mechopd.report import preconditions as pre
from mechopd.report.aggregate import aggregate, relabel_kept, summarise_runs
from mechopd.report.verdicts import NA_FLOOR_BOTH, ONE_SEED_NOTE, Decision, all_of, any_of, decide
from tests.unit.claim_runs import make_run, seed_runs, spec_with

H, F, U, NA = verdicts.HOLDS, verdicts.FAILS, verdicts.NA_FRAGILE, verdicts.NA
NO_DEGRADATION = {"acc_xc": {"opd": 0.95}, "harm": {"opd": 0.0}}
BAD_NCA = {"acc_x": {"nca": 0.7}, "acc_xc": {"nca": 0.7}}
BAD_TA = {"acc_x": {"ta_opd": 0.7}, "acc_xc": {"ta_opd": 0.7}}
SHALLOW, DEEP = {"layers": 6, "shallow_factor": 2.0}, {"layers": 6, "shallow_factor": 0.5}
# weight patching: reverting q+k removes less of the rule and of the harm than v+o or random rows of the same size
BAD_QK = {"wp": {"qk": (0.93, 0.63, 0.3), "vo": (0.2, 0.2, 0.0), "ctrl": (0.2, 0.2, 0.0)}}
NO_ITEMS = {"wp": {"items": False}}
DENSE = {"svd": {"e90": 0.4}}
CEIL_NCA = {"acc_x": {"nca": 1.0, "opd": 1.0}, "acc_xc": {"nca": 1.0}}  # right on every item: "≥ OPD − δ" cannot fail
CEIL_TA = {"acc_x": {"ta_opd": 1.0}, "acc_xc": {"ta_opd": 1.0}, "harm": {"ta_opd": 0.0}}

# row -> verdict -> per-seed changes to GOOD (one dict per seed). "na" verdicts are matched by their full text.
CASES: dict[str, dict[str, list[dict]]] = {
    "degradation": {H: [{}], F: [NO_DEGRADATION], NA: [{"acc_x": {"opd": None}}], U: [{}, NO_DEGRADATION]},
    "nca_removes": {
        H: [{}],
        F: [{"harm": {"nca": 0.3}, "acc_xc": {"nca": 0.67}}],
        NA + " (OPD shows no degradation to remove)": [NO_DEGRADATION],
        claims.NA_COLLAPSED: [{"acc_x": {"nca": 0.0}, "acc_xc": {"nca": 0.0}, "harm": {"nca": None}}],
        U: [{}, {"harm": {"nca": 0.3}, "acc_xc": {"nca": 0.67}}],
    },
    "nca_keeps": {
        H: [{}],
        F: [BAD_NCA],
        NA: [{"acc_x": {"nca": None}}],
        verdicts.NA_CEILING: [CEIL_NCA],
        U: [{}, BAD_NCA],
    },
    "ta_opd": {
        H: [{}],
        F: [BAD_TA],
        NA: [{"acc_x": {"ta_opd": None}}],
        verdicts.NA_CEILING: [CEIL_TA],
        U: [{}, BAD_TA],
    },
    "cosine_order": {
        H: [{}],
        F: [{"cos": {"opd": [0.85, 0.75, 0.65]}}],
        NA: [{"cos_": {"base": [0.9], "opd": [0.95]}}],
        U: [{}, {"cos": {"nca": [0.95, 0.9, 0.85]}}],
    },
    "nca_cosine": {
        H: [{}],
        F: [{"cos": {"nca": [0.999, 0.998, 0.95]}}],  # layer 2 leaves 0.05 / 0.3 of the base's distance (> 0.064)
        NA: [{"cos_": {"base": [0.9], "opd": [0.95]}}],
        U: [{}, {"cos": {"nca": [0.999, 0.998, 0.95]}}],
    },
    "nca_lens": {
        H: [{}],
        F: [{"lens": {"nca": [0.04, 0.05, 0.1, 0.9]}}],
        NA: [{"lens": {"base": [0.01, 0.01, 0.01, 0.01]}}],
        U: [{}, {"lens": {"nca": [0.04, 0.9, 0.1, 0.1]}}],
    },
    "orthogonal": {
        H: [{}],
        F: [{"gcos": (0.3, 0.6)}],
        NA + " (the OPD gradient cannot be told from noise here)": [{"gcos": (0.05, 0.01)}],
        U: [{"gcos": (0.05, 0.4)}, {"gcos": (0.2, 0.4)}],
    },
    "shallow": {H: [SHALLOW], F: [DEEP], pre.NA_SHALLOW: [{}], U: [SHALLOW, DEEP]},
    "qk": {H: [{}], F: [{"qk_factor": 0.5}], U: [{}, {"qk_factor": 0.5}]},
    "qk_causal_rule": {
        H: [{}],
        F: [BAD_QK],
        NA: [{"wp": None}],
        mc.NA_NO_ITEMS: [NO_ITEMS],
        mc.NA_NO_RULE: [{"wp": {"none": (0.0, 0.65, None)}}],
        U: [{}, BAD_QK],
    },
    "qk_causal_harm": {
        H: [{}],
        F: [BAD_QK],
        NA: [{"wp": None}],
        mc.NA_NO_ITEMS: [NO_ITEMS],
        mc.NA_NO_HARM: [{"wp": {"none": (0.95, 0.95, 0.0)}}],
        U: [{}, BAD_QK],
    },
    "sparse_update": {H: [{}], F: [DENSE], NA: [{"svd": None}], U: [{}, DENSE]},
    "teachability": {
        H: [{}],
        F: [{"spread": {"DL": 1.0, "kl_full": 3.0}}],
        NA: [{"degenerate": ["C carries no information"]}],
        U: [{}, {"spread": {"DL": 1.0, "kl_full": 3.0}}],
    },
    "keeps_following": {
        H: [{}],
        F: [{"follow": {"opd": (0.2, 0.2)}}],
        NA: [{"follow": {"opd": None}}],
        U: [{}, {"follow": {"opd": (0.2, 0.2)}}],
    },
    "nca_follows": {
        H: [{}],
        F: [{"follow": {"nca": (0.5, 0.5)}}],
        verdicts.NA_CEILING: [{"follow": {"nca": (1.0, 1.0), "opd": (1.0, 1.0)}}],
        NA_FLOOR_BOTH: [{"follow": {"nca": (0.0, 0.0), "opd": (0.0, 0.0)}}],
        U: [{}, {"follow": {"nca": (0.5, 0.5)}}],
    },
    "follow_term": {
        H: [{}],
        F: [{"follow": {"nca_follow": (0.95, 0.1)}}],
        NA + " (the follow term saw every other context: nothing held out)": [{"follow_contexts": None}],
        U: [{}, {"follow": {"nca_follow": (0.95, 0.1)}}],
    },
}


def rows(root: Path, per_seed: list[dict], only: set[str] | None = None) -> dict[str, claims.Claim]:
    return {c.key: c for c in claims.evaluate_claims(seed_runs(root, *per_seed), only=only)}


@pytest.mark.parametrize(("key", "verdict"), [(k, v) for k, vs in CASES.items() for v in vs])
def test_each_row_reaches_each_of_its_verdicts(tmp_path: Path, key: str, verdict: str) -> None:
    row = rows(tmp_path, CASES[key][verdict], only={key})[key]  # the other rows: test_aggregate_* evaluate them all
    assert row.verdict == verdict, (key, row.measured)
    assert ("fragile:" in row.measured) == (verdict == U)
    assert ("one seed" in row.measured) == (verdict in (H, F) and len(CASES[key][verdict]) == 1)


def test_only_evaluates_the_named_rows_and_refuses_an_unknown_key(tmp_path: Path) -> None:
    runs = seed_runs(tmp_path, {}, {})
    assert [c.key for c in claims.evaluate_claims(runs, only={"qk", "degradation"})] == [
        k for k, *_ in claims.CLAIMS if k in {"qk", "degradation"}
    ]
    with pytest.raises(ValueError, match="no claim row \\['nope'\\]"):
        claims.evaluate_claims(runs, only={"nope"})


def test_every_row_has_a_case_for_holds_fails_and_fragile() -> None:
    assert set(CASES) == {k for k, *_ in claims.CLAIMS}
    for key, cases in CASES.items():
        assert {H, F, U} <= set(cases), key


def test_qk_not_measurable_without_deltas(tmp_path: Path) -> None:
    run = make_run(tmp_path, spec_with())
    (run / "probes" / "deltas.csv").unlink()
    assert {c.key: c for c in claims.evaluate_claims([run])}["qk"].verdict == NA


def test_floor_rule_decides_nothing_when_the_base_does_not_use_the_context(tmp_path: Path) -> None:
    got = rows(tmp_path, [{"acc_xc": {"base": 0.0}}, {"acc_xc": {"base": 0.0}}])
    assert {c.verdict for c in got.values()} == {claims.NA_FLOOR}
    assert all("base Acc_xc − Acc_x" in c.measured for c in got.values())


@pytest.mark.parametrize("key", ["cosine_order", "nca_cosine", "nca_lens"])
def test_item_level_rows_fall_back_to_the_seed_rule_without_per_item_tables(tmp_path: Path, key: str) -> None:
    for verdict, per_seed in CASES[key].items():
        if verdict in (H, F, U):
            per_item = rows(tmp_path / f"i{len(verdict)}", per_seed, only={key})[key]
            per_seed_off = [{**c, "per_item": False} for c in per_seed]
            seed_level = rows(tmp_path / f"s{len(verdict)}", per_seed_off, only={key})[key]
            assert per_item.verdict == seed_level.verdict == verdict, (verdict, seed_level.measured)


def test_lens_reads_only_sites_where_the_base_views_differ_and_the_output_once(tmp_path: Path) -> None:
    # layer 0 (base KL 0.05 < 10 % of its output KL 3.0) and the last layer (= the output) are not read
    for nca in ([0.5, 0.05, 0.1, 0.1], [0.04, 0.05, 0.9, 0.1]):
        row = rows(tmp_path / str(nca[0] + nca[2]), [{"lens": {"nca": nca}}])["nca_lens"]
        assert row.verdict == H and "layer 1" in row.measured and "output" in row.measured
        assert "layer 0" not in row.measured and "layer 2" not in row.measured


def test_teachability_degeneracy_is_counted_per_seed(tmp_path: Path) -> None:
    row = rows(tmp_path, [{}, {}, {"degenerate": ["C carries no information"]}])["teachability"]
    assert row.verdict == H and "on 2 of 3 seeds" in row.measured and "degenerate on 1" in row.measured


def test_non_inferiority_at_the_ceiling_cannot_speak_and_says_so(tmp_path: Path) -> None:
    row = rows(tmp_path, [CEIL_NCA])["nca_keeps"]
    assert row.verdict == verdicts.NA_CEILING and "no gain can be shown" in row.measured


def test_findings_and_the_table_put_the_verdict_first(tmp_path: Path) -> None:
    got = list(rows(tmp_path, [{}, {}, {}, NO_DEGRADATION]).values())  # 3 seeds agree on NCA, one shows no degradation
    md = claims.claims_markdown(got)
    assert md.startswith("| claim | verdict |") and md.count("\n| ") == len(claims.CLAIMS)
    lines = claims.findings(got)
    assert len(lines) == len(got) and lines[0].startswith("- **Not measurable here — fragile**: OPD causes")
    assert any(line.startswith("- **Holds**: NCA keeps no-context accuracy") for line in lines)


def test_aggregate_report_opens_with_findings_and_bounded_intervals(tmp_path: Path) -> None:
    runs = seed_runs(tmp_path, {}, {"harm": {"opd": 0.2}, "acc_xc": {"opd": 0.75}}, {})
    text = aggregate(runs, tmp_path / "agg").read_text()
    assert text.index("## Findings") < text.index("## Context removability over seeds")
    for low, high in _intervals(text.split("## Context removability over seeds")[1].split("##")[0]):
        assert 0.0 <= low <= high <= 1.0


def _intervals(text: str) -> list[tuple[float, float]]:
    import re

    return [
        (float(a), float(b))
        for a, b in re.findall(r"\[([+-]?[0-9.]+), ([+-]?[0-9.]+)\]", text)
        if not a.startswith("+") and not a.startswith("-")
    ]


# ------------------------------------------------------------------------------------------------ statistics
def test_t_quantile_matches_the_tables() -> None:
    for df, ref in ((1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.975, df) == pytest.approx(ref, abs=2e-3)
    assert t_quantile(0.95, 5) == pytest.approx(2.015, abs=2e-3)


def test_seed_stat_is_mean_plus_minus_t_sd_over_root_n_and_skips_undefined() -> None:
    st = seed_stat([0.2, None, 0.4, 0.9])
    sd = math.sqrt(((0.2 - 0.5) ** 2 + (0.4 - 0.5) ** 2 + 0.4**2) / 2)
    assert st["n"] == 3 and st["mean"] == pytest.approx(0.5)
    assert st["high"] - st["mean"] == pytest.approx(4.303 * sd / math.sqrt(3), rel=1e-3)
    one = seed_stat([0.7])
    assert one["low"] is None and fmt_stat(one) == "0.700"
    assert seed_stat([None])["mean"] is None and fmt_stat(seed_stat([])) == "n/a"


def test_scaled_stat_keeps_intervals_in_range() -> None:
    cos = scaled_stat([0.99, 0.995, 0.98], "log1m")  # a plain t-interval would pass 1 here
    assert seed_stat([0.99, 0.995, 0.98])["high"] > 0.999 and cos["high"] < 1.0 and cos["low"] < cos["mean"]
    kl = scaled_stat([0.1, 0.5, 2.0], "log")
    assert kl["low"] > 0 and kl["mean"] == pytest.approx((0.1 * 0.5 * 2.0) ** (1 / 3))
    assert scaled_stat([0.0, 0.5], "log")["n"] == 1  # 0 is outside the log scale's domain


def test_hierarchical_bootstrap_stays_in_range_and_widens_with_seed_disagreement() -> None:
    rng = np.random.default_rng(0)
    same = [(rng.random(200) < 0.95,) for _ in range(3)]
    split = [(rng.random(200) < p,) for p in (0.99, 0.98, 0.5)]
    fn = lambda a: a[0].mean(1)  # noqa: E731
    a, b = hier_bootstrap(same, fn, bounds=(0.0, 1.0)), hier_bootstrap(split, fn, bounds=(0.0, 1.0))
    assert 0 <= a["low"] <= a["mean"] <= a["high"] <= 1 and 0 <= b["low"] <= b["high"] <= 1
    assert b["high"] - b["low"] > 3 * (a["high"] - a["low"])
    assert hier_bootstrap(same, fn, bounds=(0.0, 1.0)) == a  # deterministic
    assert a["mean"] == pytest.approx(np.mean([x[0].mean() for x in same]))
    undefined = hier_bootstrap([(np.zeros(10, bool),)], lambda x: np.full(x[0].shape[0], np.nan))
    assert undefined["mean"] is None and undefined["low"] is None


def test_relabel_kept_replaces_the_kept_fraction_only() -> None:
    assert relabel_kept("TA-OPD (ρ=0.10, kept 0.50)", 0.104) == "TA-OPD (ρ=0.10, kept 0.10)"
    assert relabel_kept("OPD", 0.3) == "OPD"


# ------------------------------------------------------------------------------------------------ interval rule
def _st(*values: float) -> dict:
    return seed_stat(list(values))


AT, ABOVE, BELOW, ACROSS = _st(0.1, 0.1, 0.1), _st(0.2, 0.25, 0.3), _st(0.0, 0.02, 0.05), _st(0.0, 0.1, 0.2)
NA_AT = "not measurable here (design: x: every seed gives 0.1: the seeds do not vary, so they make no interval)"
ENDS_AT_BAR = {"mean": 0.2, "low": 0.1, "high": 0.3, "n": 3}  # non-strict: holds at the end, strict: fragile there
H, F, U = verdicts.HOLDS, verdicts.FAILS, verdicts.NA_FRAGILE


@pytest.mark.parametrize(
    ("stat", "op", "verdict"),
    [
        (AT, ">=", NA_AT),
        (AT, ">", NA_AT),
        (AT, "<=", NA_AT),
        (AT, "<", NA_AT),
        (ABOVE, ">=", H),
        (ABOVE, ">", H),
        (ABOVE, "<=", F),
        (ABOVE, "<", F),
        (BELOW, ">=", F),
        (BELOW, ">", F),
        (BELOW, "<=", H),
        (BELOW, "<", H),
        (ACROSS, ">=", U),
        (ACROSS, ">", U),
        (ACROSS, "<=", U),
        (ACROSS, "<", U),
        (ENDS_AT_BAR, ">=", H),
        (ENDS_AT_BAR, ">", U),
        (ENDS_AT_BAR, "<=", U),
        (ENDS_AT_BAR, "<", F),
        (_st(0.1 + 1e-12), ">", F),
        (_st(0.1 - 1e-12), ">=", H),  # within the tolerance: at the bar
    ],
)
def test_decide_for_each_op_at_above_below_and_across_the_bar(stat: dict, op: str, verdict: str) -> None:
    d = decide(stat, 0.1, op, "x")
    assert d.verdict == verdict
    assert ("fragile" in d.note) == (verdict == U) and ("one seed" in d.note) == (stat["n"] == 1)
    if verdict == U:  # why, and the smallest effect the interval could see (#53)
        assert d.note.startswith(" (fragile: x: the 95 % interval [") and "holds the bar 0.1" in d.note
        assert ("; x: MDE " in d.note) == ("se" in stat)


def test_decide_on_one_seed_or_none_and_refuses_an_unknown_op() -> None:
    assert decide(_st(0.2), 0.1, ">").note == ONE_SEED_NOTE and decide(_st(0.05), 0.1, ">").verdict == F
    assert decide(_st(), 0.1, ">").verdict == verdicts.NA and decide(_st(), 0.1, ">").note == ""
    with pytest.raises(ValueError, match="op must be one of"):
        decide(_st(0.2), 0.1, "==")


@pytest.mark.parametrize(
    ("a", "b", "and_", "or_"),
    [
        (H, H, H, H),
        (H, F, F, H),
        (F, H, F, H),
        (F, F, F, F),
        (H, U, U, H),
        (U, H, U, H),
        (F, U, F, U),
        (U, F, F, U),
        (U, U, U, U),
        (verdicts.NA, U, verdicts.NA, verdicts.NA),
        (verdicts.NA, F, F, verdicts.NA),
        (verdicts.NA, H, verdicts.NA, H),
    ],
)
def test_all_of_and_any_of_are_kleene_and_or(a: str, b: str, and_: str, or_: str) -> None:
    da, db = (Decision(v, (f"{name} part",) if v == U else ()) for v, name in ((a, "a"), (b, "b")))
    assert all_of(da, db).verdict == and_ and any_of(da, db).verdict == or_
    named = "; ".join(f"{name} part" for v, name in ((a, "a"), (b, "b")) if v == U)
    for d in (all_of(da, db), any_of(da, db)):
        assert d.note == (f" (fragile: {named})" if d.verdict == U else "")


def test_a_compound_fragile_verdict_names_every_fragile_part_and_one_seed_is_kept() -> None:
    d = all_of(decide(ACROSS, 0.1, ">=", "first"), decide(ABOVE, 0.1, ">", "second"), decide(ACROSS, 0.1, "<", "third"))
    assert d.verdict == U and "first: the 95 %" in d.note and "third: the 95 %" in d.note and "second" not in d.note
    one = any_of(decide(_st(0.05), 0.1, ">="), decide(_st(0.2), 0.1, ">="))
    assert one.verdict == H and "one seed" in one.note


# -------------------------------------------------------------------------------------------------- aggregate
def test_aggregate_tables_labels_and_report(tmp_path: Path) -> None:
    runs = []
    for k, harm in enumerate((0.2, 0.3, 0.4)):
        spec = spec_with(harm={"opd": harm}, kept=0.1 + 0.01 * k)
        runs.append(make_run(tmp_path, spec, f"seed-{k}"))
    summary = summarise_runs(runs)
    harm = summary["models"]["opd"]["harm"]
    assert harm["mean"] == pytest.approx(0.3, abs=0.005) and harm["n"] == 3  # 190 items right without c: 38 / 57 / 76
    half = t_quantile(0.975, 2) * 0.1 / math.sqrt(3)  # seeds 0.2, 0.3, 0.4: their spread beats the item floor
    assert harm["low"] == pytest.approx(0.3 - half, abs=1e-6) and harm["high"] == pytest.approx(0.3 + half, abs=1e-6)
    assert "Student-t over seeds" in summary["interval"]
    assert summary["models"]["base"]["harm"]["mean"] is None
    report = aggregate(runs, tmp_path / "agg").read_text()
    meta = json.loads((tmp_path / "agg" / "demo.json").read_text())
    assert meta["labels"]["ta_opd"] == "TA-OPD (ρ=0.10, kept 0.11)" and len(meta["seed_runs"]) == 3
    assert "0.300 [" in report and "## The papers' claims" in report and "3 training seeds" in report
    # the intervention sections over seeds and items: weight patching, and localization with the shallowest site
    assert "## Which weights carry the rule (weight patching)" in report and "| all | qk |" in report
    assert (
        "## Where the harm lives (localization)" in report
        and "removes the harm (interval rule, 3 seeds): **final_norm**" in report
    )
    from mechopd.report import write_report_md

    one = write_report_md(runs[0]).read_text()
    assert "## Which weights carry the rule" in one and "(interval rule, 1 seed): **final_norm**" in one


def test_aggregate_refuses_runs_of_different_studies(tmp_path: Path) -> None:
    a = make_run(tmp_path, spec_with(), "a")
    b = make_run(tmp_path, spec_with(), "b")
    meta = json.loads((b / "demo.json").read_text())
    meta["task"] = "sokoban"
    (b / "demo.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="aggregate runs of one study"):
        summarise_runs([a, b])
    with pytest.raises(DataError, match="no demo.json"):
        summarise_runs([tmp_path / "missing"])


def test_claim_readers_follow_the_artifact_policy(tmp_path: Path) -> None:
    """An empty or null cell is NaN (mechopd.core.artifacts), not a crash; a missing artifact is 'not measurable'."""
    run = make_run(tmp_path, spec_with())
    path = run / "probes" / "similarity.csv"
    lines = path.read_text().splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("nca,layers.0.resid_post"))
    lines[i] = "nca,layers.0.resid_post,0,"
    path.write_text("\n".join(lines) + "\n")
    cos = claim_rules.layer_cosines(run, "nca")
    assert math.isnan(cos[0]) and all(math.isfinite(c) for c in cos[1:])
    (run / "probes" / "similarity.csv").unlink()
    assert claim_rules.layer_cosines(run, "nca") == []


def test_orthogonality_leaves_out_a_seed_whose_opd_did_not_converge(tmp_path: Path) -> None:
    stuck = {"acc_x": {"opd": 0.8}, "acc_xc": {"opd": 0.5}, "gcos": (0.9, 0.95)}  # aligned, but not converged
    row = rows(tmp_path, [{}, {}, stuck])["orthogonal"]
    assert row.verdict == H and "1 of 3 seeds left out: OPD did not converge" in row.measured
    assert rows(tmp_path / "b", [{}, {}, {"gcos": (0.9, 0.95)}])["orthogonal"].verdict in (F, U)


def test_the_follow_term_row_names_a_missing_follow_run(tmp_path: Path) -> None:
    """A study without an NCA + follow run (smollm2-facts) once read 'the follow term saw every other context'."""
    import json

    from tests.unit.claim_runs import make_run, spec_with

    runs = [make_run(tmp_path, spec_with(), f"seed-{k}") for k in range(2)]
    for run in runs:
        doc = json.loads((run / "demo.json").read_text())
        doc["methods"] = [m for m in doc["methods"] if m != "nca_follow"]
        doc["runs"].pop("nca_follow")
        (run / "demo.json").write_text(json.dumps(doc))
        (run / "eval" / "nca_follow.json").unlink()
    row = {c.key: c for c in claims.evaluate_claims(runs)}["follow_term"]
    assert row.verdict == NA + " (no nca_follow run: the study trains no NCA + follow term)", row.verdict
