"""Context following: does the distilled student still read OTHER contexts? (docs/method.md "Context following").

Context removability cannot tell a student that internalised its context from one that stopped reading contexts at
all: both score Harm 0. Here every held-out item is answered again with each of the task's other contexts c′
(`Task.other_contexts`: on the rules organism the family's other rules) and scored against THAT context's target.

Per model, over units u (an item, or an (item, sample) pair with ``samples > 1``) and other contexts k:
    follow_k      = mean_u 1[reply under c′_k is right for c′_k's target]
    stick_k       = mean_u 1[reply under c′_k gives the DISTILLED context's answer anyway]
    follow_other  = mean_k follow_k          stick = mean_k stick_k
Each reply is put in ONE class, in this order: it *follows* c′_k (right for c′_k's target), *sticks* to the distilled
context (its answer anyway), *composes* both (the distilled rule and then c′_k's, where the task says what that gives:
`OtherContext.composed`), or is *other*; ``compose`` and ``other_reply`` are their shares (mean over contexts).
Intervals: paired percentile bootstrap over units (the same resamples for every context, `removability.resample_blocks`),
the statistic recomputed on each resample. With a base model (label ``base`` of ``--compare``):
    retention     = follow_other(model) / follow_other(base)
    context-deaf  ⟺ follow_other(model) ≤ ½ · follow_other(base)   (whatever the regime letter)
and the word the data supports for a deaf model (``following``): *ignores* other contexts when its most common
non-following reply sticks, *mixes* them when it composes, *breaks* when it is other; *follows* otherwise.
A deaf model's regime line says so; a regime C ("views agree") that is deaf reads "views agree because contexts are
ignored", never plain "views agree".

Greedy by default, exactly as `evaluate.evaluate_model`: one batched generation call over every (item, context) pair.
A task that defines no other contexts (the built-in games) is "not measurable", said once in the summary.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.stats import never_a_point
from mechopd.core.views import RenderSpec, render_prompt_ids
from mechopd.evaluation.config import EvalConfig
from mechopd.evaluation.evaluate import sampling_settings
from mechopd.evaluation.pinning import check_fits
from mechopd.evaluation.removability import MIN_VALID_RESAMPLES, resample_blocks
from mechopd.generate.sampler import sample_rows, stable_seed, strip_stop
from mechopd.generate.settings import SamplingSettings

DEAF_RATIO = 0.5  # context-deaf: follow_other at most this share of the base model's
DEAF_LABEL = "context-deaf"
WORDS = {"stick": "ignores", "compose": "mixes", "other": "breaks"}  # a deaf model's most common non-following reply
_TOL = 1e-9


def other_jobs(task: Any, items: list) -> list[tuple[int, Any]]:
    """(item index, OtherContext) for every other context of every item, in item order."""
    return [(i, oc) for i, ex in enumerate(items) for oc in task.other_contexts(ex)]


def _generate(model, tokenizer, task, items, jobs, cfg, spec: RenderSpec, st: SamplingSettings):
    rows = [(i, oc, j) for j in range(cfg.samples) for i, oc in jobs]
    ids = [render_prompt_ids(tokenizer, items[i].prompt, oc.context, spec) for i, oc, _ in rows]
    seeds = (
        None
        if st.greedy
        else [stable_seed(cfg.seed, items[i].uid, j, f"other|{oc.label}") % (2**31) for i, oc, j in rows]
    )
    return rows, [strip_stop(r, st.stop) for r in sample_rows(model, ids, seeds, st, charge_decode=True)]


def other_context_records(
    model: Any, tokenizer: Any, task: Any, items: list, cfg: Any, spec: RenderSpec, st: SamplingSettings
) -> list[dict[str, Any]]:
    """One record per (item, other context, sample): uid, sample, label, follow, stick, compose, other, reply (the
    class: follows / sticks / composes / other, in that order of precedence), len, response."""
    if task.is_game:
        return []
    jobs = other_jobs(task, items)
    if not jobs:
        return []
    rows, responses = _generate(model, tokenizer, task, items, jobs, cfg, spec, st)
    records = []
    for (i, oc, j), resp in zip(rows, responses):
        text = tokenizer.decode(resp, skip_special_tokens=True)
        follow, stick = bool(task.score(oc.example(items[i]), text)), bool(task.score(items[i], text))
        compose = oc.composed is not None and bool(task.score(replace(oc.example(items[i]), answer=oc.composed), text))
        reply = "follows" if follow else "sticks" if stick else "composes" if compose else "other"
        records.append(
            {
                "uid": items[i].uid,
                "sample": j,
                "label": oc.label,
                "follow": follow,
                "stick": stick,
                "compose": reply == "composes",
                "other": reply == "other",
                "reply": reply,
                "len": len(resp),
                "response": text,
            }
        )
    return records


# ------------------------------------------------------------------------------------------------------- summary
def _matrices(records: list[dict]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """labels (first-seen order), follow [units, labels] and stick [units, labels] with NaN where a unit lacks one."""
    labels = list(dict.fromkeys(r["label"] for r in records))
    units = list(dict.fromkeys((r["uid"], r["sample"]) for r in records))
    ui, li = {u: k for k, u in enumerate(units)}, {lab: k for k, lab in enumerate(labels)}
    follow = np.full((len(units), len(labels)), np.nan)
    stick = follow.copy()
    for r in records:
        u, lab = ui[(r["uid"], r["sample"])], li[r["label"]]
        follow[u, lab], stick[u, lab] = float(r["follow"]), float(r["stick"])
    return labels, follow, stick


def _mean_over_contexts(m: np.ndarray) -> np.ndarray:
    """m: [B, units, labels] -> [B]: per-context mean over the units that have it, then the mean over contexts."""
    counts = np.isfinite(m).sum(1)  # [B, labels]
    per = np.where(counts > 0, np.nansum(m, 1) / np.maximum(counts, 1), np.nan)
    valid = np.isfinite(per)
    return np.where(valid.any(1), np.nansum(np.where(valid, per, 0.0), 1) / np.maximum(valid.sum(1), 1), np.nan)


def _entry(m: np.ndarray, n_boot: int, seed: int, ci: float) -> dict[str, Any]:
    value = float(_mean_over_contexts(m[None])[0])
    boots = [_mean_over_contexts(m[idx]) for idx in resample_blocks(len(m), n_boot, seed)]
    b = np.concatenate(boots) if boots else np.empty(0)
    b = b[np.isfinite(b)]
    if len(b) < MIN_VALID_RESAMPLES:
        return {"value": value, "low": None, "high": None, "n_boot_valid": int(len(b))}
    q_lo, q_hi = (float(q) for q in np.quantile(b, [(1 - ci) / 2, 1 - (1 - ci) / 2]))
    lo, hi = never_a_point(value, q_lo, q_hi, len(m), ci)  # never a zero-width interval (#53)
    return {"value": value, "low": lo, "high": hi, "n_boot_valid": int(len(b))}


def not_measurable(task: Any) -> str:
    kind = "game" if task.is_game else "task"
    return (
        f"context following not measurable: {kind} {task.name!r} defines no other contexts "
        "(Task.other_contexts returns none)"
    )


def summarize_following(
    records: list[dict],
    n_boot: int = EvalConfig.n_boot,
    seed: int = EvalConfig.seed,
    ci: float = 0.95,
    note: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary keys ``follow_other``, ``stick``, ``other_contexts_n``; per-context rows ``{label, n, follow, stick}``).

    No records: both entries None and ``following_note`` says why (said once, not per model row)."""
    if not records:
        empty = {"value": None, "low": None, "high": None, "n_boot_valid": 0}
        return {
            "follow_other": empty,
            "stick": dict(empty),
            "other_contexts_n": 0,
            "following_note": note or "context following not measurable: no other contexts",
        }, []
    labels, follow, stick = _matrices(records)
    summary = {
        "follow_other": _entry(follow, n_boot, seed, ci),
        "stick": _entry(stick, n_boot, seed, ci),
        "other_contexts_n": len(labels),
    }
    extra = {}
    if all("compose" in r for r in records):  # records of an older release have no reply classes
        for key, field in (("compose", "compose"), ("other_reply", "other")):
            extra[field] = _matrices([{**r, "follow": r[field]} for r in records])[1]
            summary[key] = _entry(extra[field], n_boot, seed, ci)
    rows = []
    for k, label in enumerate(labels):
        have = np.isfinite(follow[:, k])
        rows.append(
            {
                "label": label,
                "n": int(have.sum()),
                "follow": float(follow[have, k].mean()),
                "stick": float(stick[have, k].mean()),
                **{f: float(m[have, k].mean()) for f, m in extra.items()},
            }
        )
    return summary, rows


def add_following(
    report: dict[str, Any], model: Any, tokenizer: Any, task: Any, cfg: Any, spec: RenderSpec | None = None
) -> dict[str, Any]:
    """Evaluate `model` under every other context of the report's items (same items, seed and decoding as the
    report's removability evaluation) and add ``summary.follow_other``, ``summary.stick``, the top-level
    ``other_contexts`` list and ``other_records`` to `report` (in place; returned)."""
    if cfg.engine == "vllm":
        raise ConfigError("--other-contexts decodes with the lean or hf engine; drop --engine vllm for it")
    spec = spec or RenderSpec(placement=task.placement)
    items = task.examples("test", cfg.n, cfg.seed)
    if not items:
        raise TaskError(f"task {task.name!r} produced no held-out items; check the task's data")
    st = sampling_settings(model, tokenizer, task, cfg)  # the evaluation's own: same decoding as the two views
    check_fits(
        tokenizer, items, spec, st.max_new_tokens, getattr(model.config, "max_position_embeddings", None), task
    )  # every other context fits the model's positions, as the main one (never truncated)
    was_training = model.training
    model.eval()

    with torch.inference_mode():
        records = other_context_records(model, tokenizer, task, items, cfg, spec, st)
    if was_training:
        model.train()
    summary, rows = summarize_following(records, cfg.n_boot, cfg.seed, note=None if records else not_measurable(task))
    report["summary"].update(summary)
    report["other_contexts"] = rows
    report["other_records"] = records
    report["settings"]["other_contexts"] = [r["label"] for r in rows]
    return report


# ------------------------------------------------------------------------------------------------ retention, deafness
def deaf_verdict(follow: float | None, base_follow: float | None) -> tuple[float | None, bool | None]:
    """(retention, context-deaf) of a model's follow_other against the base's; None where undefined."""
    if follow is None or base_follow is None:
        return None, None
    retention = follow / base_follow if base_follow > 0 else None
    return retention, bool(base_follow > 0 and follow <= DEAF_RATIO * base_follow + _TOL)


def following_word(summary: dict[str, Any]) -> str:
    """``follows``, or for a context-deaf model the word its replies support (`WORDS`: ignores / mixes / breaks):
    the most common of its non-following reply classes (stick, compose, other)."""
    if not summary.get("context_deaf"):
        return "follows"
    shares = {"stick": summary.get("stick"), "compose": summary.get("compose"), "other": summary.get("other_reply")}
    vals = {k: (v or {}).get("value") for k, v in shares.items()}
    have = {k: v for k, v in vals.items() if v is not None}
    return WORDS[max(have, key=lambda k: have[k])] if have else DEAF_LABEL


def deaf_reason(summary: dict[str, Any], base_follow: float) -> str:
    """The regime line of a context-deaf model: the deafness first, then the removability regime it qualifies."""
    fo = summary["follow_other"]["value"]
    head = (
        f"{DEAF_LABEL} ({following_word(summary)} other contexts): follow_other {fo:.3f} ≤ {DEAF_RATIO:g} × base "
        f"{base_follow:.3f} (retention {summary['retention']:.3f}); "
    )
    if summary["regime"] == "C":
        return head + (
            "the views agree because other contexts are ignored, not because the context was removed "
            "cleanly — " + summary["regime_reason"]
        )
    return head + summary["regime_reason"]


def apply_retention(reports: dict[str, dict[str, Any]], base: str = "base") -> None:
    """With a ``base`` report among `reports`: each other model's ``retention`` and ``context_deaf`` (summary keys),
    and a deaf model's ``regime_reason`` rewritten to say so (`deaf_reason`). In place; no base: nothing changes."""
    if base not in reports or "follow_other" not in reports[base]["summary"]:
        return
    base_follow = reports[base]["summary"]["follow_other"]["value"]
    if base_follow is None:  # not measurable for this task: nothing to compare against
        return
    for name, rep in reports.items():
        s = rep["summary"]
        if name == base or "follow_other" not in s:
            continue
        s["retention"], s["context_deaf"] = deaf_verdict(s["follow_other"]["value"], base_follow)
        s["following"] = following_word(s)
        s["retention_base"] = base
        s.setdefault("regime_reason_removability", s["regime_reason"])  # the removability verdict alone, kept once
        s["regime_reason"] = s["regime_reason_removability"]
        if s["context_deaf"]:
            s["regime_reason"] = deaf_reason(s, base_follow)


def format_following(reports: dict[str, dict[str, Any]]) -> str:
    """One screen for every model: follow_other and stick with intervals, retention, the label, the per-context
    rates; a task with no other contexts gets its "not measurable" line once."""
    first = next(iter(reports.values()))["summary"]
    if all(r["summary"]["follow_other"]["value"] is None for r in reports.values()):
        return f"context following: {first.get('following_note', 'not measurable')}"

    def cell(e: dict) -> str:
        ci = "" if e["low"] is None else f" [{e['low']:.3f}, {e['high']:.3f}]"
        return f"{e['value']:.3f}{ci}"

    lines = ["== context following (other contexts, each scored against its own target)"]
    for name, rep in reports.items():
        s = rep["summary"]
        ret = "" if s.get("retention") is None else f", retention {s['retention']:.3f}"
        deaf = f"  ** {DEAF_LABEL}: {following_word(s)} other contexts **" if s.get("context_deaf") else ""
        lines.append(f"{name:>13}: follow_other {cell(s['follow_other'])}, stick {cell(s['stick'])}{ret}{deaf}")
        per = ", ".join(f"{r['label']} {r['follow']:.2f}/{r['stick']:.2f}" for r in rep.get("other_contexts", []))
        lines.append(f"{'':>13}  follow/stick per context: {per}")
    return "\n".join(lines)
