"""One optimizer step's forwards and backwards, in micro-batches of rows and chunks of response positions.

The update equals the one-shot step's (one forward of the whole batch, `losses.total_loss`, one backward): every term
is a token mean whose denominator is the GLOBAL count (all rows of all micro-batches of all processes), so each
chunk's loss is its share of the whole batch's mean and the gradients of the shares sum, by linearity, to the
one-shot gradient. For this process's B rows, split into ``micro_batch_size`` rows (all of them when unset):

  0. teacher, no grad: the trunk per micro-batch; its final hidden states ``[b, R, d]`` are kept for the step
     (d per position, not V);
  1. selection, only for a selector that reads signals (TA-OPD and the score baselines): per micro-batch the
     student's no-context trunk without grad (the grad pass of step 2 is reused when there is one micro-batch),
     then per chunk head -> log-softmax -> `signals.teachability_stats` ``[b, c]`` (one micro-batch of one chunk:
     the heads and log-probs are kept and the loss pass reads them, computed once); the selector then decides ONCE
     over all rows of all processes (⌈ρN⌉ over the whole batch; `Selector.from_stats`), before any loss pass;
  2. loss: per micro-batch the student's trunk(s) with grad; the outputs are detached into leaves; per chunk of
     ``logit_chunk`` positions: head -> log-softmax (or, for a term that reads only ``log q(y_t)``, a logsumexp and a
     gather) -> `losses.total_loss` with the global denominators -> backward into the leaves and the head, so the
     chunk's ``[b, c, V]`` graph is freed before the next chunk; then one backward through the trunk.
No ``[rows, R, V]`` tensor of a whole micro-batch exists when ``logit_chunk`` is set (the head runs on one chunk).

Per-term gradients (``grad_stats_every``): the same passes with ``autograd.grad`` per term instead of ``backward``,
accumulated over chunks and micro-batches (`gradstats.TermGrads`); nothing is written to ``.grad``.
Processes: the number of micro-batches is agreed (the largest); a process with fewer rows runs a masked copy of its
first row, which adds nothing, so collectives (prefix agreement, FSDP) line up.
A model without a trunk/head split (`scorer.head_split`: FSDP-wrapped, or an unusual head) scores through its full
forward: its "hidden states" are then the response logits and the head is the identity (no chunking, refused in the
config). ``kl/teacher_student`` is logged exactly when the teacher's full distribution is computed (full and top-k
estimators; TA-OPD); for the sampled estimator it is the batch mean of the single-sample estimate log q_x(y)/f(y).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.profiler import record_function

from mechopd.config import TrainConfig
from mechopd.core.views import TwoViewBatch
from mechopd.generate.prefix import PrefixStore
from mechopd.generate.sampler import stable_seed
from mechopd.generate.scorer import (
    ROLES,
    head_logits,
    head_split,
    response_hidden,
    response_logits,
    to_logp,
    token_logp,
)
from mechopd.objectives.divergences import _kl
from mechopd.objectives.losses import LossInputs, LossTerm, terms_need, total_loss
from mechopd.objectives.select import Selector, pack_stats, unpack_stats
from mechopd.objectives.signals import TeachabilityStats, cat_stats, teachability_stats
from mechopd.train import dist
from mechopd.train.chunksums import ChunkSums
from mechopd.train.profile import StageClock


@dataclass(frozen=True)
class StepOptions:
    """temperature, vocab (the common ids), budget (ρ), seed; micro_batch_size / logit_chunk (None = whole batch /
    whole response); shared_prefix (teacher), student_shared_prefix (None = the same); autocast (a dtype or None)."""

    temperature: float
    vocab: int
    budget: float
    seed: int
    micro_batch_size: int | None = TrainConfig.micro_batch_size  # the defaults: read from their declarations
    logit_chunk: int | None = TrainConfig.logit_chunk
    shared_prefix: str = TrainConfig.shared_prefix
    student_shared_prefix: str | None = None
    autocast: torch.dtype | None = None


_Memo = dict[str, tuple[Tensor, Tensor]] | None  # {role: (logits, log-probs)} of one chunk, shared by two passes


class StepResult(NamedTuple):
    """This process's shares (summed over processes they give the global values): ``loss``, ``logs`` (``loss/<t>``,
    ``<t>/<stat>``, ``kl/teacher_student``); ``weights`` ``{term: w}``; ``kept`` the global kept fraction;
    ``term_grads`` ``{term: [grad per parameter]}`` on a per-term step (else None); ``prefix``: {role: shared len};
    ``keep``: this process's ``[B, R]`` keep-mask of the selectable terms (None without one)."""

    loss: Tensor
    logs: dict[str, Tensor]
    weights: dict[str, float]
    kept: float
    term_grads: dict[str, list[Tensor]] | None
    prefix: dict[str, int]
    keep: Tensor | None = None


def rows(batch: TwoViewBatch, sl: slice) -> TwoViewBatch:
    """The rows `sl` of a batch (every tensor field is ``[batch, ...]``)."""
    fields: dict[str, Any] = {k: v[sl] for k, v in vars(batch).items() if isinstance(v, Tensor)}
    return dataclasses.replace(batch, **fields)


def enable_checkpointing(model: Any) -> None:
    """Activation checkpointing of the decoder layers (non-reentrant), transformers 5 name first."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class StepScorer:
    """Scores, selects and back-propagates one two-view batch (module docstring). Build once per run."""

    head_line = "loss head: logits"  # `train.headstep.make_scorer` says which head and why
    shares_heads = True  # the loss pass reads the selection's logits (a head that never forms them: False)

    def __init__(
        self,
        student: Any,
        teacher: Any,
        terms: list[LossTerm],
        selector: Selector,
        params: list[torch.nn.Parameter],
        opts: StepOptions,
        teacher_store: PrefixStore | None = None,
    ):
        self.student, self.teacher, self.terms, self.selector = student, teacher, terms, selector
        self.params, self.opts, self.store = params, opts, teacher_store
        self.clock = StageClock()  # seconds per stage (`train.profile`); the trainer resets it every step
        self.needs = terms_need(terms)
        self.roles = [r for r in ROLES if r in self.needs or f"{r}_token" in self.needs]  # a role per LossInputs view
        self.student_roles = [r for r in self.roles if ROLES[r][0] == "student"]
        self.split = {id(m): head_split(m) is not None for m in (student, teacher)}
        tokens_only = {"student_nctx_token", "teacher_token"} <= self.needs
        self.exact_kl = ("teacher" in self.needs and "student_nctx" in self.needs) or not tokens_only

    # -- pieces ----------------------------------------------------------------------------------------------------
    def _amp(self) -> Any:
        o = self.opts
        dev = self.student.device.type if hasattr(self.student, "device") else "cpu"
        return torch.autocast(dev, dtype=o.autocast) if o.autocast is not None else contextlib.nullcontext()

    def _hidden(self, role: str, mb: TwoViewBatch, info: dict[str, int]) -> Tensor:
        """``[b, R, d]`` trunk output of `role` (``[b, R, V]`` logits for a model without a split); grad as the
        caller's mode."""
        which, view = ROLES[role]
        teacher = which == "teacher"
        model = self.teacher if teacher else self.student
        mode = (
            self.opts.shared_prefix
            if teacher or self.opts.student_shared_prefix is None
            else self.opts.student_shared_prefix
        )
        fn = response_hidden if self.split[id(model)] else response_logits
        sub: dict[str, int] = {}
        stage = "teacher" if teacher else "student_fwd"
        with self._amp(), record_function(f"mechopd.trunk.{role}"), self.clock(stage):
            out = fn(
                model,
                mb,
                view,
                shared_prefix=mode,
                agree=dist.agree_prefix if dist.active() else None,
                store=self.store if teacher else None,
                info=sub,
            )
        info[role], info[f"{role}:rows"] = sub[view], sub.get(f"{view}:rows", 0)
        return out

    def _head(self, model: Any, h: Tensor) -> Tensor:
        """Logits ``[b, c, vocab]`` of hidden states ``[b, c, d]`` (identity + vocab cut for a model without split)."""
        if not self.split[id(model)]:
            return h[..., : self.opts.vocab] if h.shape[-1] != self.opts.vocab else h
        with self._amp(), record_function("mechopd.head"):
            return head_logits(model, h, self.opts.vocab)

    def _chunks(self, R: int) -> list[slice]:
        c = self.opts.logit_chunk or max(R, 1)
        return [slice(i, min(i + c, R)) for i in range(0, R, c)]

    def _micro(self, B: int) -> list[tuple[slice, bool]]:
        """(rows, real) per micro-batch; the count is the largest over processes (extra ones: a masked copy)."""
        m = self.opts.micro_batch_size or max(B, 1)
        n = math.ceil(B / m)
        if dist.active():
            n = int(dist.all_gather_rows(torch.tensor([[float(n)]]))[0].max())
        return [(slice(i * m, min((i + 1) * m, B)), True) if i * m < B else (slice(0, 1), False) for i in range(n)]

    def _inputs(
        self, leaves: dict[str, Tensor], th: Tensor, tokens: Tensor, c: slice, exact_kl: bool, memo: _Memo = None
    ) -> tuple[LossInputs, Tensor]:
        """The terms' inputs on chunk `c` (student ones with grad through the leaves) and the per-position KL log.
        `memo`: {role: (logits, log-probs)} the selection already computed on this chunk (`_signals`)."""
        T, need, memo = self.opts.temperature, self.needs, memo or {}
        tok = tokens[:, c]
        vals: dict[str, Tensor | None] = {"tokens": tok}
        with torch.no_grad():
            t_logits, t_full = memo.get("teacher") or (self._head(self.teacher, th[:, c]), None)
            if t_full is None and ("teacher" in need or exact_kl):
                t_full = _logp(t_logits, T)
            vals["teacher"] = t_full
            vals["teacher_token"] = _token(t_full, t_logits, tok, T) if "teacher_token" in need else None
            del t_logits
        for role in leaves:  # the student's roles (with grad through their leaves)
            logits, full = memo.get(role) or (self._head(self.student, leaves[role][:, c]), None)
            if full is None and (role in need or (exact_kl and role == "student_nctx")):
                full = _logp(logits, T)
            vals[role] = full
            if f"{role}_token" in need:
                vals[f"{role}_token"] = _token(full, logits, tok, T)
        with torch.no_grad(), record_function("mechopd.kl_log"):
            s_full, s_tok, t_tok = vals.get("student_nctx"), vals.get("student_nctx_token"), vals.get("teacher_token")
            if exact_kl:  # both full log-probs exist then (`exact_kl`)
                assert s_full is not None and t_full is not None
                kl = _kl(s_full.detach(), t_full)
            else:  # both token log-probs exist then
                assert s_tok is not None and t_tok is not None
                kl = (s_tok - t_tok).detach()
        vals["teacher"] = t_full if "teacher" in need else None
        return LossInputs(**{k: vals.get(k) for k in LossInputs.__dataclass_fields__}), kl

    # -- phases ----------------------------------------------------------------------------------------------------
    def _select(
        self, batch: TwoViewBatch, micro: list, teacher_h: list, cached: Tensor | None, step: int, memo: _Memo = None
    ) -> tuple[Tensor | None, float]:
        """Keep-mask ``[B, R]`` for the selectable terms over the whole batch of all processes (None: no selectable
        term) and the kept fraction. `cached`: the one micro-batch's no-context leaf; `memo` (one micro-batch of one
        chunk): filled with the student's logits (with grad through `cached`) and the teacher's, and their log-probs,
        for the loss pass to read instead of computing them again."""
        if not any(t.selectable for t in self.terms):
            return None, 1.0
        sel, mask, o = self.selector, batch.response_mask, self.opts
        gen = torch.Generator().manual_seed(stable_seed(o.seed, step, -1) % (2**31))
        stats = None
        if sel.needs_stats:
            parts = []
            for (sl, real), th in zip(micro, teacher_h):
                mb = rows(batch, sl)
                with torch.no_grad():
                    hx = cached if cached is not None else self._hidden("student_nctx", mb, {})
                    th = th if th is not None else self._hidden("teacher", mb, {})
                    if real:
                        parts.append(self._signals(hx, th, mb.response_mask, memo))
            stats = cat_stats(parts, 0)
        if not dist.active():
            out = sel.from_stats(stats, mask, o.budget, gen)
            return out.keep, out.kept_fraction
        full, start = dist.all_gather_rows(pack_stats(mask, stats).cpu())
        gmask, gstats = unpack_stats(full)  # by field name: every TeachabilityStats field travels
        out = sel.from_stats(gstats, gmask, o.budget, gen)
        B, R = mask.shape
        return out.keep[start : start + B, :R].to(mask.device), out.kept_fraction

    def _signals(self, hx: Tensor, th: Tensor, mask: Tensor, memo: _Memo = None) -> TeachabilityStats:
        """TA-OPD signals ``[b, R]`` (C, D, H; no selector reads kl_full), per chunk of positions (`_select` on
        `memo`)."""
        sg, T, out = self.selector.signals, self.opts.temperature, []
        for c in self._chunks(mask.shape[1]):
            with torch.set_grad_enabled(memo is not None):  # kept for the loss: the student's head with grad
                s_logits = self._head(self.student, hx[:, c] if memo is not None else hx[:, c].detach())
                s = _logp(s_logits, T)
            t_logits = self._head(self.teacher, th[:, c])
            t = _logp(t_logits, T)
            if memo is not None:
                memo.update(student_nctx=(s_logits, s), teacher=(t_logits, t))
            out.append(teachability_stats(s, t, mask[:, c], sg.k, sg.c_mode, sg.d_mode, kl_full=False))
        return cat_stats(out, 1)

    def step(self, batch: TwoViewBatch, step: int, per_term: bool = False) -> StepResult:
        """Forward + backward of the whole batch (module docstring); gradients ADD to ``.grad`` (zero them first),
        or, with `per_term`, are returned per term and ``.grad`` is untouched."""
        mask, info = batch.response_mask, dict[str, int]()
        micro = self._micro(batch.batch_size)
        keep_teacher = self.split[id(self.teacher)]  # [b, R, d] per micro-batch is cheap to keep
        teacher_h: list[Tensor | None] = [None] * len(micro)
        with torch.no_grad():
            if keep_teacher:
                teacher_h = [self._hidden("teacher", rows(batch, sl), info) for sl, _ in micro]
        cached: dict[str, Tensor] | None = None
        first: dict[str, Tensor] | None = None
        memo: _Memo = None
        if len(micro) == 1:  # the grad pass serves the selection too (and, on one chunk, its heads: `_select`)
            cached = {r: self._hidden(r, rows(batch, micro[0][0]), info) for r in self.student_roles}
            first = {r: h.detach().requires_grad_() for r, h in cached.items()}
            one_chunk = len(self._chunks(mask.shape[1])) == 1
            memo = {} if self.shares_heads and one_chunk and "student_nctx" in first else None
        with record_function("mechopd.select"), self.clock("loss"):
            keep, kept = self._select(
                batch, micro, teacher_h, None if first is None else first.get("student_nctx"), step, memo
            )
        den = (dist.all_sum(mask.sum().float()), None if keep is None else dist.all_sum((mask & keep).sum().float()))
        acc = ChunkSums(self.terms, self.params, self._head_params(), per_term)
        for i, (sl, real) in enumerate(micro):
            mb = rows(batch, sl)
            mmask = mb.response_mask if real else torch.zeros_like(mb.response_mask)
            mkeep = None if keep is None else (keep[sl] if real else torch.zeros_like(mmask))
            with torch.no_grad():
                th = teacher_h[i]
                th = th if th is not None else self._hidden("teacher", mb, info)
            hs = cached or {r: self._hidden(r, mb, info) for r in self.student_roles}
            leaves = first or {r: h.detach().requires_grad_() for r, h in hs.items()}
            with self.clock("loss"):
                self._loss(leaves, th, mb.response_ids, mmask, mkeep, den, step, acc, memo)
            cached, first, memo = None, None, None
            with self.clock("student_bwd"):
                acc.trunk(hs, leaves)
        return StepResult(
            torch.as_tensor(acc.loss), acc.logs, acc.weights, kept, acc.grads.result() if per_term else None, info, keep
        )

    def _loss(
        self,
        leaves: dict[str, Tensor],
        th: Tensor,
        tokens: Tensor,
        mask: Tensor,
        keep: Tensor | None,
        den: tuple,
        step: int,
        acc: ChunkSums,
        memo: _Memo = None,
    ) -> None:
        """One micro-batch's loss, per chunk of positions, into `acc` (backward into the leaves and the head); `memo`:
        the heads the selection computed on a single chunk (`_select`)."""
        for c in self._chunks(mask.shape[1]):
            inputs, kl = self._inputs(leaves, th, tokens, c, self.exact_kl, memo)
            memo = None
            res = total_loss(
                self.terms, inputs, mask[:, c], None if keep is None else keep[:, c], step=step, denominators=den
            )
            acc.chunk(res, leaves, torch.where(mask[:, c], kl, 0.0).sum() / den[0])
            del inputs, res

    def _head_params(self) -> list[torch.nn.Parameter]:
        head = head_split(self.student) if self.split[id(self.student)] else None
        return [] if head is None else [p for p in head.parameters() if p.requires_grad]


def _logp(logits: Tensor, T: float) -> Tensor:
    with record_function("mechopd.log_softmax"):
        return to_logp(logits, T)


def _token(full: Tensor | None, logits: Tensor, tokens: Tensor, T: float) -> Tensor:
    """``log q(y_t)`` ``[b, c]``: gathered from the full log-probs when they exist, else logsumexp + gather."""
    if full is not None:
        return full.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return token_logp(logits, tokens, T)
