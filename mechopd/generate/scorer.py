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
from collections.abc import Sequence
from typing import Any

import torch

from mechopd.config.sections import RolloutOptions
from mechopd.core.views import TwoViewBatch
from mechopd.generate.groups import take_rows, ungroup, view_groups
from mechopd.generate.prefix import Agree, PrefixStore, cache_kwargs, view_inputs
from mechopd.generate.settings import check_known_ids
from mechopd.models import vocab_size

# A role is (which model, which view): the three distributions the objectives read (objectives.losses.LossInputs).
ROLES = {"teacher": ("teacher", "c"), "student_nctx": ("student", "x"), "student_ctx": ("student", "c")}


def response_logits(
    model: Any,
    batch: TwoViewBatch,
    which: str,
    *,
    shared_prefix: str = "off",
    agree: Agree | None = None,
    store: PrefixStore | None = None,
    info: dict[str, int] | None = None,
) -> torch.Tensor:
    """``[batch, R, V]``: index t holds the logits that predict response token t in view `which` ("x" | "c").

    shared_prefix "auto": a token prefix common to every row is computed once at batch size 1 (generate/prefix.py,
    exact); when the rows' contexts differ, once per prefix group (generate/groups.py). `info[which]` records the
    longest shared length (0 = the unshared forward ran), ``info[which + ":rows"]`` how many rows ran shared.
    `store`: reuse a frozen model's prefix keys/values across calls (call under no grad only). `agree`: make every
    process take the same path (one common prefix of the global batch).
    """
    return _grouped(model, batch, which, shared_prefix, agree, store, info, hidden=False)


def response_hidden(
    model: Any,
    batch: TwoViewBatch,
    which: str,
    *,
    shared_prefix: str = "off",
    agree: Agree | None = None,
    store: PrefixStore | None = None,
    info: dict[str, int] | None = None,
) -> torch.Tensor:
    """``[batch, R, d]``: the final (normed) hidden state whose head output predicts response token t (the trunk
    only; `head_logits` finishes it). The model must have a `head_split`. Prefix options as `response_logits`."""
    return _grouped(model, batch, which, shared_prefix, agree, store, info, hidden=True)


def _grouped(
    model: Any,
    batch: TwoViewBatch,
    which: str,
    shared_prefix: str,
    agree: Agree | None,
    store: PrefixStore | None,
    info: dict[str, int] | None,
    hidden: bool,
) -> torch.Tensor:
    """`response_logits` / `response_hidden` over the batch's prefix groups (one group: the whole batch)."""
    groups = view_groups(batch, which, shared_prefix, agree)
    if groups is None:
        out, n = _forward(model, batch, which, shared_prefix, agree, store, None, hidden)
        lengths, rows = [n], (batch.batch_size if n else 0)
    else:
        parts = [
            _forward(model, take_rows(batch, g.rows), which, shared_prefix, None, store, g.length, hidden)
            for g in groups
        ]
        out, lengths = ungroup([p for p, _ in parts], groups), [n for _, n in parts]
        rows = sum(len(g.rows) for g, (_, n) in zip(groups, parts) if n)
    if info is not None:
        info[which], info[f"{which}:rows"] = max(lengths), rows
    return out


def _forward(
    model: Any,
    batch: TwoViewBatch,
    which: str,
    mode: str,
    agree: Agree | None,
    store: PrefixStore | None,
    length: int | None,
    hidden: bool,
) -> tuple[torch.Tensor, int]:
    b, extra, n = view_inputs(model, batch, which, mode=mode, agree=agree, store=store, length=length)
    if hidden:
        base = model.base_model
        rekeyed = {}  # the cache under the name the base model's forward takes (read from its signature, as prefix.py)
        for k, v in extra.items():
            rekeyed.update({k: v} if k == "use_cache" else cache_kwargs(base, v))
        h = base(**{**b.view(which), "use_cache": False, **rekeyed}).last_hidden_state  # [B, L', d]
        return b.response_logits(h, which), n  # the shift by one: column P+t-1 predicts token t
    kw = {**b.view(which), "use_cache": False, **extra}
    if b.layout == "left":  # exactly the R columns P-1 .. P+R-2 through the head (no R+1 kept, no slice after)
        return model(**kw, logits_to_keep=_left_columns(b, which)).logits, n
    return b.response_logits(model(**kw).logits, which), n


def _left_columns(batch: TwoViewBatch, which: str) -> torch.Tensor:
    """``[R]`` long: the columns whose outputs predict the response tokens (left layout: ``P-1 .. P+R-2``)."""
    start = int((batch.cols_x if which == "x" else batch.cols_c)[0, 0]) - 1
    return torch.arange(start, start + batch.response_ids.shape[1], device=batch.response_ids.device)


# -- the chunkable split: trunk once, then the LM head per chunk of response positions -----------------------------
# Supported where the head is a plain ``nn.Linear`` over the base model's last hidden state (Llama, Qwen2, Qwen3,
# Mistral; Gemma-2's final soft-capping is applied). Any other causal LM, and FSDP-wrapped models (whose root holds the
# head), score through the full forward (`response_logits`) and cannot be chunked (`head_split` returns None).


def head_split(model: Any) -> torch.nn.Linear | None:
    """The LM head when `model` can be split into trunk + head, else None (see above)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, "base_model", model)
    if type(head) is not torch.nn.Linear or base is model or type(model).__name__.startswith("FSDP"):
        return None
    if any(getattr(model.config, a, None) not in (None, 1, 1.0) for a in ("logit_scale", "logits_scaling")):
        return None
    return head


def head_logits(model: Any, hidden: torch.Tensor, vocab: int | None = None) -> torch.Tensor:
    """``[..., d] -> [..., vocab]``: the LM head on hidden states, only its first `vocab` rows (no slice after)."""
    head = head_split(model)
    if head is None:
        raise ValueError("head_logits: this model has no separate LM head (head_split(model) is None); score it whole")
    w = head.weight if vocab is None else head.weight[:vocab]
    bias = None if head.bias is None else (head.bias if vocab is None else head.bias[:vocab])
    logits = torch.nn.functional.linear(hidden, w, bias)
    cap = getattr(model.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def to_logp(logits: torch.Tensor, temperature: float, vocab: int | None = None) -> torch.Tensor:
    """log_softmax(logits[..., :vocab] / T) in float32. `vocab` restricts to the common ids (padding rows dropped).

    No pass is spent on a no-op: no slice when `vocab` is the width, no cast for float32, no division at T = 1."""
    if vocab is not None and vocab != logits.shape[-1]:
        logits = logits[..., :vocab]
    logits = logits.float()
    return torch.log_softmax(logits if temperature == 1 else logits / temperature, dim=-1)


def token_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log softmax(logits / T)[y_t]`` without the full log-probabilities: ``z_y/T − logsumexp(z/T)``.

    logits: ``[batch, seq, vocab]`` (already the common vocabulary); tokens: ``[batch, seq]`` -> ``[batch, seq]`` f32."""
    z = logits.float()
    z = z if temperature == 1 else z / temperature
    return z.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1) - z.logsumexp(-1)


def common_vocab_size(*models: Any) -> int:
    """The vocabulary every model's LM head covers: ``min_i rows(lm_head_i)`` (padding rows beyond it dropped)."""
    return min(vocab_size(m) for m in models)


def score_views(
    model: Any,
    batch: TwoViewBatch,
    views: Sequence[str] = ("x", "c"),
    *,
    temperature: float,
    vocab: int | None = None,
    grad: bool = True,
    shared_prefix: str = RolloutOptions.shared_prefix,
    agree: Agree | None = None,
    store: PrefixStore | None = None,
    info: dict[str, int] | None = None,
) -> dict[str, torch.Tensor]:
    """``{view: [batch, R, vocab] log-probs}`` of `model` on each requested view ("x" no context, "c" context).

    grad=False: the forwards run under ``torch.no_grad()`` (no graph, no saved activations): ordinary tensors, usable
    next to autograd tensors (a frozen teacher's targets) without a copy out of inference mode.
    shared_prefix / agree / store / info: see `response_logits` (the store is used only when grad=False).
    """
    check_known_ids(batch.response_ids, batch.response_mask, vocab if vocab is not None else vocab_size(model))
    out: dict[str, torch.Tensor] = {}
    with contextlib.nullcontext() if grad else torch.no_grad():  # no_grad, not inference_mode: no clone after
        for v in views:
            logits = response_logits(
                model, batch, v, shared_prefix=shared_prefix, agree=agree, store=None if grad else store, info=info
            )
            out[v] = to_logp(logits, temperature, vocab)
    return out


def score_roles(
    student: Any,
    teacher: Any | None,
    batch: TwoViewBatch,
    roles: Sequence[str],
    *,
    temperature: float,
    vocab: int | None = None,
    shared_prefix: str = RolloutOptions.shared_prefix,
    agree: Agree | None = None,
    teacher_store: PrefixStore | None = None,
    student_shared_prefix: str | None = None,
    info: dict[str, int] | None = None,
) -> dict[str, torch.Tensor]:
    """``{role: [batch, R, vocab] log-probs}`` for the requested roles of `ROLES` (the objectives' inputs).

    The teacher scores the context view without grad (its shared prefix reused from `teacher_store` if given); the
    student scores its views with grad (its context-view prefix at batch 1 in the graph, expanded to the rows).
    `vocab` None = the common vocabulary of the models involved. `info` gets ``{role: shared prefix length}``.
    student_shared_prefix: the student's own switch (None = `shared_prefix`; FSDP2 cannot backward through two
    forwards of one sharded module, so the trainer turns it off there).
    """
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ValueError(f"unknown scoring roles {unknown}; known: {sorted(ROLES)}")
    if "teacher" in roles and teacher is None:
        raise ValueError("scoring role 'teacher' needs a teacher model")
    if vocab is None:
        vocab = common_vocab_size(*([student] + ([teacher] if "teacher" in roles else [])))
    out: dict[str, torch.Tensor] = {}
    kw: dict[str, Any] = dict(temperature=temperature, vocab=vocab, agree=agree)
    paths: dict[str, int] = {}
    if "teacher" in roles:
        t_info: dict[str, int] = {}
        out["teacher"] = score_views(
            teacher, batch, ("c",), grad=False, store=teacher_store, info=t_info, shared_prefix=shared_prefix, **kw
        )["c"]
        paths["teacher"], paths["teacher:rows"] = t_info["c"], t_info["c:rows"]
    student_views = [ROLES[r][1] for r in ("student_nctx", "student_ctx") if r in roles]
    s_info: dict[str, int] = {}
    s_mode = shared_prefix if student_shared_prefix is None else student_shared_prefix
    s = score_views(student, batch, student_views, grad=True, info=s_info, shared_prefix=s_mode, **kw)
    for r in ("student_nctx", "student_ctx"):
        if r in roles:
            out[r], paths[r], paths[f"{r}:rows"] = s[ROLES[r][1]], s_info[ROLES[r][1]], s_info[f"{ROLES[r][1]}:rows"]
    if info is not None:
        info.update(paths)
    return out
