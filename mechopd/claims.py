"""The claims table: one row per claim of the two papers, the paper's figure, the value measured on this study's runs
(mean and 95 % Student-t interval over seed runs; one run: no interval) and a verdict by a criterion stated in the row.

Verdicts: ``holds``, ``does not hold``, ``not measurable here`` (the artifact is absent, the quantity is undefined, or
the organism cannot answer the question — e.g. "shallow layers" needs at least `MIN_LAYERS_FOR_DEPTH` decoder layers).
Every criterion is fixed here, in advance, from the papers' wording or the issue's bar; none is fitted to the runs.
Verdicts are taken on the seed means; where a criterion also needs the interval it says so.

Every value is read through the typed study (`mechopd.study.Study`), by ROLE (``base``, ``opd``, ``nca``,
``nca_const``, ``ta_opd``), never by a run's name: the removability reports (``Study.eval``), the training logs
(``Study.metrics``: ``grad/cos/<a>__<b>``, ``grad/norm/<term>``, ``kept_fraction``) and the probes' typed results
(`probes.registry.probe_result`, from the probe's registration: the similarity summary's per-layer cosines, the deltas
summary's pooled update norms, the teachability summary's quartile buckets).

    from mechopd.claims import evaluate_claims, claims_markdown
    print(claims_markdown(evaluate_claims(["runs/demo/seed-0", "runs/demo/seed-1"])))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mechopd.following_claims import FOLLOWING_CLAIMS
from mechopd.probes.registry import probe_result
from mechopd.removability import RegimeThresholds
from mechopd.stats import fmt_stat, seed_stat
from mechopd.study import Study, studies

from mechopd.verdicts import FAILS, HOLDS, NA, NA_CEILING, at_ceiling, fragility  # noqa: E402,F401
NCA_MAX_ACC_LOSS = 0.05       # the bar: NCA's Acc_x ≥ OPD's − 0.05
HARM_REDUCTION = 0.5          # the bar: NCA's harm ≤ half of OPD's
NCA_COSINE_FLOOR = 0.997      # the paper: NCA ≥ 0.997 at every layer
ORTHOGONAL_ABS_COS = 0.1      # "nearly orthogonal": |cos| ≤ 0.1 (a stated convention; the paper gives no number)
NOISE_NORM_RATIO = 1e-3       # a gradient below 1e-3 of the other's norm is noise: that step is left out
MIN_LAYERS_FOR_DEPTH = 6      # "shallow vs deep" needs at least two layers in each third of the depth
QK = ("q_proj", "k_proj")
OTHER_PROJ = ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class Claim:
    """One row: ``key``, the claim, the paper's figure, the measured value (text), the verdict, the criterion."""

    key: str
    claim: str
    paper: str
    measured: str
    verdict: str
    criterion: str


# ------------------------------------------------------------------------------------------------ per-run values
def _as_study(study: Study | str | Path) -> Study:
    return study if isinstance(study, Study) else Study.load(study)


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def layer_cosines(study: Study | Path, role: str) -> list[float]:
    """Per-token mean two-view cosine of ``role`` after each decoder layer, in layer order (the similarity probe's
    typed result); [] when the probe did not run or the study lacks the role."""
    study = _as_study(study)
    result, name = probe_result("similarity", study.probes_dir), study.name(role)
    return [] if result is None or name is None else result.layer_cosines(name)


def grad_steps(study: Study | Path, role: str, a: str = "opd", b: str = "nca") -> list[tuple[int, float, float]]:
    """(step, cos(∇a, ∇b), ‖∇a‖/‖∇b‖) on every gradient-statistics step of the training log of ``role`` (steps
    where the cosine is undefined — a term with zero weight — are left out)."""
    study = _as_study(study)
    out = []
    for r in study.metrics(role):
        cos = r.get(f"grad/cos/{a}__{b}", r.get(f"grad/cos/{b}__{a}"))
        na, nb = r.get(f"grad/norm/{a}"), r.get(f"grad/norm/{b}")
        if cos is None or na is None or nb is None:
            continue
        out.append((int(r["step"]), float(cos), float(na) / float(nb) if nb else math.inf))
    return out


def update_norms(study: Study | Path, role: str) -> tuple[dict[int, float], dict[str, float]] | None:
    """Relative update ‖ΔW‖/‖W0‖ of ``role`` vs the base, pooled per decoder layer and per module (the deltas
    probe's typed result, `DeltaSummary.update_norms`); None when the probe did not run."""
    study = _as_study(study)
    result, name, base = probe_result("deltas", study.probes_dir), study.name(role), study.name("base")
    return None if result is None or name is None else result.update_norms(name, base or "base")


def _pooled(norms: dict[str, float], names: Sequence[str]) -> float | None:
    vals = [norms[n] for n in names if n in norms and math.isfinite(norms[n])]
    return sum(vals) / len(vals) if vals else None


def quartile_spread(study: Study | Path, signal: str) -> float | None:
    """Mean absolute gain in the top quartile of `signal` minus the bottom quartile (teachability buckets)."""
    study = _as_study(study)
    result = probe_result("teachability", study.probes_dir)
    return None if result is None else result.quartile_spread(signal)


def _per_seed(stat: dict[str, Any], digits: int = 3) -> str:
    """`` (per seed 0.215, 0.615, 0.665)`` with two or more seeds, else empty."""
    return f" (per seed {', '.join(f'{v:.{digits}f}' for v in stat['values'])})" if stat["n"] >= 2 else ""


def _stat(runs: Sequence[Study], fn: Callable[[Study], float | None]) -> dict[str, Any]:
    return seed_stat([fn(r) for r in runs])


def _value(role: str, metric: str) -> Callable[[Study], float | None]:
    return lambda s: s.value(role, metric)


def _seeds(runs: Sequence[Study]) -> str:
    return f"{len(runs)} seed{'s' if len(runs) != 1 else ''}"


# ------------------------------------------------------------------------------------------------------ claims
def claim_degradation(runs: Sequence[Study]) -> Claim:
    th = runs[0].thresholds or asdict(RegimeThresholds())
    harm = _stat(runs, _value("opd", "harm"))
    drop = _stat(runs, lambda r: _diff(r.value("opd", "acc_x"), r.value("opd", "acc_xc")))
    crit = (f"OPD in regime A on the seed means (Acc_x − Acc_xc ≥ {th['drop_min']} or Harm ≥ {th['harm_high']}), "
            "and Harm's interval above 0 when there are ≥ 2 seeds")
    measured = (f"OPD Harm {fmt_stat(harm)}{_per_seed(harm)}, Acc_x − Acc_xc {fmt_stat(drop, signed=True)} "
                f"({_seeds(runs)})")
    if harm["mean"] is None or drop["mean"] is None:
        return Claim("degradation", "", "", measured, NA, crit)
    regime_a = drop["mean"] >= th["drop_min"] - 1e-9 or harm["mean"] >= th["harm_high"] - 1e-9
    above = harm["low"] is None or harm["low"] > 0
    measured += fragility(harm, th["harm_high"]) if harm["mean"] >= th["harm_high"] - 1e-9 else fragility(
        drop, th["drop_min"])
    return Claim("degradation", "", "", measured, HOLDS if regime_a and above else FAILS, crit)


def _const_note(runs: Sequence[Study], metric: str, signed: bool = False) -> str:
    const = _stat(runs, _value("nca_const", metric))
    return f"; constant-β NCA {fmt_stat(const, signed=signed)}" if const["mean"] is not None else ""


def claim_nca_removes(runs: Sequence[Study]) -> Claim:
    opd = _stat(runs, _value("opd", "harm"))
    nca = _stat(runs, _value("nca", "harm"))
    crit = f"NCA's mean Harm ≤ {HARM_REDUCTION} × OPD's; not measurable when OPD's Harm is 0 or undefined"
    measured = f"Harm NCA {fmt_stat(nca)}{_per_seed(nca)} vs OPD {fmt_stat(opd)}{_const_note(runs, 'harm')}"
    if opd["mean"] is None or nca["mean"] is None or opd["mean"] == 0:
        return Claim("nca_removes", "", "", measured, NA, crit)
    return Claim("nca_removes", "", "", measured + fragility(nca, HARM_REDUCTION * opd["mean"]),
                 HOLDS if nca["mean"] <= HARM_REDUCTION * opd["mean"] else FAILS, crit)


def claim_nca_keeps(runs: Sequence[Study]) -> Claim:
    diff = _stat(runs, lambda r: _diff(r.value("nca", "acc_x"), r.value("opd", "acc_x")))
    nca = _stat(runs, _value("nca", "acc_x"))
    crit = f"mean (NCA Acc_x − OPD Acc_x) ≥ −{NCA_MAX_ACC_LOSS}; both ≥ 0.995 in every seed: ceiling"
    measured = (f"NCA Acc_x {fmt_stat(nca)}{_per_seed(nca)}; NCA − OPD {fmt_stat(diff, signed=True)}"
                f"{_const_note(runs, 'acc_x')}")
    if diff["mean"] is None:
        return Claim("nca_keeps", "", "", measured, NA, crit)
    if at_ceiling((r.value("nca", "acc_x"), r.value("opd", "acc_x")) for r in runs):
        return Claim("nca_keeps", "", "", measured, NA_CEILING, crit)
    return Claim("nca_keeps", "", "", measured + fragility(diff, -NCA_MAX_ACC_LOSS),
                 HOLDS if diff["mean"] >= -NCA_MAX_ACC_LOSS - 1e-9 else FAILS, crit)


def _mean_cos(study: Study, role: str) -> float | None:
    vals = layer_cosines(study, role)
    return sum(vals) / len(vals) if vals else None


def claim_cosine_order(runs: Sequence[Study]) -> Claim:
    stats = {m: _stat(runs, lambda r, m=m: _mean_cos(r, m)) for m in ("base", "opd", "nca")}
    crit = "seed means of the cosine averaged over decoder layers: base < OPD < NCA"
    measured = ", ".join(f"{m} {fmt_stat(s, 4)}" for m, s in stats.items())
    if any(s["mean"] is None for s in stats.values()):
        return Claim("cosine_order", "", "", measured, NA, crit)
    b, o, n = (stats[m]["mean"] for m in ("base", "opd", "nca"))
    return Claim("cosine_order", "", "", measured, HOLDS if b < o < n else FAILS, crit)


def claim_nca_cosine(runs: Sequence[Study]) -> Claim:
    low = _stat(runs, lambda r: min(layer_cosines(r, "nca"), default=None))
    crit = f"seed mean of NCA's lowest decoder-layer cosine ≥ {NCA_COSINE_FLOOR}"
    measured = f"NCA min over layers {fmt_stat(low, 4)}"
    if low["mean"] is None:
        return Claim("nca_cosine", "", "", measured, NA, crit)
    return Claim("nca_cosine", "", "", measured, HOLDS if low["mean"] >= NCA_COSINE_FLOOR else FAILS, crit)


def _orthogonality(study: Study, role: str = "nca") -> tuple[float | None, int, int]:
    """Mean |cos(∇OPD, ∇NCA)| over the informative gradient-statistics steps of ``role``'s training run."""
    steps = grad_steps(study, role)
    kept = [abs(c) for _, c, ratio in steps if NOISE_NORM_RATIO <= ratio <= 1 / NOISE_NORM_RATIO]
    return (sum(kept) / len(kept) if kept else None), len(kept), len(steps)


def _opd_checkpoint_cos(study: Study) -> float | None:
    """|cos(∇OPD, ∇NCA)| of the gradients probe at the OPD checkpoint (the paper's reading); None without it or when
    one gradient is noise next to the other (norm ratio outside [1e-3, 1e3])."""
    g = probe_result("gradients", study.probes_dir)
    ok = g is not None and g.model == study.name("opd") and math.isfinite(g.cos) and \
        NOISE_NORM_RATIO <= g.norm_ratio <= 1 / NOISE_NORM_RATIO
    return abs(g.cos) if ok else None


def claim_orthogonal(runs: Sequence[Study]) -> Claim:
    at_opd = seed_stat([_opd_checkpoint_cos(r) for r in runs])
    per = [_orthogonality(r) for r in runs]
    along = seed_stat([p[0] for p in per])
    crit = (f"at the OPD checkpoint (gradients probe, the paper's reading): seed mean |cos| ≤ {ORTHOGONAL_ABS_COS}, "
            f"a norm ratio outside [{NOISE_NORM_RATIO:g}, {1 / NOISE_NORM_RATIO:g}] is noise; along NCA training "
            "shown, not judged")
    measured = (f"at the OPD checkpoint |cos| {fmt_stat(at_opd)}; along NCA training mean |cos| {fmt_stat(along)} "
                f"({sum(p[1] for p in per)} of {sum(p[2] for p in per)} logged steps informative)")
    if at_opd["mean"] is None:
        return Claim("orthogonal", "", "", measured, NA, crit)
    return Claim("orthogonal", "", "", measured, HOLDS if at_opd["mean"] <= ORTHOGONAL_ABS_COS else FAILS, crit)


def _depth_ratio(study: Study, role: str) -> float | None:
    norms = update_norms(study, role)
    if norms is None or len(norms[0]) < MIN_LAYERS_FOR_DEPTH:
        return None
    vals = list(norms[0].values())
    third = len(vals) // 3
    return (sum(vals[:third]) / third) / (sum(vals[-third:]) / third)


def claim_shallow(runs: Sequence[Study]) -> Claim:
    stats = {m: _stat(runs, lambda r, m=m: _depth_ratio(r, m)) for m in ("opd", "nca")}
    norms = update_norms(runs[0], "opd")
    depth = len(norms[0]) if norms else 0
    crit = (f"‖ΔW‖/‖W0‖ of the first third of the layers over the last third > 1 for OPD and NCA; needs ≥ "
            f"{MIN_LAYERS_FOR_DEPTH} decoder layers")
    measured = f"{depth} decoder layers; " + ", ".join(f"{m} shallow/deep {fmt_stat(s, 2)}" for m, s in stats.items())
    if any(s["mean"] is None for s in stats.values()):
        return Claim("shallow", "", "", measured, NA, crit)
    return Claim("shallow", "", "", measured, HOLDS if all(s["mean"] > 1 for s in stats.values()) else FAILS, crit)


def _qk_ratio(study: Study, role: str) -> float | None:
    norms = update_norms(study, role)
    if norms is None:
        return None
    qk, other = _pooled(norms[1], QK), _pooled(norms[1], OTHER_PROJ)
    return None if qk is None or not other else qk / other


def claim_qk(runs: Sequence[Study]) -> Claim:
    stats = {m: _stat(runs, lambda r, m=m: _qk_ratio(r, m)) for m in ("opd", "nca")}
    crit = "mean ‖ΔW‖/‖W0‖ of q_proj, k_proj over that of v/o/gate/up/down_proj > 1 for OPD and NCA"
    measured = ", ".join(f"{m} q,k / other {fmt_stat(s, 2)}" for m, s in stats.items())
    if any(s["mean"] is None for s in stats.values()):
        return Claim("qk", "", "", measured, NA, crit)
    return Claim("qk", "", "", measured, HOLDS if all(s["mean"] > 1 for s in stats.values()) else FAILS, crit)


def claim_ta_opd(runs: Sequence[Study]) -> Claim:
    diff = _stat(runs, lambda r: _diff(r.value("ta_opd", "acc_x"), r.value("opd", "acc_x")))
    kept = _stat(runs, lambda r: r.kept_fraction("ta_opd"))
    crit = "mean (TA-OPD Acc_x − OPD Acc_x) ≥ 0; both ≥ 0.995 in every seed: ceiling"
    measured = (f"TA-OPD − OPD Acc_x {fmt_stat(diff, signed=True)}{_per_seed(diff)} (kept fraction "
                f"{fmt_stat(kept, 3)})")
    both = [(r.value("ta_opd", "acc_x"), r.value("opd", "acc_x")) for r in runs]
    if diff["mean"] is None:
        return Claim("ta_opd", "", "", measured, NA, crit)
    if at_ceiling(both):
        return Claim("ta_opd", "", "", measured, NA_CEILING, crit)
    return Claim("ta_opd", "", "", measured, HOLDS if diff["mean"] >= -1e-9 else FAILS, crit)


def claim_teachability(runs: Sequence[Study]) -> Claim:
    dl = _stat(runs, lambda r: quartile_spread(r, "DL"))
    kl = _stat(runs, lambda r: quartile_spread(r, "kl_full"))
    diff = _stat(runs, lambda r: _diff(quartile_spread(r, "DL"), quartile_spread(r, "kl_full")))
    crit = "mean gain of the top minus the bottom quartile, D^L's spread > raw KL's (seed mean of the difference > 0)"
    measured = f"spread D^L {fmt_stat(dl, 3)} vs raw KL {fmt_stat(kl, 3)}; difference {fmt_stat(diff, 3, True)}"
    limits = [getattr(t, "degeneracy", None) or {} for t in (probe_result("teachability", r.probes_dir) for r in runs)
              if t is not None]
    reasons = sorted({why for d in limits for why in d.get("reasons", [])})
    if reasons:  # the diagnostic cannot speak on this bank / checkpoint (docs/method.md §7)
        return Claim("teachability", "", "", measured + "; " + "; ".join(reasons), NA, crit + "; not measurable "
                     "when C carries no information or the rescored model has converged")
    if diff["mean"] is None:
        return Claim("teachability", "", "", measured, NA, crit)
    return Claim("teachability", "", "", measured, HOLDS if diff["mean"] > 0 else FAILS, crit)


def lens_kls(study: Study | Path, role: str) -> list[float]:
    """Lens KL(p_c ‖ p_x) between the views of ``role`` after each decoder layer and at the output, in depth order
    (the lens probe's typed result; the embedding is left out: identical ids give 0 there); [] when the probe did not
    run or the study lacks the role."""
    study = _as_study(study)
    result, name = probe_result("lens", study.probes_dir), study.name(role)
    return [] if result is None or name is None else result.kl_by_depth(name)


def claim_nca_lens(runs: Sequence[Study]) -> Claim:
    per = {m: [lens_kls(r, m) for r in runs] for m in ("opd", "nca")}
    crit = "seed means of the logit-lens KL(p_c ‖ p_x) between views: NCA's below OPD's at every layer and the output"
    if any(not v for runs_ in per.values() for v in runs_):
        return Claim("nca_lens", "", "", "n/a", NA, crit)
    site_means = {m: [sum(col) / len(col) for col in zip(*v)] for m, v in per.items()}
    ratio = _stat(runs, lambda r: sum(lens_kls(r, "nca")) / max(sum(lens_kls(r, "opd")), 1e-300))
    below = sum(n < o for n, o in zip(site_means["nca"], site_means["opd"]))
    measured = f"NCA/OPD lens KL (summed over depth) {fmt_stat(ratio, 3)}; NCA below at {below} of " \
               f"{len(site_means['nca'])} sites"
    return Claim("nca_lens", "", "", measured, HOLDS if below == len(site_means["nca"]) else FAILS, crit)


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
              "seed). Verdicts on the seed means by the stated criterion, fixed in `mechopd/claims.py` before any run."]
    return "\n".join(lines) + "\n"


def claims_json(claims: Sequence[Claim]) -> list[dict[str, str]]:
    return [asdict(c) for c in claims]
