"""The step guard: a non-finite step is never applied, and non-finite weights are never saved.

Checked on every step, in this order:
  1. each loss term's value (summed over processes) is finite — before the optimizer step (the step's backward
     passes run chunk by chunk with the forwards, `train.step`, so the value is known only after them; a NaN in
     ``.grad`` is never applied);
  2. the global gradient norm (after the reduce over processes, before clipping) is finite — before ``opt.step()``;
     when it is not, the per-term gradient norms name the term(s) responsible;
  3. the weights after the update are finite (one norm per parameter tensor; cheap next to a forward pass) — before
     any later save. Steps 1–2 keep a NaN gradient out of the weights; step 3 catches an update that overflows
     (e.g. a huge lr in half precision): the run stops and the in-memory weights are never written.
Every failure is a ``TrainingError`` naming the step; the newest checkpoint on disk is then the last good one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from mechopd.core.errors import TrainingError
from mechopd.train import dist

ADVICE = (
    "the step was not applied and nothing was saved; the newest checkpoint is the last good one — lower lr or "
    "check the teacher, then --resume"
)


def check_losses(values: dict[str, float], step: int) -> None:
    """``values``: ``{term name: global term value}``; ``step``: the 1-based step being computed."""
    for name, value in values.items():
        if not math.isfinite(value):
            raise TrainingError(f"loss term {name!r} became {value} at step {step}; {ADVICE}")


def check_grad_norm(norm: float, step: int, term_norms: Callable[[], dict[str, float]] | None) -> None:
    """``norm``: the global gradient norm; ``term_norms``: called only on failure, ``{term: its gradient norm}``."""
    if math.isfinite(norm):
        return
    culprit = "the summed gradient (per-term norms unavailable)"
    if term_norms is not None:
        norms = term_norms()
        bad = [t for t, v in norms.items() if not math.isfinite(v)]
        shown = ", ".join(f"{t}={v:.3g}" for t, v in norms.items())
        culprit = (
            f"term {' and '.join(repr(t) for t in bad)} (gradient norms {shown})"
            if bad
            else f"the summed gradient (every term's own norm is finite: {shown})"
        )
    raise TrainingError(f"gradient norm became {norm} at step {step}, from {culprit}; {ADVICE}")


def nonfinite_weights(params: list[torch.nn.Parameter]) -> int:
    """Number of parameter tensors (over all processes) holding a NaN or inf; a sharded tensor counts its shard."""
    local = [(p.to_local() if hasattr(p, "to_local") else p).detach() for p in params]
    if all(t.dtype == torch.float32 for t in local):  # one call over every tensor (no Python loop); finite or not
        norms = torch.stack(torch._foreach_norm(local))  # as the per-tensor norms below (tested)
    else:
        norms = torch.stack([torch.linalg.vector_norm(t.float()) for t in local])  # one host sync in all
    return int(dist.all_sum((~norms.isfinite()).sum().float().cpu()))


def check_weights(params: list[torch.nn.Parameter], step: int, what: str = "after the update") -> None:
    """Refuse non-finite weights (called after every update and before every save)."""
    n = nonfinite_weights(params)
    if n:
        raise TrainingError(
            f"{n} weight tensor(s) are non-finite {what} at step {step}; they were not saved, the "
            "newest checkpoint is the last good one — lower lr, then --resume"
        )
