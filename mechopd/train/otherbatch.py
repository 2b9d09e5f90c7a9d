"""The trainer's second rollout batch, for terms declared with ``batch="other"`` (the ``follow`` term).

Per step and per row of this process: one other context c′ of the row's example (`objectives.follow.draw_other`,
seeded by (seed, step, row)); the student samples y ~ q_θ(·|x,c′) with its own row seed; both views of the batch
carry c′, so the ``student_nctx`` role is q_θ(·|x,c′) and ``teacher`` is f(·|x,c′). The batch has its OWN
`step.StepScorer` (same micro-batches, logit chunks and autocast as the main one, no selector, no teacher prefix
store: c′ varies by row): its terms are token means over the GLOBAL token count of THIS batch, and its backward runs
after the main batch's, so its gradients ADD to ``.grad``:

    ∇L = ∇[Σ_main w_t L_t] + ∇[Σ_other w_t L_t],   each L_t normalised by its own batch's global token count.

An `OtherBatch` is built once (`train.parts`) with what it reads; per step the trainer calls `OtherBatch.rollout`,
then `OtherBatch.add` on the main batch's `StepResult`, which returns one `StepResult` (losses summed, logs / weights
/ per-term gradients united; the other batch's KL log is ``kl/other_teacher_student``, the main batch's
``kl/teacher_student`` is left as it is for the anchor gate).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mechopd.core.errors import TrainingError
from mechopd.core.views import assemble_two_views
from mechopd.generate.sampler import sample_rows, stable_seed
from mechopd.generate.settings import SamplingSettings
from mechopd.objectives.follow import draw_other
from mechopd.objectives.losses import LossTerm
from mechopd.train import dist
from mechopd.train.step import StepOptions, StepResult, StepScorer


def scorer(
    student: Any, teacher: Any, terms: list[LossTerm], selector: Any, params: list, opts: StepOptions
) -> StepScorer:
    """The other batch's scorer: no teacher prefix store (c′ varies by row); the caller shares its stage clock."""
    return StepScorer(student, teacher, terms, selector, params, opts, None)


@dataclass(frozen=True)
class OtherBatch:
    """The second rollout and its scorer, built once (`train.parts`) when a term has ``batch="other"``."""

    cfg: Any  # reads seed and follow_contexts
    task: Any
    sampler: Any  # the model the rollout samples from: the student, or its bf16 copy (`train.rollcopy`)
    sampling: SamplingSettings  # the main rollout's (engine, temperature, stops)
    agree: Callable | None  # prefix groups agreed across processes (`generate/groups.py`)
    scoring: StepScorer
    pad_id: int
    max_len: int | None
    device: torch.device

    @property
    def terms(self) -> list[LossTerm]:
        return self.scoring.terms

    def rollout(
        self, examples: list, rows: range, step: int, render: Callable[[str, str | None], list[int]]
    ) -> tuple[list[list[int]], list[list[int]]]:
        """(prompt ids with c′, response ids) for this process's rows that have an other context."""
        cfg = self.cfg
        picked = []
        for i in rows:
            seed = stable_seed(cfg.seed, step, i, "other") % (2**31)
            oc = draw_other(self.task, examples[i], cfg.follow_contexts, seed)
            if oc is not None:
                picked.append((render(examples[i].prompt, oc.context), seed))
        ids = [p for p, _ in picked]
        if not ids and dist.active():
            raise TrainingError(
                f"step {step + 1}: no row of this process has an other context, so the follow term "
                "cannot run in step with the others; use a task whose training items all define other "
                "contexts, or follow_weight=0"
            )
        responses = (
            sample_rows(
                self.sampler,
                ids,
                [s for _, s in picked],
                self.sampling.replace(batch_size=max(1, len(ids))),
                agree=self.agree,
            )
            if ids
            else []
        )  # the main rollout's settings (engine, temperature, stops)
        return ids, responses

    def add(
        self, main: StepResult, other: tuple[list[list[int]], list[list[int]]], step: int, per_term: bool
    ) -> StepResult:
        """The main batch's result with this batch's `StepScorer.step` added (when `other` holds rows)."""
        ids, responses = other
        if not ids:  # one process, no row with an other context this step: the other terms contribute 0
            zero = {f"loss/{t.name}": torch.zeros(()) for t in self.terms}
            return main._replace(
                logs={**main.logs, **zero}, weights={**main.weights, **{t.name: t.weight_at(step) for t in self.terms}}
            )
        obatch = assemble_two_views(ids, ids, responses, self.pad_id, max_length=self.max_len).to(self.device)
        return merge(main, self.scoring.step(obatch, step, per_term=per_term))


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
