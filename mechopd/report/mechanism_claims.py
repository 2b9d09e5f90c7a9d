"""Claims read from the intervention probes (criteria: docs/method.md "Interventions and update geometry", fixed
before the runs).

The q/k rows are item level: the per-item outcomes of ``weightpatch_items.jsonl`` (`mechopd.probes.mechanism_stats`), the
margin of q_proj+k_proj over each matched control with the seeds × items interval (`stats.hier_bootstrap`), as every
bounded quantity of the claims table (docs/method.md §8). ``deltas --svd`` (`probes.delta_svd.load_svd`: pooled MLP
share, entry concentration, subspace overlap) is a probe quantity: `stats.seed_stat` over the seed runs. Every verdict
by the interval rule (`verdicts.decide`), compound criteria by `verdicts.all_of`. Each claim returns ``{"measured",
"verdict", "criterion"}``, as `mechopd.report.following_claims` does; `MECHANISM_CLAIMS` lists them in the claims table's
(key, claim, paper, fn) shape. `localization_table`: the report's localization section, from
``localization_items.jsonl`` with the same bootstrap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mechopd.core.stats import fmt_stat, seed_stat
from mechopd.probes import mechanism_stats as ms
from mechopd.probes.delta_svd import GAUSS_ENERGY90, load_svd
from mechopd.probes.registry import probe_result
from mechopd.report import preconditions as pre
from mechopd.report.verdicts import HOLDS, NA, RULE, Decision, all_of, decide
from mechopd.runset import RunSet

MODEL = "opd"
CONTROLS = ("ctrl_qk", "vo")
SPARSE_SHARE = 0.5  # "sparse": 90 % of ‖ΔW‖² in fewer than half the entries a dense Gaussian update needs


# ------------------------------------------------------------------------------------ per-seed values (thin readers)
def qk_margin(study: RunSet, role: str, control: str, key: str = "rule_removed") -> float | None:
    """``key`` (rule_removed = −ΔAcc_x, harm_removed = −ΔHarm) of reverting q_proj+k_proj in every layer minus that
    of the matched ``control`` (ctrl_qk: random rows, mean over draws; vo: v_proj+o_proj), for ``role``'s run."""
    wp, name = probe_result("weightpatch", study.probes_dir), study.name(role)
    got = None if wp is None or name is None else wp.qk_control(name)
    if not got or control not in got:
        return None
    a, b = got["qk"].get(key), got[control].get(key)
    return None if a is None or b is None else a - b


def unpatched(study: RunSet, role: str, key: str) -> float | None:
    """Acc_x / Harm of ``role``'s unpatched model in the weight-patching table."""
    wp, name = probe_result("weightpatch", study.probes_dir), study.name(role)
    return None if wp is None or name is None else wp.value(name, "none", "none", key)


def svd_value(study: RunSet, role: str, key: str) -> float | None:
    """A pooled update-geometry value of ``role`` (`delta_svd.summarize_svd`): mlp_energy_share, mlp_param_share,
    energy90_frac, overlap_k, overlap_random."""
    got, name = load_svd(study.probes_dir), study.name(role)
    if got is None or name is None or name not in got[0]:
        return None
    v = got[0][name].get(key)
    return None if v is None or v != v else float(v)


def _stat(runs: Sequence[RunSet], fn: Callable[[RunSet], float | None]) -> dict[str, Any]:
    return {**seed_stat([fn(r) for r in runs]), "of": len(runs)}


def _decided(measured: str, d: Decision, crit: str) -> dict[str, str]:
    return {"measured": measured + d.note, "verdict": d.verdict, "criterion": crit}


# ------------------------------------------------------------------------------------------------------- the claims
NA_NO_RULE = NA + " (OPD internalised no rule to remove: its unpatched Acc_x is 0)"
NA_NO_HARM = NA + " (OPD shows no harm to remove: its unpatched Harm is 0)"
NA_NO_ITEMS = NA + " (weightpatch_items.jsonl holds no per-item outcomes: rerun mechopd probe weightpatch)"


def _claim_qk(runs: Sequence[RunSet], key: str, what: str, base_key: str) -> dict[str, str]:
    """Item level (`mechanism_stats.qk_margin_stat`): the margin of q+k over each matched control, the
    hierarchical interval over seeds and items (t over seeds, item floor), each by the interval rule, Kleene AND."""
    margins = {c: ms.qk_margin_stat(runs, MODEL, c, key) for c in CONTROLS}
    base = ms.unpatched_stat(runs, MODEL, base_key)
    empty = NA_NO_RULE if base_key == "acc_x" else NA_NO_HARM
    crit = (
        f"OPD, every layer reverted to W0: the {what} removed by q_proj+k_proj minus that removed by the same "
        f"number of other parameters > 0, against both controls (ctrl_qk: random rows of v/o/gate/up/down; vo: "
        f"v_proj+o_proj), paired per seed and item; {RULE}; not measurable when OPD's unpatched {base_key} is 0 "
        f"in every seed, or rests on fewer than {pre.K_REVERT} learned (rule) or harmed (harm) items"
    )
    measured = (
        f"OPD {base_key} {fmt_stat(base)}; q+k − random rows {fmt_stat(margins['ctrl_qk'], signed=True)}, "
        f"q+k − v+o {fmt_stat(margins['vo'], signed=True)}"
    )
    if base["mean"] is None:
        legacy = any(probe_result("weightpatch", r.probes_dir) is not None for r in runs)
        return {"measured": measured, "verdict": NA_NO_ITEMS if legacy else NA, "criterion": crit}
    if all(v == 0 for v in base["values"]):
        return {"measured": measured, "verdict": empty, "criterion": crit}
    if few := pre.revert_units(runs, key, MODEL):
        return {"measured": f"{measured}; {few[1]}", "verdict": few[0], "criterion": crit}
    if any(m["mean"] is None for m in margins.values()):
        return {"measured": measured, "verdict": NA, "criterion": crit}
    return _decided(measured, all_of(*(decide(margins[c], 0.0, ">", f"q+k − {c}") for c in CONTROLS)), crit)


def claim_qk_causal_rule(runs: Sequence[RunSet]) -> dict[str, str]:
    """Reverting q/k removes more of the internalised rule (Acc_x) than the matched controls."""
    return _claim_qk(runs, "rule_removed", "internalised rule (drop in Acc_x)", "acc_x")


def claim_qk_causal_harm(runs: Sequence[RunSet]) -> dict[str, str]:
    """Reverting q/k removes more of the harm than the matched controls."""
    return _claim_qk(runs, "harm_removed", "harm (drop in Harm)", "harm")


def claim_sparse_update(runs: Sequence[RunSet]) -> dict[str, str]:
    """arXiv 2606.13657 on OPD's update, Kleene AND of three parts, each by the interval rule: MLP concentration
    (MLP share of Σ‖ΔW‖² − MLP share of the parameters > 0), sparsity (energy90_frac < SPARSE_SHARE × a dense
    Gaussian's), away from W0's principal directions (overlap_k − overlap_random < 0)."""
    mlp = _stat(runs, lambda r: _sub(svd_value(r, MODEL, "mlp_energy_share"), svd_value(r, MODEL, "mlp_param_share")))
    e90 = _stat(runs, lambda r: svd_value(r, MODEL, "energy90_frac"))
    ovl = _stat(runs, lambda r: _sub(svd_value(r, MODEL, "overlap_k"), svd_value(r, MODEL, "overlap_random")))
    bar = SPARSE_SHARE * GAUSS_ENERGY90
    crit = (
        f"OPD's ΔW over the decoder matrices (deltas --svd): MLP share of ‖ΔW‖² − MLP share of parameters > 0, "
        f"AND share of entries holding 90 % of ‖ΔW‖² < {bar:.3f} ({SPARSE_SHARE} × a dense Gaussian's), AND "
        f"top-k overlap with W0's left singular subspace − a random subspace's < 0; {RULE} (each part)"
    )
    measured = (
        f"MLP excess share {fmt_stat(mlp, signed=True)}, energy90 share {fmt_stat(e90)}, overlap − random "
        f"{fmt_stat(ovl, signed=True)}"
    )
    if any(s["mean"] is None for s in (mlp, e90, ovl)):
        return {"measured": measured, "verdict": NA, "criterion": crit}
    d = all_of(decide(mlp, 0.0, ">", "MLP excess"), decide(e90, bar, "<", "energy90"), decide(ovl, 0.0, "<", "overlap"))
    return _decided(measured, d, crit)


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


MECHANISM_CLAIMS = (
    (
        "qk_causal_rule",
        "reverting q_proj / k_proj removes more of the internalised rule than as many other parameters",
        "q_proj, k_proj carry the update (correlational in the paper)",
        claim_qk_causal_rule,
    ),
    (
        "qk_causal_harm",
        "reverting q_proj / k_proj removes more of the harm than as many other parameters",
        "not asked by either paper",
        claim_qk_causal_harm,
    ),
    (
        "sparse_update",
        "OPD's update is sparse, MLP-heavy and away from W0's principal directions",
        "“Dense Supervision, Sparse Updates” (arXiv 2606.13657)",
        claim_sparse_update,
    ),
)


# ------------------------------------------------------------------------------------------- the report's section
def localization_curve(study: RunSet) -> dict[str, float | None] | None:
    """site -> teacher-forced Harm after patching (`probes.localization`) of one seed run; None without the table."""
    loc = probe_result("localization", study.probes_dir)
    return None if loc is None else {site: harm for site, _, harm in loc.curve()}


def localization_table(runs: Sequence[RunSet]) -> list[str]:
    """The report's "Where the harm lives" section: per site the teacher-forced Harm after patching and the removal
    margin Harm_tf(s) − (1 − share) · Harm_tf(unpatched), each a mean over seeds with the hierarchical interval (t over seeds, item floor) over
    seeds and items (`mechanism_stats`, from ``localization_items.jsonl``), and the shallowest site whose margin's
    whole interval is ≤ 0 (the interval rule); [] when no seed ran the probe."""
    results = [x for x in (probe_result("localization", r.probes_dir) for r in runs) if x is not None]
    if not results:
        return []
    s0, sites = results[0].summary, [site for site, _, _ in results[0].curve()]
    share = float(s0["removed_share"])
    clean = ms.site_harm_stat(runs, None)
    if clean["mean"] is None:
        why = (
            "no item is right without c in any seed: no harm to localize"
            if any(ms.localization_arrays(r) is not None for r in runs)
            else "localization_items.jsonl holds no per-item flips: rerun `mechopd probe localization`"
        )
        return ["## Where the harm lives (localization)", "", f"{s0['model']}: {why}.", ""]
    out = [
        "## Where the harm lives (localization)",
        "",
        (
            f"{s0['model']}'s context view fed its own correct no-context reply; the residual at one site replaced at "
            f"every response position by {_donor_text(s0['donor'])}; teacher-forced Harm (docs/method.md, "
            f'"Interventions and update geometry"). Unpatched: {fmt_stat(clean)}. A site removes the harm when the '
            f"whole interval of Harm after patching − {1 - share:.2f} × unpatched Harm (paired per seed and item) is "
            f"≤ 0 ({round(100 * share)} % removed)."
        ),
        "",
        f"| site | Harm after patching | − {1 - share:.2f} × unpatched | removes |",
        "|---|---:|---:|:---:|",
    ]
    first = None
    for site in sites:
        harm, margin = ms.site_harm_stat(runs, site), ms.removal_stat(runs, site, share)
        verdict = decide(margin, 0.0, "<=").verdict if margin["mean"] is not None else NA
        first = first or (site if verdict == HOLDS else None)
        out.append(f"| {site} | {fmt_stat(harm)} | {fmt_stat(margin, signed=True)} | {verdict} |")
    where = [x.summary.get("removed_at") or "none" for x in results]
    few = pre.harmed_localized(runs)
    shown = f"{few[0]}: {few[1]}" if few else (first or "none")  # too few harmed items: no site is named
    out += [
        "",
        f"Shallowest site that removes the harm (interval rule, {clean['n']} seed"
        f"{'s' if clean['n'] != 1 else ''}): **{shown}**; per seed (point values): {', '.join(where)}. "
        "Cells: mean over seeds [95 % over seeds and items: Student-t over seeds, item-bootstrap floor]"
        + ("." if clean["n"] > 1 else "; one seed: an item bootstrap."),
        "",
    ]
    return out


def weightpatch_table(runs: Sequence[RunSet], role: str = MODEL) -> list[str]:
    """The report's "Which weights carry the rule" section: per reverted group (``layer/module``; the random-row
    control pooled over its draws) ``role``'s Acc_x, Acc_xc and Harm, each a mean over seeds with the hierarchical
    interval over seeds and items (t over seeds, item floor; `mechanism_stats.group_stat`); [] without per-item weight-patching outcomes."""
    with_items = [r for r in runs if ms.weightpatch_outcomes(r, role) is not None]
    if not with_items:
        return []
    wp = probe_result("weightpatch", with_items[0].probes_dir)
    donor = (wp.summary.get("donor") if wp is not None else None) or "the donor"
    out = [
        "## Which weights carry the rule (weight patching)",
        "",
        (
            f"{with_items[0].label(role)} with one group of weights set to {donor}'s, both views decoded greedily on the "
            f'held-out items (`probes/weightpatch.csv`; docs/method.md, "Interventions and update geometry"). '
            "`all/qk` against `all/vo` and `all/ctrl_qk` (as many parameters: v_proj+o_proj; random rows of the other "
            "matrices) is what the q/k claim rows read."
        ),
        "",
        "| layer | group | Acc_x | Acc_xc | Harm |",
        "|---|---|---:|---:|---:|",
    ]
    for group in ms.row_groups(with_items[0], role):
        layer, module = group.split("/")
        cells = [fmt_stat(ms.group_stat(runs, role, group, m)) for m in ("acc_x", "acc_xc", "harm")]
        out.append(f"| {layer} | {module} | " + " | ".join(cells) + " |")
    seeds = len(with_items)
    out += [
        "",
        f"Cells: mean over {seeds} seed{'s' if seeds != 1 else ''} [95 % over seeds and items: Student-t over "
        "seeds, item-bootstrap floor]"
        + (f"; {len(runs) - seeds} seed(s) without the probe left out." if seeds < len(runs) else "."),
        "",
    ]
    return out


def _donor_text(donor: str) -> str:
    return "its own no-context view" if donor == "x" else f"{donor}'s context view"
