"""The one scorer: a `TwoViewBatch` -> aligned response log-probabilities per requested view (and model role).

Only the response positions go through the LM head (``logits_to_keep``) in the left layout: for a real model's
150k-row head that is most of a forward's memory. One log-softmax per logits tensor, in float32, reused by every loss
term and selector. Logits are divided by the rollout temperature (docs/method.md: all distributions are computed from
logits / T) and cut to the common vocabulary ``vocab`` (teacher and student may differ by padding rows) BEFORE the
log-softmax, so padding rows carry no mass. Index t of every returned ``[batch, R, vocab]`` tensor is the distribution
that predicts response token t, in every view: teacher (context view), student (no-context view) and student (context
view) line up index for index. The trainer, the gradients probe and the teachability probe all score through here.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from mechopd.views import TwoViewBatch

# A role is (which model, which view): the three distributions the objectives read (objectives.losses.LossInputs).
ROLES = {"teacher": ("teacher", "c"), "student_nctx": ("student", "x"), "student_ctx": ("student", "c")}


def response_logits(model: Any, batch: TwoViewBatch, which: str) -> torch.Tensor:
    """``[batch, R, V]``: index t holds the logits that predict response token t in view `which` ("x" | "c")."""
    kw = batch.view(which)
    R = batch.response_ids.shape[1]
    if batch.layout == "left":
        out = model(**kw, logits_to_keep=R + 1, use_cache=False)
        return out.logits[:, :R]  # columns P-1 .. P+R-2 of the view
    out = model(**kw, use_cache=False)
    return batch.response_logits(out.logits, which)


def to_logp(logits: torch.Tensor, temperature: float, vocab: int | None = None) -> torch.Tensor:
    """log_softmax(logits[..., :vocab] / T) in float32. `vocab` restricts to the common ids (padding rows dropped)."""
    if vocab is not None:
        logits = logits[..., :vocab]
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def common_vocab_size(*models: Any) -> int:
    """The vocabulary every model's LM head covers: ``min_i rows(lm_head_i)`` (padding rows beyond it dropped)."""
    return min(int(m.get_output_embeddings().weight.shape[0]) for m in models)


def score_views(model: Any, batch: TwoViewBatch, views: Sequence[str] = ("x", "c"), *, temperature: float,
                vocab: int | None = None, grad: bool = True) -> dict[str, torch.Tensor]:
    """``{view: [batch, R, vocab] log-probs}`` of `model` on each requested view ("x" no context, "c" context).

    grad=False: the forwards run under ``torch.inference_mode()`` (no graph, no saved activations) and the results are
    returned as ordinary tensors, usable next to autograd tensors (a frozen teacher's targets).
    """
    out: dict[str, torch.Tensor] = {}
    with (contextlib.nullcontext() if grad else torch.inference_mode()):
        for v in views:
            out[v] = to_logp(response_logits(model, batch, v), temperature, vocab)
    return out if grad else {v: t.clone() for v, t in out.items()}


def score_roles(student: Any, teacher: Any | None, batch: TwoViewBatch, roles: Sequence[str], *, temperature: float,
                vocab: int | None = None) -> dict[str, torch.Tensor]:
    """``{role: [batch, R, vocab] log-probs}`` for the requested roles of `ROLES` (the objectives' inputs).

    The teacher scores the context view without grad; the student scores its views with grad. `vocab` None = the
    common vocabulary of the models involved.
    """
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ValueError(f"unknown scoring roles {unknown}; known: {sorted(ROLES)}")
    if "teacher" in roles and teacher is None:
        raise ValueError("scoring role 'teacher' needs a teacher model")
    if vocab is None:
        vocab = common_vocab_size(*([student] + ([teacher] if "teacher" in roles else [])))
    out: dict[str, torch.Tensor] = {}
    if "teacher" in roles:
        out["teacher"] = score_views(teacher, batch, ("c",), temperature=temperature, vocab=vocab, grad=False)["c"]
    student_views = [ROLES[r][1] for r in ("student_nctx", "student_ctx") if r in roles]
    s = score_views(student, batch, student_views, temperature=temperature, vocab=vocab, grad=True)
    for r in ("student_nctx", "student_ctx"):
        if r in roles:
            out[r] = s[ROLES[r][1]]
    return out
