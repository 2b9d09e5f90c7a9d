"""The ``follow`` term: keep the student reading prompts while it internalises one (docs/method.md "The follow term").

OPD distils the context c into the no-context view; nothing in it asks the student to keep reading OTHER contexts,
and on the rules organism OPD and NCA students stop doing so (context-deaf, `mechopd.evaluation.following`). The follow term
self-distils the task's other contexts on-policy, exactly as OPD distils c, but with c′ in both views:

    L_follow = E_x E_{c′ ~ U(C′)} E_{y ~ q_θ(·|x,c′)} (1/|y|) Σ_t KL( q_θ(·|x,c′,y<t) ‖ f(·|x,c′,y<t) )

C′ = the example's other contexts (`Task.other_contexts`), restricted to ``follow_contexts`` when given; c′ is drawn
uniformly per row, seeded by (seed, step, row). f is the frozen teacher (the initial student for self-distillation),
which still follows c′; the reverse KL has OPD's estimator forms (`TermOptions`: top-k, full, sampled). The total is
    L = L_OPD [+ β·L_NCA] + follow_weight · L_follow
combinable with NCA and with any token selector (the selector's keep-mask covers the main batch only: the follow
term is not selectable). It is computed on its own rollout batch (``batch="other"``): in that batch the
``student_nctx`` slot of `LossInputs` holds q_θ(·|x,c′) and ``teacher`` holds f(·|x,c′); its own scorer pass
(`train.otherbatch`) divides by that batch's global token count and adds its gradients to the step's. Cost: one
extra rollout, one student forward + backward and one teacher forward per step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from mechopd.config.terms import FollowOptions
from mechopd.core.errors import ConfigError
from mechopd.objectives.losses import TERMS, TermOptions, register_term
from mechopd.tasks.base import OtherContext


def _follow_label(run: Any) -> str:
    """`` + follow (w=1)``: the follow term's weight, after the method's label."""
    return f" + follow (w={run.section(FollowOptions).follow_weight:g})"


@register_term("follow", batch="other", options=FollowOptions, weight="follow_weight", added=True, label=_follow_label)
def _follow_term(o: TermOptions, own: FollowOptions | None = None):
    """L_follow = KL(q_θ(·|x,c′) ‖ f(·|x,c′)) in OPD's estimator form, read on the other-context batch."""
    return TERMS["opd"].build(o)


def check_follow_contexts(task: Any, pool: Sequence[Any], labels: Sequence[str] | None) -> None:
    """Refuse a follow term the task cannot feed: no other contexts at all, or a label no training item has."""
    seen = {oc.label for ex in pool for oc in task.other_contexts(ex)}
    if not seen:
        raise ConfigError(
            f"follow_weight > 0 or follow_contexts given, but task {task.name!r} defines no other "
            "contexts on its training items (Task.other_contexts); drop them or use a task that has them"
        )
    missing = sorted(set(labels or ()) - seen)
    if missing:
        raise ConfigError(
            f"follow_contexts: {missing[0]!r} is not an other context of task {task.name!r}; choose "
            f"from {', '.join(sorted(seen))}"
        )


def draw_other(task: Any, example: Any, labels: Sequence[str] | None, seed: int) -> OtherContext | None:
    """One other context of `example`, uniform over those allowed by `labels` (None: all), seeded; None if none."""
    allowed = [oc for oc in task.other_contexts(example) if labels is None or oc.label in labels]
    return random.Random(seed).choice(allowed) if allowed else None
