"""The trainer's second rollout batch, for terms declared with ``batch="other"`` (the ``follow`` term).

Per step and per row of this process: one other context c′ of the row's example (`objectives.follow.draw_other`,
seeded by (seed, step, row)); the student samples y ~ q_θ(·|x,c′) with its own row seed; both views of the batch
carry c′, so the ``student_nctx`` role is q_θ(·|x,c′) and ``teacher`` is f(·|x,c′). The batch has its OWN
`step.StepScorer` (same micro-batches, logit chunks and autocast as the main one, no selector, no teacher prefix
store: c′ varies by row): its terms are token means over the GLOBAL token count of THIS batch, and its backward runs
after the main batch's, so its gradients ADD to ``.grad``:

    ∇L = ∇[Σ_main w_t L_t] + ∇[Σ_other w_t L_t],   each L_t normalised by its own batch's global token count.

`step` returns one `StepResult` (losses summed, logs / weights / per-term gradients united; the other batch's KL log
is ``kl/other_teacher_student``, the main batch's ``kl/teacher_student`` is left as it is for the anchor gate).
"""

from __future__ import annotations

from typing import Any

import torch

from mechopd.core.errors import TrainingError
from mechopd.core.views import assemble_two_views
from mechopd.generate.sampler import sample_rows, stable_seed
from mechopd.objectives.follow import draw_other
from mechopd.train import dist
from mechopd.train.step import StepOptions, StepResult, StepScorer


def scorer(tr: Any, opts: StepOptions) -> StepScorer | None:
    """The other batch's scorer (None without an other-batch term)."""
    if not tr.other_terms:
        return None
    sc = StepScorer(tr.student, tr.teacher, tr.other_terms, tr.selector, tr.params, opts, None)
    sc.clock = tr.scoring.clock  # one stage clock per step (train.profile)
    return sc


def rollout(tr: Any, examples: list, rows: range) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids with c′, response ids) for this process's rows that have an other context."""
    cfg = tr.cfg
    picked = []
    for i in rows:
        seed = stable_seed(cfg.seed, tr.step, i, "other") % (2**31)
        oc = draw_other(tr.task, examples[i], cfg.follow_contexts, seed)
        if oc is not None:
            picked.append((tr._render(examples[i].prompt, oc.context), seed))
    ids = [p for p, _ in picked]
    if not ids and dist.active():
        raise TrainingError(
            f"step {tr.step + 1}: no row of this process has an other context, so the follow term "
            "cannot run in step with the others; use a task whose training items all define other "
            "contexts, or follow_weight=0"
        )
    responses = (
        sample_rows(
            tr.student, ids, [s for _, s in picked], tr.sampling.replace(batch_size=max(1, len(ids))), agree=tr._agree
        )
        if ids
        else []
    )  # the main rollout's settings (engine, temperature, stops)
    return ids, responses


def step(tr: Any, batch: Any, other: tuple[list[list[int]], list[list[int]]] | None, per_term: bool) -> StepResult:
    """The main batch's `StepScorer.step`, then (when `other` holds rows) the other batch's; gradients add."""
    main = tr.scoring.step(batch, tr.step, per_term=per_term)
    if other is None:
        return main
    ids, responses = other
    if not ids:  # one process, no row with an other context this step: the other terms contribute 0
        zero = {f"loss/{t.name}": torch.zeros(()) for t in tr.other_terms}
        return main._replace(
            logs={**main.logs, **zero},
            weights={**main.weights, **{t.name: t.weight_at(tr.step) for t in tr.other_terms}},
        )
    obatch = assemble_two_views(ids, ids, responses, tr.tokenizer.pad_token_id, max_length=tr.max_len).to(tr.device)
    res = tr.other_scoring.step(obatch, tr.step, per_term=per_term)
    return merge(main, res)


def merge(main: StepResult, other: StepResult) -> StepResult:
    """One `StepResult`: losses summed, logs / weights / per-term gradients united (term names are distinct)."""
    logs = {("kl/other_teacher_student" if k == "kl/teacher_student" else k): v for k, v in other.logs.items()}
    grads = None if main.term_grads is None else {**main.term_grads, **(other.term_grads or {})}
    return main._replace(
        loss=main.loss + other.loss,
        logs={**main.logs, **logs},
        weights={**main.weights, **other.weights},
        term_grads=grads,
    )
