"""The claims table: one row per claim of the two papers, the paper's figure, the value measured on this study's runs
(mean and 95 % Student-t interval over seed runs; one run: no interval) and a verdict by a criterion stated in the row.

Verdicts: ``holds``, ``does not hold``, ``not measurable here`` (the artifact is absent, the quantity is undefined, or
the organism cannot answer the question — e.g. "shallow layers" needs at least `MIN_LAYERS_FOR_DEPTH` decoder layers),
``not measurable here (fragile)``. Every criterion is fixed here, in advance, from the papers' wording or the issue's
bar; none is fitted to the runs. Every row is decided by the interval rule (`mechopd.verdicts.decide`): for
``stat OP bar`` with ≥ 2 seeds it holds (does not hold) only when the whole 95 % seed interval of ``stat`` satisfies
(violates) it, else it is fragile; with one seed the value decides, marked. Where two models are compared ``stat`` is
the PAIRED per-seed difference over the seeds where both are defined, e.g. ``d_k = Harm_NCA,k − 0.5·Harm_OPD,k ≤ 0``.
Compound criteria: Kleene AND / OR (`verdicts.all_of`, `verdicts.any_of`).

Every value is read through the typed study (`mechopd.study.Study`), by ROLE (``base``, ``opd``, ``nca``,
``nca_const``, ``ta_opd``), never by a run's name: the removability reports (``Study.eval``), the training logs
(``Study.metrics``: ``grad/cos/<a>__<b>``, ``grad/norm/<term>``, ``kept_fraction``) and the probes' typed results
(`probes.registry.probe_result`, from the probe's registration: the similarity summary's per-layer cosines, the deltas
summary's pooled update norms, the teachability summary's quartile buckets).

    from mechopd.claims import evaluate_claims, claims_markdown
    print(claims_markdown(evaluate_claims(["runs/demo/seed-0", "runs/demo/seed-1"])))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mechopd.claim_rules import (
    MIN_LAYERS_FOR_DEPTH, NOISE_NORM_RATIO, depth_ratio, grad_steps, layer_cosines, lens_kls, mean_cos,
    opd_checkpoint_cos, orthogonality, qk_ratio, quartile_spread, update_norms)
from mechopd.following_claims import FOLLOWING_CLAIMS
from mechopd.probes.registry import probe_result
from mechopd.removability import RegimeThresholds
from mechopd.stats import fmt_stat, seed_stat
from mechopd.study import Study, studies
from mechopd.verdicts import (
    FAILS, HOLDS, NA, NA_CEILING, NA_FRAGILE, RULE, Decision, all_of, any_of, at_ceiling, decide)

__all__ = ["CLAIMS", "Claim", "FAILS", "HOLDS", "NA", "NA_CEILING", "NA_FRAGILE", "claims_json", "claims_markdown",
           "evaluate_claims", "fragile_claims", "grad_steps", "layer_cosines", "lens_kls", "quartile_spread",
           "update_norms"]  # the verdict words and the per-run readers (mechopd.claim_rules) are re-exported

NCA_MAX_ACC_LOSS = 0.05       # the bar: NCA's Acc_x ≥ OPD's − 0.05
HARM_REDUCTION = 0.5          # the bar: NCA's harm ≤ half of OPD's
NCA_COSINE_FLOOR = 0.997      # the paper: NCA ≥ 0.997 at every layer
ORTHOGONAL_ABS_COS = 0.1      # "nearly orthogonal": |cos| ≤ 0.1 (a stated convention; the paper gives no number)


@dataclass
class Claim:
    """One row: ``key``, the claim, the paper's figure, the measured value (text), the verdict, the criterion."""

    key: str
    claim: str
    paper: str
    measured: str
    verdict: str
    criterion: str


# ------------------------------------------------------------------------------------------- per-seed statistics
def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _scaled(k: float, a: float | None) -> float | None:
    return None if a is None else k * a


def _per_seed(stat: dict[str, Any], digits: int = 3) -> str:
    """`` (per seed 0.215, 0.615, 0.665)`` with two or more seeds, else empty."""
    return f" (per seed {', '.join(f'{v:.{digits}f}' for v in stat['values'])})" if stat["n"] >= 2 else ""


def _stat(runs: Sequence[Study], fn: Callable[[Study], float | None]) -> dict[str, Any]:
    return {**seed_stat([fn(r) for r in runs]), "of": len(runs)}  # "of": the study's seed count (verdicts.decide)


def _value(role: str, metric: str) -> Callable[[Study], float | None]:
    return lambda s: s.value(role, metric)


def _seeds(runs: Sequence[Study]) -> str:
    return f"{len(runs)} seed{'s' if len(runs) != 1 else ''}"

# ------------------------------------------------------------------------------------------------------ claims
def _row(key: str, measured: str, d: Decision, crit: str) -> Claim:
    """A row decided by the interval rule: the decision's note (fragile parts, or one seed) joins the measured cell."""
    return Claim(key, "", "", measured + d.note, d.verdict, crit)


def claim_degradation(runs: Sequence[Study]) -> Claim:
    """OPD in regime A: (Acc_x − Acc_xc ≥ drop_min) OR (Harm ≥ harm_high), each by the interval rule, Kleene OR."""
    th = runs[0].thresholds or asdict(RegimeThresholds())
    harm = _stat(runs, _value("opd", "harm"))
    drop = _stat(runs, lambda r: _diff(r.value("opd", "acc_x"), r.value("opd", "acc_xc")))
    crit = f"OPD in regime A: Acc_x − Acc_xc ≥ {th['drop_min']} or Harm ≥ {th['harm_high']}; {RULE}"
    measured = (f"OPD Harm {fmt_stat(harm)}{_per_seed(harm)}, Acc_x − Acc_xc {fmt_stat(drop, signed=True)} "
                f"({_seeds(runs)})")
    if harm["mean"] is None and drop["mean"] is None:  # one defined part can decide the OR (Kleene)
        return Claim("degradation", "", "", measured, NA, crit)
    d = any_of(decide(drop, th["drop_min"], ">=", "Acc_x − Acc_xc"), decide(harm, th["harm_high"], ">=", "Harm"))
    return _row("degradation", measured, d, crit)


def _const_note(runs: Sequence[Study], metric: str, signed: bool = False) -> str:
    const = _stat(runs, _value("nca_const", metric))
    return f"; constant-β NCA {fmt_stat(const, signed=signed)}" if const["mean"] is not None else ""


def claim_nca_removes(runs: Sequence[Study]) -> Claim:
    """Paired per seed: d_k = Harm_NCA,k − 0.5 · Harm_OPD,k ≤ 0 (interval rule); NA when OPD's Harm is 0 or undefined
    in every seed."""
    opd = _stat(runs, _value("opd", "harm"))
    nca = _stat(runs, _value("nca", "harm"))
    diff = _stat(runs, lambda r: _diff(r.value("nca", "harm"), _scaled(HARM_REDUCTION, r.value("opd", "harm"))))
    crit = (f"paired per seed: NCA Harm − {HARM_REDUCTION} × OPD Harm ≤ 0; {RULE}; not measurable when OPD's Harm is "
            "0 or undefined in every seed")
    measured = (f"Harm NCA {fmt_stat(nca)}{_per_seed(nca)} vs OPD {fmt_stat(opd)}{_const_note(runs, 'harm')}; "
                f"NCA − {HARM_REDUCTION} × OPD {fmt_stat(diff, signed=True)}")
    if not any(opd["values"]) or diff["mean"] is None:
        return Claim("nca_removes", "", "", measured, NA, crit)
    return _row("nca_removes", measured, decide(diff, 0.0, "<="), crit)


def claim_nca_keeps(runs: Sequence[Study]) -> Claim:
    """Paired per seed: NCA Acc_x − OPD Acc_x ≥ −0.05 (interval rule); both ≥ 0.995 in every seed: ceiling."""
    diff = _stat(runs, lambda r: _diff(r.value("nca", "acc_x"), r.value("opd", "acc_x")))
    nca = _stat(runs, _value("nca", "acc_x"))
    crit = f"paired per seed: NCA Acc_x − OPD Acc_x ≥ −{NCA_MAX_ACC_LOSS}; {RULE}; both ≥ 0.995 in every seed: ceiling"
    measured = (f"NCA Acc_x {fmt_stat(nca)}{_per_seed(nca)}; NCA − OPD {fmt_stat(diff, signed=True)}"
                f"{_const_note(runs, 'acc_x')}")
    if diff["mean"] is None:
        return Claim("nca_keeps", "", "", measured, NA, crit)
    if at_ceiling((r.value("nca", "acc_x"), r.value("opd", "acc_x")) for r in runs):
        return Claim("nca_keeps", "", "", measured, NA_CEILING, crit)
    return _row("nca_keeps", measured, decide(diff, -NCA_MAX_ACC_LOSS, ">="), crit)


def claim_cosine_order(runs: Sequence[Study]) -> Claim:
    """Cosine c averaged over decoder layers, paired per seed: (c_OPD − c_base > 0) AND (c_NCA − c_OPD > 0)."""
    stats = {m: _stat(runs, lambda r, m=m: mean_cos(r, m)) for m in ("base", "opd", "nca")}
    steps = {f"{hi} − {lo}": _stat(runs, lambda r, lo=lo, hi=hi: _diff(mean_cos(r, hi), mean_cos(r, lo)))
             for lo, hi in (("base", "opd"), ("opd", "nca"))}
    crit = f"cosine averaged over decoder layers, paired per seed: OPD − base > 0 and NCA − OPD > 0; {RULE}"
    measured = ", ".join(f"{m} {fmt_stat(s, 4)}" for m, s in stats.items())
    if any(s["mean"] is None for s in (*stats.values(), *steps.values())):
        return Claim("cosine_order", "", "", measured, NA, crit)
    measured += "; " + ", ".join(f"{k} {fmt_stat(s, 4, True)}" for k, s in steps.items())
    return _row("cosine_order", measured, all_of(*(decide(s, 0.0, ">", k) for k, s in steps.items())), crit)


def claim_nca_cosine(runs: Sequence[Study]) -> Claim:
    """NCA's lowest decoder-layer cosine ≥ 0.997 (interval rule)."""
    low = _stat(runs, lambda r: min(layer_cosines(r, "nca"), default=None))
    crit = f"NCA's lowest decoder-layer cosine ≥ {NCA_COSINE_FLOOR}; {RULE}"
    measured = f"NCA min over layers {fmt_stat(low, 4)}"
    if low["mean"] is None:
        return Claim("nca_cosine", "", "", measured, NA, crit)
    return _row("nca_cosine", measured, decide(low, NCA_COSINE_FLOOR, ">="), crit)


def claim_orthogonal(runs: Sequence[Study]) -> Claim:
    """|cos(∇OPD, ∇NCA)| of the gradients probe at the OPD checkpoint ≤ 0.1 (interval rule); along NCA training:
    shown, not judged."""
    at_opd = {**seed_stat([opd_checkpoint_cos(r) for r in runs]), "of": len(runs)}
    per = [orthogonality(r) for r in runs]
    along = seed_stat([p[0] for p in per])
    crit = (f"at the OPD checkpoint (gradients probe, the paper's reading): |cos| ≤ {ORTHOGONAL_ABS_COS}; {RULE}; a "
            f"norm ratio outside [{NOISE_NORM_RATIO:g}, {1 / NOISE_NORM_RATIO:g}] is noise; along NCA training "
            "shown, not judged")
    measured = (f"at the OPD checkpoint |cos| {fmt_stat(at_opd)}; along NCA training mean |cos| {fmt_stat(along)} "
                f"({sum(p[1] for p in per)} of {sum(p[2] for p in per)} logged steps informative)")
    if at_opd["mean"] is None:
        return Claim("orthogonal", "", "", measured, NA, crit)
    return _row("orthogonal", measured, decide(at_opd, ORTHOGONAL_ABS_COS, "<="), crit)


def claim_shallow(runs: Sequence[Study]) -> Claim:
    """Shallow/deep update ratio > 1 for OPD AND for NCA (interval rule on each); needs ≥ 6 decoder layers."""
    stats = {m: _stat(runs, lambda r, m=m: depth_ratio(r, m)) for m in ("opd", "nca")}
    norms = update_norms(runs[0], "opd")
    depth = len(norms[0]) if norms else 0
    crit = (f"‖ΔW‖/‖W0‖ of the first third of the layers over the last third > 1 for OPD and NCA; {RULE}; needs ≥ "
            f"{MIN_LAYERS_FOR_DEPTH} decoder layers")
    measured = f"{depth} decoder layers; " + ", ".join(f"{m} shallow/deep {fmt_stat(s, 2)}" for m, s in stats.items())
    if any(s["mean"] is None for s in stats.values()):
        return Claim("shallow", "", "", measured, NA, crit)
    return _row("shallow", measured, all_of(*(decide(s, 1.0, ">", m) for m, s in stats.items())), crit)


def claim_qk(runs: Sequence[Study]) -> Claim:
    """q,k / other-projection update ratio > 1 for OPD AND for NCA (interval rule on each)."""
    stats = {m: _stat(runs, lambda r, m=m: qk_ratio(r, m)) for m in ("opd", "nca")}
    crit = f"mean ‖ΔW‖/‖W0‖ of q_proj, k_proj over that of v/o/gate/up/down_proj > 1 for OPD and NCA; {RULE}"
    measured = ", ".join(f"{m} q,k / other {fmt_stat(s, 2)}" for m, s in stats.items())
    if any(s["mean"] is None for s in stats.values()):
        return Claim("qk", "", "", measured, NA, crit)
    return _row("qk", measured, all_of(*(decide(s, 1.0, ">", m) for m, s in stats.items())), crit)


def claim_ta_opd(runs: Sequence[Study]) -> Claim:
    """Paired per seed: TA-OPD Acc_x − OPD Acc_x ≥ 0 (interval rule); both ≥ 0.995 in every seed: ceiling."""
    diff = _stat(runs, lambda r: _diff(r.value("ta_opd", "acc_x"), r.value("opd", "acc_x")))
    kept = _stat(runs, lambda r: r.kept_fraction("ta_opd"))
    crit = f"paired per seed: TA-OPD Acc_x − OPD Acc_x ≥ 0; {RULE}; both ≥ 0.995 in every seed: ceiling"
    measured = (f"TA-OPD − OPD Acc_x {fmt_stat(diff, signed=True)}{_per_seed(diff)} (kept fraction "
                f"{fmt_stat(kept, 3)})")
    both = [(r.value("ta_opd", "acc_x"), r.value("opd", "acc_x")) for r in runs]
    if diff["mean"] is None:
        return Claim("ta_opd", "", "", measured, NA, crit)
    if at_ceiling(both):
        return Claim("ta_opd", "", "", measured, NA_CEILING, crit)
    return _row("ta_opd", measured, decide(diff, 0.0, ">="), crit)


def claim_teachability(runs: Sequence[Study]) -> Claim:
    """Paired per seed: quartile spread of D^L − that of raw KL > 0 (interval rule); NA when the diagnostic is
    degenerate (C carries no information, the rescored model converged)."""
    dl = _stat(runs, lambda r: quartile_spread(r, "DL"))
    kl = _stat(runs, lambda r: quartile_spread(r, "kl_full"))
    diff = _stat(runs, lambda r: _diff(quartile_spread(r, "DL"), quartile_spread(r, "kl_full")))
    crit = (f"mean gain of the top minus the bottom quartile, paired per seed: D^L's spread − raw KL's > 0; {RULE}")
    measured = f"spread D^L {fmt_stat(dl, 3)} vs raw KL {fmt_stat(kl, 3)}; difference {fmt_stat(diff, 3, True)}"
    limits = [getattr(t, "degeneracy", None) or {} for t in (probe_result("teachability", r.probes_dir) for r in runs)
              if t is not None]
    reasons = sorted({why for d in limits for why in d.get("reasons", [])})
    if reasons:  # the diagnostic cannot speak on this bank / checkpoint (docs/method.md §7)
        return Claim("teachability", "", "", measured + "; " + "; ".join(reasons), NA, crit + "; not measurable "
                     "when C carries no information or the rescored model has converged")
    if diff["mean"] is None:
        return Claim("teachability", "", "", measured, NA, crit)
    return _row("teachability", measured, decide(diff, 0.0, ">"), crit)


def claim_nca_lens(runs: Sequence[Study]) -> Claim:
    """Per site i (each decoder layer, the output), paired per seed: d_i = KL_NCA,i − KL_OPD,i < 0; AND over sites."""
    per = {m: [lens_kls(r, m) for r in runs] for m in ("opd", "nca")}
    crit = (f"logit-lens KL(p_c ‖ p_x) between views, paired per seed: NCA − OPD < 0 at every layer and the output "
            f"(all sites); {RULE}")
    if any(not v for runs_ in per.values() for v in runs_):
        return Claim("nca_lens", "", "", "n/a", NA, crit)
    n_sites = min(len(v) for runs_ in per.values() for v in runs_)
    sites = [{**seed_stat([n[i] - o[i] for n, o in zip(per["nca"], per["opd"])]), "of": len(runs)}
             for i in range(n_sites)]
    names = [f"layer {i}" for i in range(n_sites - 1)] + ["output"]
    ratio = _stat(runs, lambda r: sum(lens_kls(r, "nca")) / max(sum(lens_kls(r, "opd")), 1e-300))
    d = all_of(*(decide(s, 0.0, "<", name) for s, name in zip(sites, names)))
    below = sum(s["mean"] is not None and s["mean"] < 0 for s in sites)  # a site undefined in every seed: not below
    measured = (f"NCA/OPD lens KL (summed over depth) {fmt_stat(ratio, 3)}; NCA below OPD (seed mean) at {below} of "
                f"{n_sites} sites")
    return _row("nca_lens", measured, d, crit)


# (key, claim, paper's figure, evaluator)
CLAIMS: tuple[tuple[str, str, str, Callable[[Sequence[Study]], Claim]], ...] = (
    ("degradation", "OPD causes context-induced degradation", "games: Harm 22–41 %; regime A in 7 of 12 settings",
     claim_degradation),
    ("nca_removes", "NCA removes the degradation", "Harm 15.7 % → 1.6 % (Llama-3.2-3B MedMCQA); lower in 11 of 12",
     claim_nca_removes),
    ("nca_keeps", "NCA keeps or improves no-context accuracy", "12-setting mean Acc_x: NCA 70 vs OPD 68",
     claim_nca_keeps),
    ("cosine_order", "two-view hidden-state cosine: base < OPD < NCA", "base ≈ 0.953, OPD ≈ 0.985 (Qwen3-4B)",
     claim_cosine_order),
    ("nca_cosine", "NCA's two-view cosine ≥ 0.997 at every layer", "NCA ≥ 0.997 at every layer", claim_nca_cosine),
    ("nca_lens", "NCA's removability holds at the level of representations (logit lens, every depth)",
     "removability “at the level of representations”: NCA ≥ 0.997 cosine at every layer", claim_nca_lens),
    ("orthogonal", "OPD and NCA gradients nearly orthogonal at an OPD-converged checkpoint",
     "“nearly orthogonal” (no number)",
     claim_orthogonal),
    ("shallow", "updates concentrated in shallow layers", "shallow layers (36-layer Qwen3-4B; no number)",
     claim_shallow),
    ("qk", "updates concentrated in q_proj / k_proj", "q_proj, k_proj (no number)", claim_qk),
    ("ta_opd", "TA-OPD at ρ = 10 % ≥ full OPD", "44.89 vs 42.37 (Qwen3-4B→1.7B); 4 of 4 pairs", claim_ta_opd),
    ("teachability", "D^L predicts the fixed-context gain better than raw KL",
     "gain rises with D^L; high-support gap ≈ +0.08", claim_teachability),
    *((key, claim, paper, lambda runs, fn=fn, key=key: Claim(key, "", "", **fn(runs)))
      for key, claim, paper, fn in FOLLOWING_CLAIMS),
)


def evaluate_claims(runs: Sequence[str | Path | Study], study: str | Path | None = None) -> list[Claim]:
    """Every claim of `CLAIMS` on the given seed runs of one study (one run: single-seed values, no interval).
    ``runs``: run dirs or `Study` objects; ``study``: a study YAML applied to every run dir (roles -> run names)."""
    seeds = studies(runs, study)
    out = []
    for key, claim, paper, fn in CLAIMS:
        row = fn(seeds)
        row.key, row.claim, row.paper = key, claim, paper
        out.append(row)
    return out


def claims_markdown(claims: Sequence[Claim]) -> str:
    """The claims table (markdown) with a line on how the intervals are made."""
    lines = ["| claim | paper | measured here | verdict | criterion |", "|---|---|---|:---:|---|"]
    for c in claims:
        cells = [c.claim, c.paper, c.measured, f"**{c.verdict}**", c.criterion]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    lines += ["", "Measured values: mean over seed runs with a 95 % Student-t interval over seeds (none with one "
              "seed). Verdicts by the interval rule: with ≥ 2 seeds a criterion holds (does not hold) only when the "
              "whole 95 % Student-t seed interval of its statistic (the paired per-seed difference where two models "
              f"are compared) is on the passing (failing) side of its bar, else **{NA_FRAGILE}**; with one seed the "
              "value itself decides, marked; compound criteria by three-valued AND / OR. Criteria fixed in "
              "`mechopd/claims.py` before any run."]
    return "\n".join(lines) + "\n"


def fragile_claims(claims: Sequence[Claim]) -> list[Claim]:
    """The rows whose verdict is `NA_FRAGILE`: the seed interval holds the bar, more seeds could settle them."""
    return [c for c in claims if c.verdict == NA_FRAGILE]


def claims_json(claims: Sequence[Claim]) -> list[dict[str, str]]:
    return [asdict(c) for c in claims]
