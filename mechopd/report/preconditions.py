"""Each claim row's precondition, checked on the study before the row is decided (docs/method.md §8, #53): a row whose
precondition fails says "not measurable here (design: REASON)" with the numbers in its measured cell, never a verdict.

    informative units   Harm rows: ≥ K_HARM items right without the context (OPD's, pooled over seeds);
                        q/k revert rows: ≥ K_REVERT learned items (OPD right without c, unpatched) for the rule,
                        ≥ K_REVERT harmed items (right without c, wrong with it) for the harm, and for localization
    NCA alive           NCA's Acc_xc ≥ min(base's, OPD's) − VIEW_MARGIN (not collapsed); not deaf: its follow_other
                        on the other contexts ≥ min(base's, OPD's) − VIEW_MARGIN (it lost no more following than the
                        OPD it is compared with), where measured, and its context view changes its reply (any
                        context: the distilled one or another) on ≥ K_HEARD items pooled over seeds, where the
                        records keep the replies
    student moved       OPD internalised ≥ MOVED_SHARE of the context's gain:
                        (Acc_x,OPD − Acc_x,base) ≥ MOVED_SHARE · (Acc_xc,base − Acc_x,base)
    converged           OPD's Acc_x ≥ CONVERGED_SHARE × its teacher's (the base with the context) Acc_xc, per seed
    depth               the shallow-layer row needs ≥ MIN_LAYERS_FOR_DEPTH decoder layers

Preconditions are judged on the seed means (point values): they describe the design the study ran, not a claim.
Each check returns None (met) or ``(verdict, why)``: the row's verdict and the numbers its measured cell gets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mechopd.probes import mechanism_stats as ms
from mechopd.report.claim_rules import MIN_LAYERS_FOR_DEPTH
from mechopd.report.seed_items import eval_arrays, metric_stat, other_stat
from mechopd.report.verdicts import na_design
from mechopd.runset import RunSet

K_HARM = 10  # items right without the context, pooled over seeds, before Harm is judged
K_REVERT = 10  # learned (rule) or harmed (harm) items of the unpatched model, pooled, before a revert is judged
VIEW_MARGIN = 0.10  # NCA's Acc_xc / follow_other may sit at most this far below the reference
MOVED_SHARE = 0.25  # the student internalised at least a quarter of the context's gain
CONVERGED_SHARE = 0.9  # "converged": Acc_x at least 0.9 × the teacher's Acc_xc
K_HEARD = 10  # items (pooled over seeds) on which some context changes NCA's reply, before its Harm is judged

NA_FEW_RIGHT = na_design(f"Harm needs ≥ {K_HARM} items right without the context")
NA_COLLAPSED = na_design("NCA collapsed or deaf: its context view lost what the base's could do")
NA_UNMOVED = na_design(f"OPD internalised < {MOVED_SHARE:g} of the context's gain: nothing to keep or lose")
NA_UNCONVERGED = na_design(f"OPD Acc_x < {CONVERGED_SHARE:g} × its teacher's Acc_xc in every seed")
NA_SHALLOW = na_design(f"the shallow-layer row needs ≥ {MIN_LAYERS_FOR_DEPTH} decoder layers")
NA_FEW_LEARNED = na_design(f"a revert needs ≥ {K_REVERT} items OPD learned (right without the context)")
NA_FEW_HARMED = na_design(f"a revert needs ≥ {K_REVERT} items OPD is harmed on")
Check = tuple[str, str] | None


def _mean(runs: Sequence[RunSet], role: str, metric: str) -> float | None:
    return metric_stat(runs, role, metric)["mean"]


def right_items(runs: Sequence[RunSet], role: str = "opd") -> int:
    """Items ``role`` gets right without the context, summed over the seeds (Harm's denominator)."""
    got = [eval_arrays(r, (role,)) for r in runs]
    return int(sum(int(a[0].sum()) for a in got if a is not None))


def harm_units(runs: Sequence[RunSet], role: str = "opd") -> Check:
    """Harm of ``role`` rests on ≥ `K_HARM` items right without the context."""
    k = right_items(runs, role)
    return None if k >= K_HARM else (NA_FEW_RIGHT, f"{role} right without the context on {k} items over the seeds")


def nca_alive(runs: Sequence[RunSet], role: str = "nca") -> Check:
    """NCA's context view neither collapsed (Acc_xc below both the base's and OPD's by more than `VIEW_MARGIN`) nor
    deaf: its follow_other below both the base's and OPD's by more than the margin (it lost more following than the
    distillation it is compared with; where measured), or a context changes its reply on fewer than `K_HEARD` items
    (`replies_changed`; where the records keep the replies)."""
    own, base, opd = (_mean(runs, r, "acc_xc") for r in (role, "base", "opd"))
    refs = [v for v in (base, opd) if v is not None]
    if own is not None and refs and own < min(refs) - VIEW_MARGIN:
        return NA_COLLAPSED, f"NCA Acc_xc {own:.3f} vs base {_f(base)}, OPD {_f(opd)} (margin {VIEW_MARGIN:g})"
    fo, fb, fp = (other_stat(runs, r, "follow")["mean"] for r in (role, "base", "opd"))
    heard = [v for v in (fb, fp) if v is not None]
    if fo is not None and heard and fo < min(heard) - VIEW_MARGIN:
        why = f"NCA follow_other {fo:.3f} vs base {_f(fb)}, OPD {_f(fp)} (margin {VIEW_MARGIN:g}): deaf"
        return NA_COLLAPSED, why
    changed = replies_changed(runs, role)
    if changed is not None and changed < K_HEARD:
        return (
            NA_COLLAPSED,
            f"a context changes NCA's reply on {changed} items over the seeds (needs ≥ {K_HEARD}): deaf",
        )
    return None


def replies_changed(runs: Sequence[RunSet], role: str = "nca") -> int | None:
    """Items (pooled over seeds) on which some context changes ``role``'s reply: its reply with the distilled context,
    or under any other context, differs from its reply without one; None where a seed's records keep no replies."""
    total = 0
    for r in runs:
        rep = r.eval(role)
        if rep is None or not rep.records or any("response_x" not in x or "response_xc" not in x for x in rep.records):
            return None
        key = lambda x: (str(x.get("uid")), int(x.get("sample", 0) or 0))  # noqa: E731
        plain = {key(x): x["response_x"] for x in rep.records}
        moved = {key(x) for x in rep.records if x["response_xc"] != x["response_x"]}
        for o in rep.extra.get("other_records") or []:
            if "response" not in o:
                return None
            if key(o) in plain and o["response"] != plain[key(o)]:
                moved.add(key(o))
        total += len(moved)
    return total


def moved_share(runs: Sequence[RunSet], role: str = "opd") -> float | None:
    """(Acc_x,role − Acc_x,base) / (Acc_xc,base − Acc_x,base): the share of the context's gain ``role`` internalised;
    None where undefined or the base gains nothing from the context."""
    own, bx, bxc = _mean(runs, role, "acc_x"), _mean(runs, "base", "acc_x"), _mean(runs, "base", "acc_xc")
    if own is None or bx is None or bxc is None or bxc - bx <= 0:
        return None
    return (own - bx) / (bxc - bx)


def student_moved(runs: Sequence[RunSet], role: str = "opd") -> Check:
    """``role`` internalised ≥ `MOVED_SHARE` of the context's gain (undefined share: not judged here)."""
    share = moved_share(runs, role)
    if share is None or share >= MOVED_SHARE:
        return None
    return NA_UNMOVED, f"OPD internalised {share:.2f} of the base's context gain (needs ≥ {MOVED_SHARE:g})"


def converged(study: RunSet) -> bool | None:
    """OPD's Acc_x ≥ `CONVERGED_SHARE` × the teacher's (the base with the context) Acc_xc in this seed."""
    acc, teacher = study.value("opd", "acc_x"), study.value("base", "acc_xc")
    return None if acc is None or teacher is None else acc >= CONVERGED_SHARE * teacher


def depth(layers: int) -> Check:
    return None if layers >= MIN_LAYERS_FOR_DEPTH else (NA_SHALLOW, f"{layers} decoder layers")


def revert_units(runs: Sequence[RunSet], key: str, role: str = "opd") -> Check:
    """The unpatched ``role`` has ≥ `K_REVERT` learned items (rule) or harmed items (harm), pooled over seeds."""
    total = 0
    for r in runs:
        out = ms.weightpatch_outcomes(r, role)
        if out is None or "none/none" not in out:
            continue
        cx, cxc = out["none/none"]
        total += int(cx.sum()) if key == "rule_removed" else int(np.sum(cx & ~cxc))
    if total >= K_REVERT:
        return None
    what = "learned (right without the context)" if key == "rule_removed" else "harmed"
    return (NA_FEW_LEARNED if key == "rule_removed" else NA_FEW_HARMED), f"{total} {what} probe items over the seeds"


def _f(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def harmed_localized(runs: Sequence[RunSet]) -> Check:
    """Localization reads ≥ `K_REVERT` harmed items (right without the context, flipped unpatched), pooled."""
    total = 0
    for r in runs:
        got = ms.localization_arrays(r)
        if got is not None:
            total += int(np.sum(got[1][0] & got[1][1]))
    if total >= K_REVERT:
        return None
    return na_design(f"localization needs ≥ {K_REVERT} harmed items"), f"{total} harmed items over the seeds"
