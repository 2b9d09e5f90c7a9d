"""Each claim row's precondition (#53, `mechopd.report.preconditions`), one test per degenerate state: the row says
"not measurable here (design: …)" with the numbers in its measured cell instead of a verdict the design cannot carry;
Harm is judged against the base's Harm; convergence is relative to the teacher; a study whose floor is undecided says
"undecided (N items)" (#54), not "floor"."""

from __future__ import annotations

import json
from pathlib import Path

from mechopd.report import claims, verdicts
from mechopd.report import mechanism_claims as mc
from mechopd.report import preconditions as pre
from tests.unit.claim_runs import seed_runs


def _rows(root: Path, *per_seed: dict, only: set[str]) -> dict[str, claims.Claim]:
    return {c.key: c for c in claims.evaluate_claims(seed_runs(root, *per_seed), only=only)}


def test_harm_on_too_few_right_items_is_not_measurable(tmp_path: Path) -> None:
    """OPD right without the context on 6 items: Harm 0.5 of them says nothing (it held as 'Harm ≥ 0.10')."""
    few = {"acc_x": {"opd": 0.03}, "acc_xc": {"opd": 0.03}, "harm": {"opd": 0.5}}
    row = _rows(tmp_path, few, only={"degradation"})["degradation"]
    assert row.verdict == pre.NA_FEW_RIGHT and "right without the context on 6 items" in row.measured


def test_harm_is_judged_against_the_base_harm(tmp_path: Path) -> None:
    """The base's own Harm 0.333: OPD's 0.35 is no degradation (the absolute rule said it was)."""
    case = {
        "acc_x": {"base": 0.45, "opd": 0.5},
        "acc_xc": {"base": 0.85, "opd": 0.62},
        "harm": {"base": 0.333, "opd": 0.35},
    }
    row = _rows(tmp_path, case, only={"degradation"})["degradation"]
    assert row.verdict == verdicts.FAILS and "base Harm 0.333" in row.measured and "MDE" in row.measured


def test_a_deaf_nca_removes_nothing_it_could_show(tmp_path: Path) -> None:
    """NCA's context view follows no changed context (0.03 vs the base's 1.0): its Harm 0 is deafness."""
    deaf = {"follow": {"nca": (0.03, 0.03)}}
    got = _rows(tmp_path, deaf, only={"nca_removes", "cosine_order", "nca_lens"})
    assert {c.verdict for c in got.values()} == {pre.NA_COLLAPSED}
    assert "deaf" in got["nca_removes"].measured


def test_a_collapsed_nca_is_judged_against_the_base_and_opd(tmp_path: Path) -> None:
    """Acc_xc 0.2 against the base's 1.0 and OPD's 0.65: collapsed; Acc_xc 0.865 (Harm 0.1, above OPD's): alive."""
    dead = _rows(tmp_path / "a", {"acc_xc": {"nca": 0.2}, "harm": {"nca": 0.8}}, only={"nca_removes"})["nca_removes"]
    alive = _rows(tmp_path / "b", {"acc_xc": {"nca": 0.6}, "harm": {"nca": 0.1}}, only={"nca_removes"})
    assert dead.verdict == pre.NA_COLLAPSED and alive["nca_removes"].verdict == verdicts.HOLDS


def test_an_unmoved_student_keeps_nothing(tmp_path: Path) -> None:
    """OPD internalised 5 % of the context's gain: following and non-inferiority are not judged (they held)."""
    unmoved = {"acc_x": {"opd": 0.05, "nca": 0.05}, "acc_xc": {"opd": 1.0, "nca": 1.0}, "harm": {"opd": 0.0}}
    got = _rows(tmp_path, unmoved, only={"keeps_following", "nca_keeps", "nca_follows"})
    assert {c.verdict for c in got.values()} == {pre.NA_UNMOVED}
    assert "internalised 0.05" in got["keeps_following"].measured


def test_convergence_is_relative_to_the_teacher(tmp_path: Path) -> None:
    """A teacher at Acc_xc 0.5: OPD at 0.47 converged (the absolute 0.95 left it out); at 0.3 it has not."""
    near = {"acc_x": {"opd": 0.47}, "acc_xc": {"base": 0.5, "opd": 0.4}, "harm": {"opd": 0.3}}
    far = {"acc_x": {"opd": 0.3}, "acc_xc": {"base": 0.5, "opd": 0.25}, "harm": {"opd": 0.3}}
    assert _rows(tmp_path / "a", near, only={"orthogonal"})["orthogonal"].verdict == verdicts.HOLDS
    assert _rows(tmp_path / "b", far, only={"orthogonal"})["orthogonal"].verdict == pre.NA_UNCONVERGED


def test_a_revert_on_too_few_learned_items_is_not_measurable(tmp_path: Path) -> None:
    few = {"wp": {"none": (0.03, 0.65, 0.3)}}
    row = _rows(tmp_path, few, only={"qk_causal_rule"})["qk_causal_rule"]
    assert row.verdict == pre.NA_FEW_LEARNED and "6 learned" in row.measured


def test_a_revert_on_too_few_harmed_items_is_not_measurable(tmp_path: Path) -> None:
    few = {"wp": {"none": (0.95, 0.95, 0.02)}}
    row = _rows(tmp_path, few, only={"qk_causal_harm"})["qk_causal_harm"]
    assert row.verdict == pre.NA_FEW_HARMED and mc.NA_NO_HARM != row.verdict


def test_a_revert_that_moves_no_item_is_not_measurable_not_does_not_hold(tmp_path: Path) -> None:
    """No reverted group changes any item (the real model's probes): every margin 0 — it said 'does not hold'."""
    still = {"wp": {"qk": (0.95, 0.65, 0.3), "vo": (0.95, 0.65, 0.3), "ctrl": (0.95, 0.65, 0.3)}}
    row = _rows(tmp_path, still, {**still}, only={"qk_causal_rule"})["qk_causal_rule"]
    assert row.verdict.startswith(verdicts.NA + " (design: ") and "no item varies" in row.verdict


def test_an_undecided_floor_says_undecided_not_floor(tmp_path: Path) -> None:
    """The base's context gain 0.18 and 0.25 over two seeds: its interval holds the 0.2 bar: undecided, not floor."""
    runs = ({"acc_x": {"base": 0.5}, "acc_xc": {"base": g}} for g in (0.68, 0.75))
    row = _rows(tmp_path, *runs, only={"degradation"})["degradation"]
    assert row.verdict == f"{verdicts.NA} (undecided (400 items): whether the base uses the context)"


def test_a_floor_decided_below_the_bar_is_still_the_floor(tmp_path: Path) -> None:
    flat = {"acc_x": {"base": 0.5}, "acc_xc": {"base": 0.5}}
    assert _rows(tmp_path, flat, only={"degradation"})["degradation"].verdict == claims.NA_FLOOR


def test_a_qk_ratio_that_adam_alone_explains_is_not_concentration(tmp_path: Path) -> None:
    """q/k's W0 half as large, every coordinate moved alike (Adam's ~lr step): ‖ΔW‖/‖W0‖ of q,k twice the others'
    (it held at ≥ 1.5) but 1.0 × its optimiser null: does not hold, the null shown beside the ratio."""
    adam = {"qk_w0": 1.0, "qk_factor": 2.0}
    row = _rows(tmp_path, adam, {**adam}, {**adam}, only={"qk"})["qk"]
    assert row.verdict == verdicts.FAILS and "q,k / other 2.00" in row.measured and "÷ null 1.00" in row.measured


def test_localization_on_too_few_harmed_items_names_no_site(tmp_path: Path) -> None:
    """4 of 40 items flip unpatched: the shallowest removing site is not named (it was, on 4 items)."""
    from mechopd.report.mechanism_claims import localization_table
    from mechopd.runset import runsets

    few = "\n".join(localization_table(runsets(seed_runs(tmp_path / "a", {"loc": {"clean": 0.1}}))))
    enough = "\n".join(localization_table(runsets(seed_runs(tmp_path / "b", {}))))
    assert "localization needs ≥ 10 harmed items): 4 harmed items" in few and "**final_norm**" in enough


def test_an_nca_that_lost_no_more_following_than_opd_is_not_deaf(tmp_path: Path) -> None:
    """The rules organism (#53 item 7): the base follows other rules (1.0), every distilled student follows none (OPD
    0.0, NCA 0.0): the loss of following is distillation's, not NCA's anchor's, so NCA's rows are decided (the
    base-only reference said "deaf" for every NCA row on the default demo)."""
    case = {"follow": {"opd": (0.0, 0.0), "nca": (0.0, 0.0)}, "stick": {"opd": 0.9, "nca": 0.9}}
    got = _rows(tmp_path, case, only={"nca_removes", "cosine_order", "nca_lens"})
    assert {c.verdict for c in got.values()} == {verdicts.HOLDS}, {k: c.verdict for k, c in got.items()}


def _replies(run: Path, role: str, same: bool) -> None:
    """Give ``role``'s records replies: the same text in both views on every item (``same``), else a changed one."""
    path = run / "eval" / f"{role}.json"
    doc = json.loads(path.read_text())
    for i, r in enumerate(doc["records"]):
        r["response_x"], r["response_xc"] = f"a{i}", f"a{i}" if same else f"b{i}"
    path.write_text(json.dumps(doc))


def test_an_nca_whose_contexts_change_no_reply_is_deaf(tmp_path: Path) -> None:
    """A task without other contexts (a game): follow_other is not measured, so only the replies can tell. NCA's
    reply with the context equals its reply without it on every item: Harm 0 by construction, not measurable; the
    same study with NCA's context view changing its replies is decided."""
    no_others = {"follow": {"base": None, "opd": None, "nca": None}}
    for name, same in (("deaf", True), ("hears", False)):
        runs = seed_runs(tmp_path / name, no_others)
        for role in ("base", "opd"):
            _replies(runs[0], role, same=False)
        _replies(runs[0], "nca", same=same)
        row = {c.key: c for c in claims.evaluate_claims(runs, only={"nca_removes"})}["nca_removes"]
        if same:
            assert row.verdict == pre.NA_COLLAPSED and "changes NCA's reply on 0 items" in row.measured, row
        else:
            assert row.verdict == verdicts.HOLDS, row


def test_a_student_that_follows_nothing_the_base_follows_does_not_keep_following(tmp_path: Path) -> None:
    """OPD follows 0 of N other-context items, the base N of N: OPD − 0.5 × base is −0.5 on every item, a constant
    at both exact bounds, not a statistic without informative units; the row says "does not hold" on the exact
    bounds (it said "not measurable (design: … no item varies the statistic)")."""
    case = {"follow": {"opd": (0.0, 0.0), "nca": (0.0, 0.0)}, "stick": {"opd": 0.9, "nca": 0.9}}
    row = _rows(tmp_path, case, only={"keeps_following"})["keeps_following"]
    assert row.verdict == verdicts.FAILS and "0 of" in row.measured, row
