"""Claims table (mechopd.claims) and seed aggregation (mechopd.aggregate) on synthetic run directories: every verdict
of every claim is reachable, the values come from the artifacts, the t-interval matches a hand computation."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from mechopd import claims
from mechopd.aggregate import aggregate, fmt_stat, relabel_kept, seed_stat, summarise_runs, t_quantile
from mechopd.errors import DataError
from mechopd.removability import METRICS
from mechopd.verdicts import ONE_SEED_NOTE, Decision, all_of, any_of, decide

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# A study where every claim holds; each test perturbs one field.
GOOD: dict = {
    "acc_x": {"base": 0.0, "opd": 0.95, "nca": 0.96, "nca_const": 0.4, "ta_opd": 0.97},
    "acc_xc": {"base": 1.0, "opd": 0.7, "nca": 0.98, "nca_const": 0.4, "ta_opd": 0.8},
    "harm": {"base": None, "opd": 0.3, "nca": 0.01, "nca_const": 0.0, "ta_opd": 0.1},
    "cos": {"base": [0.9, 0.8, 0.7], "opd": [0.99, 0.97, 0.95], "nca": [0.999, 0.998, 0.9975]},
    "grad": [(1, 0.02, 0.5, 1.0), (11, -0.05, 0.3, 0.6)],  # (step, cos, |∇opd|, |∇nca|) in the OPD run
    "layers": 3,
    "update": {"opd": 0.1, "nca": 0.2},  # relative update of every parameter; q/k get twice that
    "qk_factor": 2.0,
    "shallow_factor": 1.0,  # relative update of layer i scaled by shallow_factor ** -i
    "spread": {"DL": 5.0, "kl_full": 2.0},
    "kept": 0.1,
    "follow": {"base": 0.96, "opd": 0.9, "nca": 0.95, "nca_const": 0.5, "ta_opd": 0.9, "nca_follow": 0.95},
    "follow_run": {"acc_x": 0.96, "harm": 0.02},  # the NCA + follow run
    "gcos": (0.02, 0.5),  # (cos, norm ratio) of the gradients probe at the OPD checkpoint
    "degenerate": [],  # teachability degeneracy reasons
    "lens": {"opd": [0.2, 0.5, 0.5], "nca": [0.05, 0.1, 0.1]},  # lens KL after each layer and at the output
}
METHODS = ["opd", "nca", "nca_const", "ta_opd", "nca_follow"]


def _summary(spec: dict, model: str) -> dict:
    s = {m: {"value": None, "low": None, "high": None} for m in METRICS}
    for m in ("acc_x", "acc_xc", "harm"):
        s[m]["value"] = spec[m].get(model)
    s.update({"n": 200, "regime": "A", "regime_reason": "A (context hurts)",
              "thresholds": {"drop_min": 0.02, "harm_high": 0.1, "gain_min": 0.02}})
    if model == "nca_follow":
        s["acc_x"]["value"], s["harm"]["value"] = spec["follow_run"]["acc_x"], spec["follow_run"]["harm"]
    if spec["follow"].get(model) is not None:
        s["follow_other"] = {"value": spec["follow"][model], "low": None, "high": None}
        s["stick"] = {"value": 0.0, "low": None, "high": None}
    return {"summary": s, "settings": {"model": model}, "other_contexts": [{"label": "shift:2", "n": 200,
                                                                          "follow": 0.5, "stick": 0.0}]}


def _write_deltas(path: Path, spec: dict) -> None:
    """Per-tensor rows (weight only) through the probe's own writer, as `mechopd probe deltas` writes them."""
    from mechopd.probes.deltas import DeltaRow, write_table

    rows = []
    for i in range(spec["layers"]):
        for mod in MODULES:
            site, w0 = f"layers.{i}.{mod}", 2.0
            rows.append(DeltaRow("base", "", site, i, mod, "weight", 4, "", "w0_norm", w0))
            for model, rel in spec["update"].items():
                rel *= (spec["qk_factor"] if mod in ("q_proj", "k_proj") else 1.0) * spec["shallow_factor"] ** -i
                rows.append(DeltaRow(model, "base", site, i, mod, "weight", 4, "", "delta_norm", rel * w0))
    write_table(rows, path)
    from mechopd.probes.deltas import summarize_deltas

    summarize_deltas(rows, None, {}).save(path.parent)  # the typed summary the claims read the table through


def make_run(root: Path, spec: dict, name: str = "run") -> Path:
    run = root / name
    (run / "eval").mkdir(parents=True)
    (run / "probes").mkdir()
    (run / "demo.json").write_text(json.dumps({
        "task": "rules", "methods": METHODS, "labels": {"ta_opd": "TA-OPD (ρ=0.10, kept 0.50)"},
        "thresholds": {"drop_min": 0.02, "harm_high": 0.1, "gain_min": 0.02},
        "runs": {"ta_opd": {"selector": "ta_opd", "budget": 0.1}}}))
    from mechopd.following import apply_retention

    reps = {model: _summary(spec, model) for model in ["base", *METHODS]}
    apply_retention(reps)
    for model, rep in reps.items():
        (run / "eval" / f"{model}.json").write_text(json.dumps(rep))
    cos, ratio = spec["gcos"]
    (run / "probes" / "gradients.json").write_text(json.dumps({
        "term_a": "opd", "term_b": "nca", "model": "opd", "cos": cos, "norm_ratio": ratio, "value_a": 0.1,
        "value_b": 0.2, "response_tokens": 100}))
    with (run / "probes" / "similarity.csv").open("w") as fh:
        fh.write("model,site,layer,cos_mean\n")
        for model, vals in spec["cos"].items():
            fh.write(f"{model},embed,,1.0\n")
            fh.writelines(f"{model},layers.{i}.resid_post,{i},{v}\n" for i, v in enumerate(vals))
    (run / "probes" / "similarity.json").write_text(json.dumps({  # the typed summary (SimilaritySummary)
        "models": list(spec["cos"]), "mean_cos": {}, "sites": [], "responses_from": "opd", "n_items": 1}))
    with (run / "probes" / "lens.csv").open("w") as fh:
        fh.write("model,site,depth,kl_c_x\n")
        for model, vals in spec["lens"].items():
            sites = ["embed"] + [f"layers.{i}.resid_post" for i in range(len(vals) - 1)] + ["final_norm"]
            fh.writelines(f"{model},{s},{d},{v}\n" for d, (s, v) in enumerate(zip(sites, [0.0, *vals])))
    (run / "probes" / "lens.json").write_text(json.dumps({  # the typed result (LensSummary) next to the table
        "probe": "lens", "settings": {}, "summary": {"models": list(spec["lens"]), "output_kl": {}, "promoted": {}}}))
    for method in METHODS:
        d = run / "train" / method
        d.mkdir(parents=True)
        lines = [{"step": s, "kept_fraction": spec["kept"] if method == "ta_opd" else 1.0} for s in range(1, 4)]
        if method == "opd":
            lines += [{"step": s, "grad/cos/opd__nca": c, "grad/norm/opd": a, "grad/norm/nca": b}
                      for s, c, a, b in spec["grad"]]
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    _write_deltas(run / "probes" / "deltas.csv", spec)
    buckets = {sig: [{"quartile": 1, "mean_gain_abs": 1.0}, {"quartile": 4, "mean_gain_abs": 1.0 + spread}]
               for sig, spread in spec["spread"].items()}
    (run / "probes" / "teachability_summary.json").write_text(json.dumps({
        "buckets": buckets, "n_tokens": 1, "n_sequences": 1, "means": {}, "gap": {}, "regression": {},
        "degeneracy": {"reasons": spec["degenerate"]}}))
    return run


def verdicts(tmp_path: Path, replace: tuple[str, ...] = (), **changes) -> dict[str, claims.Claim]:
    """Claims on GOOD with `changes` merged into its dicts (keys in `replace`: swapped whole)."""
    spec = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict) and key not in replace:
            spec[key].update(value)
        else:
            spec[key] = value
    return {c.key: c for c in claims.evaluate_claims([make_run(tmp_path, spec)])}


# ------------------------------------------------------------------------------------------------ statistics
def test_t_quantile_matches_the_tables() -> None:
    for df, ref in ((1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.975, df) == pytest.approx(ref, abs=2e-3)
    assert t_quantile(0.95, 5) == pytest.approx(2.015, abs=2e-3)


def test_seed_stat_is_mean_plus_minus_t_sd_over_root_n_and_skips_undefined() -> None:
    st = seed_stat([0.2, None, 0.4, 0.9])
    sd = math.sqrt(((0.2 - 0.5) ** 2 + (0.4 - 0.5) ** 2 + 0.4 ** 2) / 2)
    assert st["n"] == 3 and st["mean"] == pytest.approx(0.5)
    assert st["high"] - st["mean"] == pytest.approx(4.303 * sd / math.sqrt(3), rel=1e-3)
    one = seed_stat([0.7])
    assert one["low"] is None and fmt_stat(one) == "0.700"
    assert seed_stat([None])["mean"] is None and fmt_stat(seed_stat([])) == "n/a"


def test_relabel_kept_replaces_the_kept_fraction_only() -> None:
    assert relabel_kept("TA-OPD (ρ=0.10, kept 0.50)", 0.104) == "TA-OPD (ρ=0.10, kept 0.10)"
    assert relabel_kept("OPD", 0.3) == "OPD"


# ------------------------------------------------------------------------------------------------------ claims
def test_every_claim_holds_on_the_good_study(tmp_path: Path) -> None:
    v = verdicts(tmp_path, layers=6, shallow_factor=2.0)
    assert {k: c.verdict for k, c in v.items()} == {k: claims.HOLDS for k, *_ in claims.CLAIMS}
    assert "0.300" in v["degradation"].measured and "constant-β NCA" in v["nca_removes"].measured
    assert "kept fraction 0.100" in v["ta_opd"].measured


@pytest.mark.parametrize(("changes", "key"), [
    ({"acc_xc": {"opd": 1.0}, "harm": {"opd": 0.05}}, "degradation"),
    ({"harm": {"nca": 0.2}}, "nca_removes"),
    ({"acc_x": {"nca": 0.85}}, "nca_keeps"),
    ({"cos": {"opd": [0.999, 0.9995, 0.9999]}}, "cosine_order"),
    ({"cos": {"nca": [0.999, 0.998, 0.99]}}, "nca_cosine"),
    ({"gcos": (0.5, 1.0)}, "orthogonal"),
    ({"layers": 6, "shallow_factor": 0.5}, "shallow"),
    ({"qk_factor": 0.5}, "qk"),
    ({"acc_x": {"ta_opd": 0.9}}, "ta_opd"),
    ({"spread": {"DL": 1.0, "kl_full": 3.0}}, "teachability"),
    ({"follow": {"opd": 0.48}}, "keeps_following"),  # retention 0.5: context-deaf
    ({"follow": {"nca": 0.85}}, "nca_follows"),
    ({"follow": {"nca_follow": 0.3}}, "follow_term"),  # deaf
    ({"follow_run": {"acc_x": 0.96, "harm": 0.2}}, "follow_term"),  # the harm is back
    ({"follow_run": {"acc_x": 0.8, "harm": 0.0}}, "follow_term"),  # did not internalise
    ({"lens": {"nca": [0.05, 0.6, 0.1]}}, "nca_lens"),
])
def test_each_claim_can_fail(tmp_path: Path, changes: dict, key: str) -> None:
    assert verdicts(tmp_path, **changes)[key].verdict == claims.FAILS


@pytest.mark.parametrize(("changes", "key"), [
    ({"harm": {"opd": None}, "acc_x": {"opd": None}}, "degradation"),  # both parts of the OR undefined
    ({"harm": {"opd": 0.0}}, "nca_removes"),
    ({"acc_x": {"nca": None}}, "nca_keeps"),
    ({"cos": {"base": [0.9], "opd": [0.95]}}, "cosine_order"),  # NCA's similarity rows absent
    ({"cos": {"base": [0.9], "opd": [0.95]}}, "nca_cosine"),
    ({"gcos": (0.0, 1e-5)}, "orthogonal"),  # one gradient is noise next to the other
    ({"layers": 3}, "shallow"),  # too shallow to ask
    ({"spread": {"DL": 1.0}}, "teachability"),  # raw-KL buckets absent
    ({"degenerate": ["C carries no information"]}, "teachability"),
    ({"follow": {"base": 0.0}}, "keeps_following"),  # the base follows nothing: no reference
    ({"follow": {"nca_follow": None}}, "follow_term"),
    ({"lens": {"opd": [0.2, 0.5, 0.5]}}, "nca_lens"),  # NCA's lens rows absent
])
def test_each_claim_can_be_not_measurable(tmp_path: Path, changes: dict, key: str) -> None:
    assert verdicts(tmp_path, replace=("cos", "spread", "lens"), **changes)[key].verdict == claims.NA


@pytest.mark.parametrize(("changes", "key"), [
    ({"acc_x": {"ta_opd": 1.0, "opd": 1.0}}, "ta_opd"),
    ({"acc_x": {"nca": 0.998, "opd": 1.0}}, "nca_keeps"),
    ({"follow": {"nca": 1.0, "opd": 0.996, "base": 1.0}}, "nca_follows"),
])
def test_every_at_least_claim_applies_the_same_ceiling_rule(tmp_path: Path, changes: dict, key: str) -> None:
    assert verdicts(tmp_path, **changes)[key].verdict == claims.NA_CEILING


def test_qk_not_measurable_without_deltas(tmp_path: Path) -> None:
    run = make_run(tmp_path, copy.deepcopy(GOOD))
    (run / "probes" / "deltas.csv").unlink()
    assert {c.key: c for c in claims.evaluate_claims([run])}["qk"].verdict == claims.NA


def _seed_runs(tmp_path: Path, *per_seed: dict) -> list[Path]:
    """One synthetic run per seed: GOOD with that seed's changes merged into its dicts."""
    runs = []
    for k, changes in enumerate(per_seed):
        spec = copy.deepcopy(GOOD)
        for key, value in changes.items():
            spec[key].update(value) if isinstance(value, dict) else spec.__setitem__(key, value)
        runs.append(make_run(tmp_path, spec, f"seed-{k}"))
    return runs


def test_two_seeds_whose_paired_interval_holds_the_bar_are_fragile(tmp_path: Path) -> None:
    runs = _seed_runs(tmp_path, {}, {"harm": {"nca": 0.35}})  # d = NCA − 0.5 · OPD: −0.14, +0.20
    got = {c.key: c for c in claims.evaluate_claims(runs)}
    row = got["nca_removes"]
    assert row.verdict == claims.NA_FRAGILE and row.verdict.startswith(claims.NA)
    assert "0.180 [" in row.measured and "(per seed 0.010, 0.350)" in row.measured  # two seeds: an interval
    assert "(fragile: the 95 % seed interval [" in row.measured and "more seeds could settle it)" in row.measured
    assert "whole 95 % seed interval" in row.criterion and "paired per seed" in row.criterion
    # the follow run's Harm − NCA's pairs with the same NCA Harm: +0.01, −0.33, fragile too
    assert [c.key for c in claims.fragile_claims(list(got.values()))] == ["nca_removes", "follow_term"]
    assert "Harm − NCA's: the 95 % seed interval" in got["follow_term"].measured
    md = claims.claims_markdown(list(got.values()))
    assert md.count("\n| ") == len(claims.CLAIMS) and md.startswith("| claim |") and "Student-t" in md
    assert "interval rule" in md and "Verdicts on the seed means" not in md


def test_two_seeds_whose_paired_interval_is_above_the_bar_fail(tmp_path: Path) -> None:
    runs = _seed_runs(tmp_path, {"harm": {"nca": 0.25}}, {"harm": {"nca": 0.26}})  # d = +0.10, +0.11
    row = {c.key: c for c in claims.evaluate_claims(runs)}["nca_removes"]
    assert row.verdict == claims.FAILS and "fragile" not in row.measured and "one seed" not in row.measured


def test_one_seed_decides_on_the_value_and_says_so(tmp_path: Path) -> None:
    v = verdicts(tmp_path, harm={"nca": 0.16})  # 0.16 > 0.5 · 0.3 by a hair: one seed has no interval to doubt it
    assert v["nca_removes"].verdict == claims.FAILS and "one seed: no interval" in v["nca_removes"].measured
    assert v["degradation"].verdict == claims.HOLDS and "one seed: no interval" in v["degradation"].measured
    assert claims.fragile_claims(list(v.values())) == []


@pytest.mark.parametrize(("harms", "verdict"), [((0.30, 0.31, 0.29), claims.HOLDS),
                                                 ((0.0, 0.35, 0.02), claims.NA_FRAGILE)])
def test_three_seed_degradation_by_the_interval_rule(tmp_path: Path, harms: tuple, verdict: str) -> None:
    # Acc_x − Acc_xc = −0.05 in every seed: that part fails, Harm ≥ 0.1 decides the OR
    runs = _seed_runs(tmp_path, *({"harm": {"opd": h, "nca": 0.0}, "acc_xc": {"opd": 1.0}} for h in harms))
    got = {c.key: c for c in claims.evaluate_claims(runs)}
    row = got["degradation"]
    assert row.verdict == verdict and "3 seeds" in row.measured and "one seed" not in row.measured
    assert ("fragile" in row.measured) == (verdict == claims.NA_FRAGILE)
    if verdict == claims.NA_FRAGILE:
        assert "(fragile: Harm: the 95 % seed interval [" in row.measured and "the bar 0.1;" in row.measured
        assert "Acc_x − Acc_xc:" not in row.measured  # the part that fails outright is not named
    else:  # NCA Harm 0, 0, 0: d = −0.5 · OPD in every seed, the whole interval ≤ 0
        assert got["nca_removes"].verdict == claims.HOLDS
    assert "Harm's interval above 0" not in row.criterion and "else fragile" in row.criterion
    report = aggregate(runs, tmp_path / "agg").read_text()  # report.md names the fragile rows after the table
    line = "**Fragile verdicts** (the seed interval holds the bar; more seeds could settle them): "
    named = "; ".join(c.claim for c in claims.fragile_claims(list(got.values())))
    assert (f"{line}{named}." in report) == (verdict == claims.NA_FRAGILE) and (line in report) == bool(named)
    assert named.startswith("OPD causes context-induced degradation") == (verdict == claims.NA_FRAGILE)
    assert bool(named) == (verdict == claims.NA_FRAGILE)  # none fragile: no line at all


def test_lens_is_an_and_over_sites_of_paired_differences_naming_the_fragile_site(tmp_path: Path) -> None:
    runs = _seed_runs(tmp_path, {"lens": {"nca": [0.05, 0.4, 0.1]}}, {"lens": {"nca": [0.05, 0.7, 0.1]}})
    row = {c.key: c for c in claims.evaluate_claims(runs)}["nca_lens"]
    assert row.verdict == claims.NA_FRAGILE and "(fragile: layer 1: the 95 % seed interval" in row.measured
    assert "layer 0:" not in row.measured and "output:" not in row.measured
    runs = _seed_runs(tmp_path / "b", {"lens": {"nca": [0.05, 0.4, 0.60]}}, {"lens": {"nca": [0.05, 0.7, 0.61]}})
    assert {c.key: c for c in claims.evaluate_claims(runs)}["nca_lens"].verdict == claims.FAILS  # output: above


def test_cosine_order_is_an_and_of_paired_steps(tmp_path: Path) -> None:
    cos = {"opd": [0.99, 0.97, 0.95]}
    runs = _seed_runs(tmp_path, {"cos": {**cos, "nca": [0.999, 0.998, 0.9975]}},
                      {"cos": {**cos, "nca": [0.95, 0.95, 0.95]}})  # NCA − OPD: +0.0205, −0.02
    row = {c.key: c for c in claims.evaluate_claims(runs)}["cosine_order"]
    assert row.verdict == claims.NA_FRAGILE and "nca − opd: the 95 % seed interval" in row.measured
    assert "opd − base:" not in row.measured


# ------------------------------------------------------------------------------------------------ interval rule
def _st(*values: float) -> dict:
    return seed_stat(list(values))


AT, ABOVE, BELOW, ACROSS = _st(0.1, 0.1, 0.1), _st(0.2, 0.25, 0.3), _st(0.0, 0.02, 0.05), _st(0.0, 0.1, 0.2)
ENDS_AT_BAR = {"mean": 0.2, "low": 0.1, "high": 0.3, "n": 3}  # non-strict: holds at the end, strict: fragile there
H, F, U = claims.HOLDS, claims.FAILS, claims.NA_FRAGILE


@pytest.mark.parametrize(("stat", "op", "verdict"), [
    (AT, ">=", H), (AT, ">", F), (AT, "<=", H), (AT, "<", F),
    (ABOVE, ">=", H), (ABOVE, ">", H), (ABOVE, "<=", F), (ABOVE, "<", F),
    (BELOW, ">=", F), (BELOW, ">", F), (BELOW, "<=", H), (BELOW, "<", H),
    (ACROSS, ">=", U), (ACROSS, ">", U), (ACROSS, "<=", U), (ACROSS, "<", U),
    (ENDS_AT_BAR, ">=", H), (ENDS_AT_BAR, ">", U), (ENDS_AT_BAR, "<=", U), (ENDS_AT_BAR, "<", F),
    (_st(0.1 + 1e-12), ">", F), (_st(0.1 - 1e-12), ">=", H),  # within the tolerance: at the bar
])
def test_decide_for_each_op_at_above_below_and_across_the_bar(stat: dict, op: str, verdict: str) -> None:
    d = decide(stat, 0.1, op, "x")
    assert d.verdict == verdict
    assert ("fragile" in d.note) == (verdict == U) and ("one seed" in d.note) == (stat["n"] == 1)
    if verdict == U:
        assert d.note.startswith(" (fragile: x: the 95 % seed interval [") and "holds the bar 0.1;" in d.note


def test_decide_on_one_seed_or_none_and_refuses_an_unknown_op() -> None:
    assert decide(_st(0.2), 0.1, ">").note == ONE_SEED_NOTE and decide(_st(0.05), 0.1, ">").verdict == F
    assert decide(_st(), 0.1, ">").verdict == claims.NA and decide(_st(), 0.1, ">").note == ""
    with pytest.raises(ValueError, match="op must be one of"):
        decide(_st(0.2), 0.1, "==")


@pytest.mark.parametrize(("a", "b", "and_", "or_"), [
    (H, H, H, H), (H, F, F, H), (F, H, F, H), (F, F, F, F),
    (H, U, U, H), (U, H, U, H), (F, U, F, U), (U, F, F, U), (U, U, U, U),
    (claims.NA, U, claims.NA, claims.NA), (claims.NA, F, F, claims.NA), (claims.NA, H, claims.NA, H),
])
def test_all_of_and_any_of_are_kleene_and_or(a: str, b: str, and_: str, or_: str) -> None:
    da, db = (Decision(v, (f"{name} part",) if v == U else ()) for v, name in ((a, "a"), (b, "b")))
    assert all_of(da, db).verdict == and_ and any_of(da, db).verdict == or_
    named = "; ".join(f"{name} part" for v, name in ((a, "a"), (b, "b")) if v == U)
    for d in (all_of(da, db), any_of(da, db)):
        assert d.note == (f" (fragile: {named}; more seeds could settle it)" if d.verdict == U else "")


def test_a_compound_fragile_verdict_names_every_fragile_part_and_one_seed_is_kept() -> None:
    d = all_of(decide(ACROSS, 0.1, ">=", "first"), decide(ABOVE, 0.1, ">", "second"), decide(ACROSS, 0.1, "<", "third"))
    assert d.verdict == U and "first: the 95 %" in d.note and "third: the 95 %" in d.note and "second" not in d.note
    one = any_of(decide(_st(0.05), 0.1, ">="), decide(_st(0.2), 0.1, ">="))
    assert one.verdict == H and "one seed" in one.note


# -------------------------------------------------------------------------------------------------- aggregate
def test_aggregate_tables_labels_and_report(tmp_path: Path) -> None:
    runs = []
    for k, harm in enumerate((0.2, 0.3, 0.4)):
        spec = copy.deepcopy(GOOD)
        spec["harm"]["opd"], spec["kept"] = harm, 0.1 + 0.01 * k
        runs.append(make_run(tmp_path, spec, f"seed-{k}"))
    summary = summarise_runs(runs)
    harm = summary["models"]["opd"]["harm"]
    assert harm["mean"] == pytest.approx(0.3) and harm["n"] == 3
    assert harm["high"] - 0.3 == pytest.approx(4.303 * 0.1 / math.sqrt(3), rel=1e-3)
    assert summary["models"]["base"]["harm"]["mean"] is None
    report = aggregate(runs, tmp_path / "agg").read_text()
    meta = json.loads((tmp_path / "agg" / "demo.json").read_text())
    assert meta["labels"]["ta_opd"] == "TA-OPD (ρ=0.10, kept 0.11)" and len(meta["seed_runs"]) == 3
    assert "0.300 [" in report and "## The papers' claims" in report and "3 training seeds" in report


def test_aggregate_refuses_runs_of_different_studies(tmp_path: Path) -> None:
    a = make_run(tmp_path, copy.deepcopy(GOOD), "a")
    b = make_run(tmp_path, copy.deepcopy(GOOD), "b")
    meta = json.loads((b / "demo.json").read_text())
    meta["task"] = "sokoban"
    (b / "demo.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="aggregate runs of one study"):
        summarise_runs([a, b])
    with pytest.raises(DataError, match="no demo.json"):
        summarise_runs([tmp_path / "missing"])


def test_claim_readers_follow_the_artifact_policy(tmp_path: Path) -> None:
    """An empty or null cell is NaN (mechopd.artifacts), not a crash; a missing artifact is 'not measurable'."""
    run = make_run(tmp_path, copy.deepcopy(GOOD))
    path = run / "probes" / "similarity.csv"
    lines = path.read_text().splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("nca,layers.0.resid_post"))
    lines[i] = "nca,layers.0.resid_post,0,"
    path.write_text("\n".join(lines) + "\n")
    cos = claims.layer_cosines(run, "nca")
    assert math.isnan(cos[0]) and all(math.isfinite(c) for c in cos[1:])
    (run / "probes" / "similarity.csv").unlink()
    assert claims.layer_cosines(run, "nca") == []
