"""The claims table: one row per claim of the two papers (and of this suite's context-following study), the paper's
figure, the value measured on this study's seed runs, a verdict by a criterion fixed in the row, and a one-sentence
finding (docs/method.md §8).

Verdicts: ``holds``, ``does not hold``, ``not measurable here`` (with its reason: the artifact is absent, the quantity
is undefined, the organism cannot answer the question, the base model does not use the context), and
``not measurable here (fragile)`` (the interval holds the bar). Every row is decided by the interval rule
(`mechopd.report.verdicts.decide`): it holds (does not hold) only when the whole 95 % interval of its statistic is on the
passing (failing) side of the bar. The statistics (docs/method.md §8):

  * bounded item-level quantities (Acc, Harm, follow_other and their paired differences): mean over seeds with a
    seeds × items interval (`mechopd.report.seed_items`: Student-t over seeds, each seed's item noise as its floor,
    clipped to [0, 1]), calibrated for few seeds (bench/coverage.py); two models of a seed compared item by item;
  * "no worse than" claims as NON-INFERIORITY tests with a stated margin: the interval of the paired difference
    must lie above −margin; at the ceiling (both models right on every item) that is shown, never assumed;
  * positive probe quantities on paired log ratios, cosines on log(1 − c) (`mechopd.report.claims_probes`);
  * the FLOOR rule, study-wide: when the base model does not use the context (its Acc_xc − Acc_x does not clear
    `FLOOR_GAIN`), no row is decided — there is no context effect to distil, remove or harm.

Every value is read through the typed study (`mechopd.runset.RunSet`) by ROLE, never by a run's name.

    from mechopd.report.claims import evaluate_claims, claims_markdown
    print(claims_markdown(evaluate_claims(["runs/demo/seed-0", "runs/demo/seed-1"])))
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mechopd.core.stats import CI, exact_se, fmt_stat
from mechopd.evaluation.removability import RegimeThresholds
from mechopd.report import claims_probes as cp
from mechopd.report import preconditions as pre
from mechopd.report.following_claims import FOLLOWING_CLAIMS
from mechopd.report.mechanism_claims import MECHANISM_CLAIMS
from mechopd.report.multiplicity import holm, multiplicity_note
from mechopd.report.seed_items import diff_stat, eval_arrays, metric_of, metric_stat, paired_stat
from mechopd.report.verdicts import (
    CEILING,
    FAILS,
    HOLDS,
    NA,
    NA_CEILING,
    NA_FRAGILE,
    RULE,
    Decision,
    all_of,
    any_of,
    decide,
)
from mechopd.runset import RunSet, runsets

__all__ = ["CLAIMS", "Claim", "claims_json", "claims_markdown", "evaluate_claims", "findings", "fragile_claims"]

NCA_MAX_ACC_LOSS = 0.05  # non-inferiority margin: NCA's Acc_x ≥ OPD's − 0.05
TA_OPD_MARGIN = 0.05  # non-inferiority margin: TA-OPD's Acc_x ≥ OPD's − 0.05
HARM_REDUCTION = 0.5  # NCA's harm ≤ half of OPD's
FLOOR_GAIN = 0.2  # the base must use the context: Acc_xc − Acc_x ≥ 0.2 (interval rule)
NA_FLOOR = NA + " (floor: the base does not use the context)"
NA_COLLAPSED = pre.NA_COLLAPSED


@dataclass
class Claim:
    """One row: ``key``, the claim, the paper's figure, the measured value (text), the verdict, the criterion, and a
    short ``headline`` (the number a finding cites)."""

    key: str
    claim: str
    paper: str
    measured: str
    verdict: str
    criterion: str
    headline: str = ""
    p: float | None = None  # the decision's one-sided p (Holm over the confirmatory rows)
    family: str = ""  # "confirmatory" (Holm) or "exploratory" (`multiplicity.holm`)


def _row(key: str, measured: str, d: Decision | str, crit: str, headline: str = "") -> Claim:
    """A decided row: a `Decision`'s note (fragile parts, or one seed) joins the measured cell."""
    if isinstance(d, str):
        return Claim(key, "", "", measured, d, crit, headline)
    return Claim(key, "", "", measured + d.note, d.verdict, crit, headline, d.p)


def _per_seed(stat: dict[str, Any], digits: int = 3) -> str:
    """`` (per seed 0.215, 0.615, 0.665)`` with two or more seeds, else empty."""
    return f" (per seed {', '.join(f'{v:.{digits}f}' for v in stat['values'])})" if stat["n"] >= 2 else ""


def _seeds(runs: Sequence[RunSet]) -> str:
    return f"{len(runs)} seed{'s' if len(runs) != 1 else ''}"


def _thresholds(runs: Sequence[RunSet]) -> dict[str, float]:
    return runs[0].thresholds or asdict(RegimeThresholds())


# ------------------------------------------------------------------------------------------------ removability rows
def degradation(runs: Sequence[RunSet]) -> tuple[Decision, dict[str, Any], dict[str, Any]]:
    """OPD in regime A: (Acc_x − Acc_xc ≥ drop_min) OR (Harm − the base's Harm ≥ harm_high, paired per seed and item;
    a base right on no item has no Harm: 0), each by the interval rule on the seeds × items interval, Kleene OR; the
    Harm part needs `pre.K_HARM` items right without the context (`pre.harm_units`); returns (decision, excess-Harm
    stat, drop stat)."""
    th = _thresholds(runs)
    excess = harm_excess(runs)
    drop = paired_stat(runs, ("opd",), lambda a: metric_of(a, "acc_x") - metric_of(a, "acc_xc"), bounds=(-1.0, 1.0))
    if excess["mean"] is None and drop["mean"] is None:
        return Decision(NA), excess, drop
    few = pre.harm_units(runs)
    harm = Decision(few[0]) if few else decide(excess, th["harm_high"], ">=", "Harm − base's")
    return any_of(decide(drop, th["drop_min"], ">=", "Acc_x − Acc_xc"), harm), excess, drop


def harm_excess(runs: Sequence[RunSet]) -> dict[str, Any]:
    """OPD's Harm − the base's, paired per seed and item; where no item varies it (both at 0 or 1 in every seed), the
    difference of the two exact bounds (the base's undefined Harm: 0)."""
    st = paired_stat(runs, ("opd", "base"), _harm_excess)
    if not st.get("degenerate"):
        return st
    opd, base = metric_stat(runs, "opd", "harm"), metric_stat(runs, "base", "harm")
    b_low, b_high = (0.0, 0.0) if base["mean"] is None else (base["low"], base["high"])
    if opd.get("exact") and (base["mean"] is None or base.get("exact")):
        st.pop("degenerate")
        st.update(low=opd["low"] - b_high, high=opd["high"] - b_low, exact=f"{opd['exact']} against the base's")
        exact_se(st, CI)
    return st


def _harm_excess(a: tuple[Any, ...]) -> Any:
    """OPD's Harm minus the base's on the same items (the base's undefined Harm — no item right — counts as 0)."""
    return metric_of(a, "harm", 0) - np.nan_to_num(metric_of(a, "harm", 1), nan=0.0)


def claim_degradation(runs: Sequence[RunSet]) -> Claim:
    th = _thresholds(runs)
    d, excess, drop = degradation(runs)
    harm, base = metric_stat(runs, "opd", "harm"), metric_stat(runs, "base", "harm")
    crit = (
        f"OPD in regime A: Acc_x − Acc_xc ≥ {th['drop_min']} or Harm − the base's Harm ≥ {th['harm_high']} (paired "
        f"per seed and item; Harm needs ≥ {pre.K_HARM} items right without the context); {RULE}"
    )
    measured = (
        f"OPD Harm {fmt_stat(harm)}{_per_seed(harm)} on {pre.right_items(runs)} right items, base Harm "
        f"{fmt_stat(base)}, OPD − base {fmt_stat(excess, signed=True)}, Acc_x − Acc_xc {fmt_stat(drop, signed=True)} "
        f"({_seeds(runs)})"
    )
    few = pre.harm_units(runs)
    return _row("degradation", measured + (f"; {few[1]}" if few else ""), d, crit, f"OPD's Harm {fmt_stat(harm)}")


def claim_nca_removes(runs: Sequence[RunSet]) -> Claim:
    """Given OPD's degradation and an NCA neither collapsed nor deaf (`pre.nca_alive`): paired per seed and item,
    Harm_NCA − 0.5 · Harm_OPD ≤ 0 AND Harm_NCA − Harm_OPD < 0. Without a degradation to remove: not measurable."""
    nca = metric_stat(runs, "nca", "harm")
    half = diff_stat(runs, "nca", "opd", "harm", HARM_REDUCTION)
    lower = diff_stat(runs, "nca", "opd", "harm")
    crit = (
        f"given OPD's degradation (the row above) and an NCA neither collapsed nor deaf (Acc_xc ≥ min(base's, OPD's) "
        f"− {pre.VIEW_MARGIN:g}, follow_other ≥ base's − {pre.VIEW_MARGIN:g}: a deaf view harms nothing), paired per "
        f"seed and item: NCA Harm − {HARM_REDUCTION} × OPD Harm ≤ 0 and NCA Harm − OPD Harm < 0; {RULE}"
    )
    measured = (
        f"Harm NCA {fmt_stat(nca)}{_per_seed(nca)}; NCA − {HARM_REDUCTION} × OPD "
        f"{fmt_stat(half, signed=True)}; NCA − OPD {fmt_stat(lower, signed=True)}"
    )
    acc = metric_stat(runs, "nca", "acc_xc")
    measured += f"; NCA Acc_xc {fmt_stat(acc)}"
    gate = degradation(runs)[0]
    if gate.verdict == FAILS:
        return _row("nca_removes", measured, NA + " (OPD shows no degradation to remove)", crit)
    if dead := pre.nca_alive(runs):  # a collapsed NCA right on nothing has no Harm at all: checked first
        return _row("nca_removes", f"{measured}; {dead[1]}", dead[0], crit)
    if half["mean"] is None or lower["mean"] is None:  # a role or its items missing: nothing to check
        return _row("nca_removes", measured, NA, crit)
    if few := pre.harm_units(runs, "nca"):
        return _row("nca_removes", f"{measured}; {few[1]}", few[0], crit)
    if gate.verdict == NA:
        return _row("nca_removes", measured, NA, crit)
    d = all_of(gate, decide(half, 0.0, "<=", f"NCA − {HARM_REDUCTION} × OPD"), decide(lower, 0.0, "<", "NCA − OPD"))
    return _row("nca_removes", measured, d, crit, f"NCA's Harm {fmt_stat(nca)} against OPD's")


def _noninferior(runs: Sequence[RunSet], key: str, role: str, margin: float, what: str) -> Claim:
    """Non-inferiority, paired per seed and item: Acc_x(role) − Acc_x(OPD) ≥ −margin (interval rule)."""
    diff = diff_stat(runs, role, "opd", "acc_x")
    acc = metric_stat(runs, role, "acc_x")
    crit = (
        f"non-inferiority, paired per seed and item: {what} Acc_x − OPD Acc_x ≥ −{margin} (margin {margin}); {RULE}; "
        f"OPD must have internalised ≥ {pre.MOVED_SHARE:g} of the base's context gain; "
        f"{what} Acc_x ≥ {CEILING} (mean over seeds): ceiling, the comparison cannot fail"
    )
    measured = f"{what} Acc_x {fmt_stat(acc)}{_per_seed(acc)}; {what} − OPD {fmt_stat(diff, signed=True)}"
    if diff["mean"] is None:
        return _row(key, measured, NA, crit)
    unmoved = pre.student_moved(runs)  # 0 against 0 is no evidence of keeping anything
    if unmoved:
        return _row(key, f"{measured}; {unmoved[1]}", unmoved[0], crit)
    if acc["mean"] is not None and acc["mean"] >= CEILING:  # right on (nearly) every item: "≥ OPD − δ" cannot fail
        return _row(
            key, measured + f" ({what} at the ceiling: no loss is possible, no gain can be shown)", NA_CEILING, crit
        )
    return _row(key, measured, decide(diff, -margin, ">="), crit, f"{what} − OPD Acc_x {fmt_stat(diff, signed=True)}")


def claim_nca_keeps(runs: Sequence[RunSet]) -> Claim:
    return _noninferior(runs, "nca_keeps", "nca", NCA_MAX_ACC_LOSS, "NCA")


def claim_ta_opd(runs: Sequence[RunSet]) -> Claim:
    row = _noninferior(runs, "ta_opd", "ta_opd", TA_OPD_MARGIN, "TA-OPD")
    kept = [r.kept_fraction("ta_opd") for r in runs]
    if any(k is not None for k in kept):
        row.measured += f"; kept fraction {', '.join('n/a' if k is None else f'{k:.3f}' for k in kept)}"
    return row


def _probe(key: str, fn: Callable[[Sequence[RunSet]], dict[str, Any]]) -> Callable[[Sequence[RunSet]], Claim]:
    def run(runs: Sequence[RunSet]) -> Claim:
        r = fn(runs)
        return Claim(key, "", "", r["measured"], r["verdict"], r["criterion"], r.get("headline", ""))

    return run


# (key, claim, paper's figure, evaluator)
CLAIMS: tuple[tuple[str, str, str, Callable[[Sequence[RunSet]], Claim]], ...] = (
    (
        "degradation",
        "OPD causes context-induced degradation",
        "games: Harm 22–41 %; regime A in 7 of 12 settings",
        claim_degradation,
    ),
    (
        "nca_removes",
        "NCA removes the degradation",
        "Harm 15.7 % → 1.6 % (Llama-3.2-3B MedMCQA); lower in 11 of 12",
        claim_nca_removes,
    ),
    (
        "nca_keeps",
        "NCA keeps no-context accuracy (non-inferior to OPD)",
        "12-setting mean Acc_x: NCA 70 vs OPD 68",
        claim_nca_keeps,
    ),
    (
        "cosine_order",
        "two-view hidden-state cosine: base < OPD < NCA",
        "base ≈ 0.953, OPD ≈ 0.985 (Qwen3-4B)",
        _probe("cosine_order", cp.claim_cosine_order),
    ),
    (
        "nca_cosine",
        "NCA closes the base's two-view distance as far as the paper's NCA (every layer, relative to this base)",
        "NCA ≥ 0.997 at every layer, base ≈ 0.953 (Qwen3-4B): NCA leaves ≤ 6.4 % of the base's distance",
        _probe("nca_cosine", cp.claim_nca_cosine),
    ),
    (
        "nca_lens",
        "NCA's removability holds at the level of representations (logit lens, every depth where the base's views differ)",
        "removability “at the level of representations”: NCA ≥ 0.997 cosine at every layer",
        _probe("nca_lens", cp.claim_nca_lens),
    ),
    (
        "orthogonal",
        "OPD and NCA gradients nearly orthogonal at an OPD-converged checkpoint",
        "“nearly orthogonal” (no number)",
        _probe("orthogonal", cp.claim_orthogonal),
    ),
    (
        "shallow",
        "updates concentrated in shallow layers (≥ 1.5× the deep layers' relative update)",
        "shallow layers (36-layer Qwen3-4B; no number)",
        _probe("shallow", cp.claim_shallow),
    ),
    (
        "qk",
        "updates concentrated in q_proj / k_proj (≥ 1.5× the other projections'; correlational: ‖ΔW‖ / ‖W0‖ ratios)",
        "q_proj, k_proj (no number)",
        _probe("qk", cp.claim_qk),
    ),
    *((key, claim, paper, _probe(key, fn)) for key, claim, paper, fn in MECHANISM_CLAIMS),  # causal: weight patching
    (
        "ta_opd",
        "TA-OPD at ρ = 10 % is no worse than full OPD",
        "44.89 vs 42.37 (Qwen3-4B→1.7B); 4 of 4 pairs",
        claim_ta_opd,
    ),
    (
        "teachability",
        "D^L predicts the fixed-context gain better than raw KL",
        "gain rises with D^L; high-support gap ≈ +0.08",
        _probe("teachability", cp.claim_teachability),
    ),
    *((key, claim, paper, _probe(key, fn)) for key, claim, paper, fn in FOLLOWING_CLAIMS),
)


def floor(runs: Sequence[RunSet]) -> tuple[Decision, dict[str, Any]]:
    """Does the base use the context? Acc_xc − Acc_x of the base ≥ `FLOOR_GAIN` (interval rule)."""
    gain = paired_stat(runs, ("base",), lambda a: metric_of(a, "acc_xc") - metric_of(a, "acc_x"), bounds=(-1.0, 1.0))
    return (decide(gain, FLOOR_GAIN, ">=") if gain["mean"] is not None else Decision(NA)), gain


def undecided(runs: Sequence[RunSet]) -> str:
    """The verdict of every row when the study cannot tell whether the base uses the context (the floor's interval
    holds its bar): ``not measurable here (undecided (N items): …)`` with the items summed over the seeds."""
    items = sum(len(a[0]) for a in (eval_arrays(r, ("base",)) for r in runs) if a is not None)
    return f"{NA} (undecided ({items} items): whether the base uses the context)"


def target_line(runs: Sequence[RunSet]) -> str:
    """What the intervals speak for (docs/method.md §8): the population of items when each seed draws its own, THESE
    items when the seeds share them (the seeds then replicate training only)."""
    keyed = [set(k) for k in (_keys(r) for r in runs) if k]
    if len(keyed) < 2:
        return "Target: one seed's items (an item-level interval; no seed replicates it)."
    shared = set.intersection(*keyed)
    if shared:
        return (
            f"Target: these items — {len(shared)} items are shared by every seed, so the seeds replicate training "
            "only and the intervals speak for these items, not for the population they were drawn from."
        )
    return "Target: the population of items (each seed draws its own; the replication unit is the seed with its items)."


def _keys(study: RunSet) -> set[str]:
    rep = study.eval("base")
    return {str(r.get("uid")) for r in rep.records} if rep is not None and rep.records else set()


def evaluate_claims(
    runs: Sequence[str | Path | RunSet], study: str | Path | None = None, only: Collection[str] | None = None
) -> list[Claim]:
    """Every claim of `CLAIMS` on the given seed runs of one study (one run: single-seed values, marked).
    ``runs``: run dirs or `RunSet` objects; ``study``: a study YAML applied to every run dir (roles -> run names);
    ``only``: the keys of the rows to evaluate (default: all; a key `CLAIMS` does not hold is a ValueError).
    When the base does not use the context (`floor` decided below its bar), every row is measured but none is
    decided ("floor"); when the data cannot tell (the floor's interval holds the bar), none is either, labelled
    "undecided (N items)" (`undecided`)."""
    keys = [key for key, *_ in CLAIMS]
    unknown = sorted(set(only or ()) - set(keys))
    if unknown:
        raise ValueError(f"evaluate_claims(only=...): no claim row {unknown}; the rows are {keys}")
    seeds = runsets(runs, study)
    base_ok, gain = floor(seeds)
    out = []
    for key, claim, paper, fn in CLAIMS:
        if only is not None and key not in only:
            continue
        row = fn(seeds)
        row.key, row.claim, row.paper = key, claim, paper
        if base_ok.verdict not in (HOLDS, NA):  # decided below the bar: floor; else the data cannot tell
            row.verdict = NA_FLOOR if base_ok.verdict == FAILS else undecided(seeds)
            row.measured += f"; base Acc_xc − Acc_x {fmt_stat(gain, signed=True)} (floor {FLOOR_GAIN})"
        out.append(row)
    holm(out)  # Holm over the confirmatory rows; the others labelled exploratory
    return out


def findings(claims: Sequence[Claim]) -> list[str]:
    """One sentence per row, verdict first: what the report opens with."""
    out = []
    for c in claims:
        num = f" ({c.headline})" if c.headline and c.verdict in (HOLDS, FAILS) else ""
        why = c.verdict.split("(", 1)[1].rstrip(")") if "(" in c.verdict else ""
        if c.verdict == HOLDS:
            out.append(f"- **Holds**: {c.claim}{num}.")
        elif c.verdict == FAILS:
            out.append(f"- **Does not hold**: {c.claim}{num}.")
        else:
            out.append(f"- **Not measurable here{' — ' + why if why else ''}**: {c.claim}.")
    return out


def claims_markdown(claims: Sequence[Claim]) -> str:
    """The claims table (markdown), verdict in the second column, with a line on how the intervals are made."""
    lines = ["| claim | verdict | measured here | paper | criterion |", "|---|:---:|---|---|---|"]
    for c in claims:
        tag = " *(confirmatory)*" if c.family == "confirmatory" else " *(exploratory)*" if c.family else ""
        cells = [c.claim + tag, f"**{c.verdict}**", c.measured, c.paper, c.criterion]
        lines.append("| " + " | ".join(x.replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    lines += [
        "",
        "Measured values: mean over seed runs; intervals 95 %, made for few seeds (docs/method.md §8; coverage "
        "measured by `bench/coverage.py`): for accuracies, Harm, following and weight-patching margins (paired item "
        "by item where two models or two patched rows are compared) and the probes' per-item cosines and lens KLs, a "
        "Student-t interval over the seeds' values with each seed's item-bootstrap variance as its floor (ratios on "
        "the log scale); for seed-level probe values, a Student-t interval over seeds on a log ratio (positive "
        "quantities) or on log(1 − cos) (cosines). Verdicts by the interval rule: a criterion holds (does not hold) "
        "only when the whole interval is on the passing (failing) side of its bar, else "
        f"**{NA_FRAGILE}**; with one seed, marked. "
        "Criteria fixed in `mechopd/report/claims.py`, `report/claims_probes.py`, `report/mechanism_claims.py` and "
        "`report/following_claims.py` before any run (docs/method.md §8).",
        "",
        multiplicity_note(claims),
    ]
    return "\n".join(lines) + "\n"


def fragile_claims(claims: Sequence[Claim]) -> list[Claim]:
    """The rows whose verdict is `NA_FRAGILE`: the interval holds the bar."""
    return [c for c in claims if c.verdict == NA_FRAGILE]


def claims_json(claims: Sequence[Claim]) -> list[dict[str, str]]:
    return [asdict(c) for c in claims]
