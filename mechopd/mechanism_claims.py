"""Claims read from the intervention probes (criteria: docs/method.md "Interventions and update geometry", fixed
before the runs).

Per seed, thin functions read one number each from the probes' typed results (`probes.registry.probe_result`):
``weightpatch`` (`WeightpatchSummary.qk_control`: the rule / harm each group's reversion removes, layer ``all``) and
``deltas --svd`` (`probes.delta_svd.load_svd`: pooled MLP share, entry concentration, subspace overlap). Seed
statistics: `stats.seed_stat` over the seed runs; every verdict by the interval rule (`verdicts.decide`), compound
criteria by `verdicts.all_of`. Each claim returns ``{"measured", "verdict", "criterion"}``, as
`mechopd.following_claims` does; `MECHANISM_CLAIMS` lists them in the claims table's (key, claim, paper, fn) shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mechopd.probes.delta_svd import GAUSS_ENERGY90, load_svd
from mechopd.probes.registry import probe_result
from mechopd.stats import fmt_stat, seed_stat
from mechopd.study import Study
from mechopd.verdicts import NA, RULE, Decision, all_of, decide

MODEL = "opd"
CONTROLS = ("ctrl_qk", "vo")
SPARSE_SHARE = 0.5  # "sparse": 90 % of ‖ΔW‖² in fewer than half the entries a dense Gaussian update needs


# ------------------------------------------------------------------------------------ per-seed values (thin readers)
def qk_margin(study: Study, role: str, control: str, key: str = "rule_removed") -> float | None:
    """``key`` (rule_removed = −ΔAcc_x, harm_removed = −ΔHarm) of reverting q_proj+k_proj in every layer minus that
    of the matched ``control`` (ctrl_qk: random rows, mean over draws; vo: v_proj+o_proj), for ``role``'s run."""
    wp, name = probe_result("weightpatch", study.probes_dir), study.name(role)
    got = None if wp is None or name is None else wp.qk_control(name)
    if not got or control not in got:
        return None
    a, b = got["qk"].get(key), got[control].get(key)
    return None if a is None or b is None else a - b


def unpatched(study: Study, role: str, key: str) -> float | None:
    """Acc_x / Harm of ``role``'s unpatched model in the weight-patching table."""
    wp, name = probe_result("weightpatch", study.probes_dir), study.name(role)
    return None if wp is None or name is None else wp.value(name, "none", "none", key)


def svd_value(study: Study, role: str, key: str) -> float | None:
    """A pooled update-geometry value of ``role`` (`delta_svd.summarize_svd`): mlp_energy_share, mlp_param_share,
    energy90_frac, overlap_k, overlap_random."""
    got, name = load_svd(study.probes_dir), study.name(role)
    if got is None or name is None or name not in got[0]:
        return None
    v = got[0][name].get(key)
    return None if v is None or v != v else float(v)


def _stat(runs: Sequence[Study], fn: Callable[[Study], float | None]) -> dict[str, Any]:
    return {**seed_stat([fn(r) for r in runs]), "of": len(runs)}


def _decided(measured: str, d: Decision, crit: str) -> dict[str, str]:
    return {"measured": measured + d.note, "verdict": d.verdict, "criterion": crit}


# ------------------------------------------------------------------------------------------------------- the claims
def _claim_qk(runs: Sequence[Study], key: str, what: str, base_key: str) -> dict[str, str]:
    margins = {c: _stat(runs, lambda r, c=c: qk_margin(r, MODEL, c, key)) for c in CONTROLS}
    base = _stat(runs, lambda r: unpatched(r, MODEL, base_key))
    crit = (f"OPD, every layer reverted to W0: the {what} removed by q_proj+k_proj minus that removed by the same "
            f"number of other parameters > 0, against both controls (ctrl_qk: random rows of v/o/gate/up/down; vo: "
            f"v_proj+o_proj); {RULE}; not measurable when OPD's unpatched {base_key} is 0 in every seed")
    measured = (f"OPD {base_key} {fmt_stat(base)}; q+k − random rows {fmt_stat(margins['ctrl_qk'], signed=True)}, "
                f"q+k − v+o {fmt_stat(margins['vo'], signed=True)}")
    if base["mean"] is None or all(v == 0 for v in base["values"]) or any(
            m["mean"] is None for m in margins.values()):
        return {"measured": measured, "verdict": NA, "criterion": crit}
    return _decided(measured, all_of(*(decide(margins[c], 0.0, ">", f"q+k − {c}") for c in CONTROLS)), crit)


def claim_qk_causal_rule(runs: Sequence[Study]) -> dict[str, str]:
    """Reverting q/k removes more of the internalised rule (Acc_x) than the matched controls."""
    return _claim_qk(runs, "rule_removed", "internalised rule (drop in Acc_x)", "acc_x")


def claim_qk_causal_harm(runs: Sequence[Study]) -> dict[str, str]:
    """Reverting q/k removes more of the harm than the matched controls."""
    return _claim_qk(runs, "harm_removed", "harm (drop in Harm)", "harm")


def claim_sparse_update(runs: Sequence[Study]) -> dict[str, str]:
    """arXiv 2606.13657 on OPD's update, Kleene AND of three parts, each by the interval rule: MLP concentration
    (MLP share of Σ‖ΔW‖² − MLP share of the parameters > 0), sparsity (energy90_frac < SPARSE_SHARE × a dense
    Gaussian's), away from W0's principal directions (overlap_k − overlap_random < 0)."""
    mlp = _stat(runs, lambda r: _sub(svd_value(r, MODEL, "mlp_energy_share"), svd_value(r, MODEL, "mlp_param_share")))
    e90 = _stat(runs, lambda r: svd_value(r, MODEL, "energy90_frac"))
    ovl = _stat(runs, lambda r: _sub(svd_value(r, MODEL, "overlap_k"), svd_value(r, MODEL, "overlap_random")))
    bar = SPARSE_SHARE * GAUSS_ENERGY90
    crit = (f"OPD's ΔW over the decoder matrices (deltas --svd): MLP share of ‖ΔW‖² − MLP share of parameters > 0, "
            f"AND share of entries holding 90 % of ‖ΔW‖² < {bar:.3f} ({SPARSE_SHARE} × a dense Gaussian's), AND "
            f"top-k overlap with W0's left singular subspace − a random subspace's < 0; {RULE} (each part)")
    measured = (f"MLP excess share {fmt_stat(mlp, signed=True)}, energy90 share {fmt_stat(e90)}, overlap − random "
                f"{fmt_stat(ovl, signed=True)}")
    if any(s["mean"] is None for s in (mlp, e90, ovl)):
        return {"measured": measured, "verdict": NA, "criterion": crit}
    d = all_of(decide(mlp, 0.0, ">", "MLP excess"), decide(e90, bar, "<", "energy90"), decide(ovl, 0.0, "<", "overlap"))
    return _decided(measured, d, crit)


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


MECHANISM_CLAIMS = (
    ("qk_causal_rule", "reverting q_proj / k_proj removes more of the internalised rule than as many other parameters",
     "q_proj, k_proj carry the update (correlational in the paper)", claim_qk_causal_rule),
    ("qk_causal_harm", "reverting q_proj / k_proj removes more of the harm than as many other parameters",
     "not asked by either paper", claim_qk_causal_harm),
    ("sparse_update", "OPD's update is sparse, MLP-heavy and away from W0's principal directions",
     "“Dense Supervision, Sparse Updates” (arXiv 2606.13657)", claim_sparse_update),
)


# ------------------------------------------------------------------------------------------- the report's section
def localization_curve(study: Study) -> dict[str, float | None] | None:
    """site -> teacher-forced Harm after patching (`probes.localization`) of one seed run; None without the table."""
    loc = probe_result("localization", study.probes_dir)
    return None if loc is None else {site: harm for site, _, harm in loc.curve()}


def localization_table(runs: Sequence[Study]) -> list[str]:
    """The report's "Where the harm lives" section: per site the seed mean [95 % Student-t interval] of the
    teacher-forced Harm after patching, the unpatched Harm, and the shallowest site that removes it in each seed;
    [] when no seed ran the probe."""
    curves = [c for c in (localization_curve(r) for r in runs) if c]
    if not curves:
        return []
    results = [probe_result("localization", r.probes_dir) for r in runs]
    results = [x for x in results if x is not None]
    s0 = results[0].summary
    clean = seed_stat([x.summary.get("harm_clean") for x in results])
    out = ["## Where the harm lives (localization)", "",
           f"{s0['model']}'s context view fed its own correct no-context reply; the residual at one site replaced at "
           f"every response position by {_donor_text(s0['donor'])}; teacher-forced Harm (docs/method.md, "
           f"\"Interventions and update geometry\"). Unpatched: "
           f"{fmt_stat(clean)}.", "", "| site | Harm after patching |", "|---|---:|"]
    for site in curves[0]:
        out.append(f"| {site} | {fmt_stat(seed_stat([c.get(site) for c in curves]))} |")
    where = [x.summary.get("removed_at") or "none" for x in results]
    out += ["", f"Shallowest site removing {int(100 * s0['removed_share'])} % of the harm, per seed: "
            f"{', '.join(where)}. " + ("Cells: mean over seeds [95 % Student-t interval]." if len(curves) > 1 else
                                       "One seed: no interval."), ""]
    return out


def _donor_text(donor: str) -> str:
    return "its own no-context view" if donor == "x" else f"{donor}'s context view"
