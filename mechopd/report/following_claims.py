"""Context following in the report and the claims table (criteria: docs/method.md §7, fixed before the runs).

Reads each role's evaluation report through the typed study (`mechopd.runset.RunSet.eval`), written with
``--other-contexts`` (`mechopd.evaluation.following`): the per-reply records ``other_records`` (follow / stick / compose / other
per unit and context), the ``other_contexts`` list and the summary's ``context_deaf``. Following is a real test: the
rows read the HELD-OUT contexts, those the NCA + follow run was not trained on (its ``follow_contexts``; the demo
trains it on the shifts and holds out repeat:2, repeat:3 and reverse). Statistics: mean over seeds with a
seeds × units interval (`mechopd.report.seed_items`: t over seeds, unit floor), two models compared unit by unit; every verdict
by the interval rule (`verdicts.decide`), claim 3 a three-valued AND (`verdicts.all_of`). Each claim returns
``{"measured", "verdict", "criterion", "headline"}``; `mechopd.report.claims` wraps it into its row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mechopd.core.stats import fmt_stat
from mechopd.evaluation.following import DEAF_LABEL, DEAF_RATIO, following_word
from mechopd.report import preconditions as pre
from mechopd.report.seed_items import diff_stat, other_diff_stat, other_stat
from mechopd.report.verdicts import CEILING, NA, NA_CEILING, NA_FLOOR_BOTH, RULE, Decision, all_of, decide
from mechopd.runset import RunSet

FOLLOW_RUN = "nca_follow"  # the demo's NCA + follow-term run
HARM_MARGIN = 0.05  # claim 3: the follow run's Harm ≤ NCA's + this
ACC_MARGIN = 0.05  # claim 3: the follow run's Acc_x ≥ OPD's − this


def _report(study: RunSet, role: str) -> dict[str, Any] | None:
    """The role's evaluation report as its on-disk dict (None when the study lacks the role or the report)."""
    rep = study.eval(role)
    return None if rep is None else rep.to_dict()


def value(study: RunSet, role: str, key: str) -> float | None:
    """summary[key] (its ``value`` for an interval entry) of ``role``, None when absent or undefined."""
    rep = _report(study, role)
    if rep is None or key not in rep["summary"]:
        return None
    v = rep["summary"][key]
    return v.get("value") if isinstance(v, dict) else v


def held_out(runs: Sequence[RunSet]) -> list[str] | None:
    """The other contexts the claims read: those the follow run was NOT trained on (its ``follow_contexts``), so
    that following is tested on contexts no run saw; every other context when no run names a subset. None when no
    report lists its other contexts."""
    rep = _report(runs[0], "base") or {}
    labels = [r["label"] for r in rep.get("other_contexts", [])]
    if not labels:
        return None
    follow = runs[0].run(FOLLOW_RUN)
    trained = set(((follow.settings or {}).get("follow_contexts") or []) if follow else [])
    return [lab for lab in labels if lab not in trained]


def _decided(measured: str, d: Decision, crit: str, headline: str = "") -> dict[str, str]:
    return {"measured": measured + d.note, "verdict": d.verdict, "criterion": crit, "headline": headline}


def _na(measured: str, crit: str, verdict: str = NA) -> dict[str, str]:
    return {"measured": measured, "verdict": verdict, "criterion": crit, "headline": ""}


def _labels(labels: Sequence[str] | None) -> str:
    return "no context" if not labels else ", ".join(labels)


def claim_keeps_following(runs: Sequence[RunSet]) -> dict[str, str]:
    """OPD's follow_other on the held-out contexts > 0.5 × the base's, paired per seed and item."""
    labels = held_out(runs)
    d_ret = other_diff_stat(runs, "opd", "base", "follow", labels, scale_b=DEAF_RATIO)
    fo, base = other_stat(runs, "opd", "follow", labels), other_stat(runs, "base", "follow", labels)
    crit = (
        f"held-out other contexts ({_labels(labels)}), paired per seed and item: OPD follow_other − {DEAF_RATIO} × "
        f"base's > 0 (retention > {DEAF_RATIO}, not {DEAF_LABEL}); {RULE}; judged once OPD internalised ≥ "
        f"{pre.MOVED_SHARE:g} of the base's context gain"
    )
    measured = f"OPD follow_other {fmt_stat(fo)} (base {fmt_stat(base)}); {_replies(runs, 'opd', labels)}"
    if d_ret["mean"] is None or not labels:
        return _na(measured, crit)
    if unmoved := pre.student_moved(runs):  # the base keeps following by construction: a student must have moved
        return _na(f"{measured}; {unmoved[1]}", crit, unmoved[0])
    return _decided(
        measured, decide(d_ret, 0.0, ">"), crit, f"OPD follow_other {fmt_stat(fo)} vs base {fmt_stat(base)}"
    )


def claim_nca_follows_better(runs: Sequence[RunSet]) -> dict[str, str]:
    """Paired per seed and item: follow_other(NCA) − follow_other(OPD) > 0 on the held-out contexts; ceiling first."""
    labels = held_out(runs)
    diff = other_diff_stat(runs, "nca", "opd", "follow", labels)
    both = [other_stat(runs, m, "follow", labels) for m in ("nca", "opd")]
    crit = (
        f"held-out other contexts ({_labels(labels)}), paired per seed and item: follow_other(NCA) − "
        f"follow_other(OPD) > 0; {RULE}; both ≥ {CEILING}: ceiling; both ≤ {1 - CEILING:.3f}: floor"
    )
    measured = f"NCA − OPD follow_other {fmt_stat(diff, signed=True)}; NCA: {_replies(runs, 'nca', labels)}"
    if diff["mean"] is None or not labels:
        return _na(measured, crit)
    if unmoved := pre.student_moved(runs):
        return _na(f"{measured}; {unmoved[1]}", crit, unmoved[0])
    if all(s["mean"] is not None and s["mean"] >= CEILING for s in both):  # the mean: an exact bound never reaches 1
        return _na(measured, crit, NA_CEILING)
    if all(s["mean"] is not None and s["mean"] <= 1 - CEILING for s in both):
        return _na(measured, crit, NA_FLOOR_BOTH)  # the mirror of the ceiling: neither follows, nothing to compare
    return _decided(measured, decide(diff, 0.0, ">"), crit, f"NCA − OPD follow_other {fmt_stat(diff, signed=True)}")


def claim_follow_term(runs: Sequence[RunSet]) -> dict[str, str]:
    """On the NCA + follow run F, Kleene AND of: follow_other_F − 0.5 × base's > 0 on contexts F was NOT trained on;
    non-inferiority Harm_F − Harm_NCA ≤ 0.05 and Acc_x,F − Acc_x,OPD ≥ −0.05 (paired per seed and item)."""
    labels = held_out(runs)
    follow = runs[0].run(FOLLOW_RUN)
    trained = (follow.settings or {}).get("follow_contexts") if follow else None
    d_ret = other_diff_stat(runs, FOLLOW_RUN, "base", "follow", labels, scale_b=DEAF_RATIO)
    fo = other_stat(runs, FOLLOW_RUN, "follow", labels)
    d_harm, d_acc = diff_stat(runs, FOLLOW_RUN, "nca", "harm"), diff_stat(runs, FOLLOW_RUN, "opd", "acc_x")
    crit = (
        f"NCA + follow, trained on {_labels(trained) if trained else 'every other context'}: on the held-out "
        f"contexts ({_labels(labels)}) follow_other − {DEAF_RATIO} × base's > 0, and non-inferiority paired per "
        f"seed and item: Harm − NCA's ≤ {HARM_MARGIN}, Acc_x − OPD's ≥ −{ACC_MARGIN}; {RULE} (each part)"
    )
    measured = (
        f"NCA + follow held-out follow_other {fmt_stat(fo)}; Harm − NCA's {fmt_stat(d_harm, signed=True)}, "
        f"Acc_x − OPD's {fmt_stat(d_acc, signed=True)}"
    )
    if follow is None:
        return _na(measured, crit, NA + f" (no {FOLLOW_RUN} run: the study trains no NCA + follow term)")
    if not trained:
        return _na(measured, crit, NA + " (the follow term saw every other context: nothing held out)")
    if any(s["mean"] is None for s in (d_ret, d_harm, d_acc)) or not labels:
        return _na(measured, crit)
    if unmoved := pre.student_moved(runs):
        return _na(f"{measured}; {unmoved[1]}", crit, unmoved[0])
    d = all_of(
        decide(d_ret, 0.0, ">", "held-out following"),
        decide(d_harm, HARM_MARGIN, "<=", "Harm − NCA's"),
        decide(d_acc, -ACC_MARGIN, ">=", "Acc_x − OPD's"),
    )
    return _decided(measured, d, crit, f"held-out follow_other {fmt_stat(fo)}")


def _word(runs: Sequence[RunSet], role: str, labels: Sequence[str] | None) -> str:
    """The word the HELD-OUT replies support (seed means): follows, or for a deaf model (held-out follow_other ≤
    0.5 × the base's) ignores / mixes / breaks by its most common non-following reply (`following.following_word`)."""
    own, base = other_stat(runs, role, "follow", labels)["mean"], other_stat(runs, "base", "follow", labels)["mean"]
    if own is None or not base:
        return ""
    shares = {
        k: {"value": other_stat(runs, role, f, labels)["mean"]}
        for k, f in (("stick", "stick"), ("compose", "compose"), ("other_reply", "other"))
    }
    return following_word({"context_deaf": own <= DEAF_RATIO * base, **shares}) + " (held out)"


def _replies(runs: Sequence[RunSet], role: str, labels: Sequence[str] | None) -> str:
    """``replies: follows 0.02, sticks 0.60, composes 0.30, other 0.08`` (seed means; classes of `mechopd.evaluation.following`)."""
    parts = []
    for field, word in (("follow", "follows"), ("stick", "sticks"), ("compose", "composes"), ("other", "other")):
        st = other_stat(runs, role, field, labels)
        if st["mean"] is not None:
            parts.append(f"{word} {st['mean']:.2f}")
    return "replies: " + ", ".join(parts) if parts else "replies: n/a"


FOLLOWING_CLAIMS = (
    (
        "keeps_following",
        "the distilled student keeps following other contexts",
        "not asked by either paper",
        claim_keeps_following,
    ),
    ("nca_follows", "NCA keeps it better than OPD", "not asked by either paper", claim_nca_follows_better),
    (
        "follow_term",
        "the follow term keeps it without bringing the harm back",
        "new (objectives/follow.py)",
        claim_follow_term,
    ),
)


def following_table(runs: Sequence[RunSet]) -> list[str]:
    """The report's "Context following" section: per role follow_other on every other context and on the held-out
    ones, the reply classes (sticks, composes, other), retention and the word the replies support (follows, ignores,
    mixes, breaks); mean over seeds with the seeds × items interval (one run: over items). [] without results."""
    if not runs:
        return []
    labels = {role: runs[0].label(role) for role in runs[0].roles}
    have = [m for m in runs[0].roles if any(value(r, m, "follow_other") is not None for r in runs)]
    if not have:
        return []
    held = held_out(runs)
    out = [
        "## Context following",
        "",
        "| model | follow_other | held-out | sticks | composes | other | retention | |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for m in have:
        cells = [fmt_stat(other_stat(runs, m, "follow")), fmt_stat(other_stat(runs, m, "follow", held))]
        cells += [fmt_stat(other_stat(runs, m, f)) for f in ("stick", "compose", "other")]
        own, base = other_stat(runs, m, "follow")["mean"], other_stat(runs, "base", "follow")["mean"]
        cells.append("n/a" if own is None or not base else f"{own / base:.3f}")  # ratio of the seed means
        out.append(
            f"| {labels.get(m, m)} | " + " | ".join(cells) + f" | {_word(runs, m, held) if m != 'base' else ''} |"
        )
    first = _report(runs[0], have[0]) or {}
    ctx = ", ".join(r["label"] for r in first.get("other_contexts", []))
    out += [
        "",
        f"Other contexts: {ctx}; held out from the follow term's training: {_labels(held)}. Each reply is "
        "scored against that context's target (follows), else the distilled context's (sticks), else both rules "
        "composed (composes), else other; retention = follow_other / base's (of the seed means); a model whose "
        f"held-out follow_other is at most {DEAF_RATIO} × the base's is {DEAF_LABEL} there, and the word says how: "
        "ignores (sticks), mixes (composes), breaks (other) (docs/method.md §7). "
        + (
            "Intervals: 95 % bootstrap over items."
            if len(runs) == 1
            else "Cells: mean over seeds [95 % over seeds and items: Student-t over seeds, item-bootstrap floor]."
        ),
        "",
    ]
    return out
