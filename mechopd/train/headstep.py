"""The fused loss head in the training step (``loss_head``): `objectives.head` in place of LM head -> log-softmax ->
`losses.total_loss` per chunk of positions.

``loss_head: auto`` takes the fused head when it can compute the method (its main-batch terms are OPD and NCA, in any
estimator), both models' LM heads are plain bias-free linear layers without logit soft-capping (`scorer.head_split`),
sharding is none and the common vocabulary has at least `FUSED_MIN_VOCAB` ids (below that the logits path is as
fast and the head buys no memory); ``fused`` insists (one line naming what stops it); ``logits`` never uses it.

Per micro-batch, `FusedStepScorer._loss` gathers the masked response positions of every role's leaf ``[b, R, d] ->
[n, d]`` and calls the head ONCE over them, in chunks of ``logit_chunk`` positions (`DEFAULT_CHUNK` when unset), with
the same weights `total_loss` would give each term (mask, or mask & keep for a selectable term, over the GLOBAL
counts `train.step` passes as ``den``): the shares over chunks, micro-batches and processes still sum to the one-shot
update. The logs are the logits path's keys (``loss/opd``, ``loss/nca``, ``opd/topk_mass`` | ``opd/kl_estimate``,
``kl/teacher_student``). On a per-term step (``grad_stats_every``) each term is its own head call, so its gradient can
be taken apart. The follow term's batch (`otherbatch`) and the TA-OPD selection signals stay on the logits path.
Numerics: the head computes in float32 (float64 for float64 models) also under bf16 autocast.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mechopd.config.sections import FUSED_TERMS
from mechopd.core.errors import ConfigError, ModelError
from mechopd.generate.scorer import head_split
from mechopd.objectives.head import fused_head_loss
from mechopd.objectives.losses import LossResult, LossTerm, TermOptions
from mechopd.train.step import StepScorer

FUSED_MIN_VOCAB = 8192  # `auto` below this vocabulary: the logits path
DEFAULT_CHUNK = 512  # positions per head chunk when logit_chunk is unset ([512, V] float32 buffers, a handful)


def fused_blocker(terms: list[LossTerm], student: Any, teacher: Any) -> str | None:
    """Why the fused head cannot compute these terms on these models (None: it can)."""
    other = sorted({t.name for t in terms} - FUSED_TERMS)
    if other:
        return f"it computes the opd and nca terms only, not {', '.join(other)}"
    for role, model in (("student", student), ("teacher", teacher)):
        head = head_split(model)
        if head is None:
            return f"the {role}'s LM head cannot run apart from its trunk (FSDP-wrapped or not a plain linear head)"
        if head.bias is not None or getattr(model.config, "final_logit_softcapping", None) is not None:
            return f"the {role}'s LM head has a bias or soft-caps its logits"
    return None


def head_choice(
    loss_head: str, terms: list[LossTerm], student: Any, teacher: Any, vocab: int, sharding: str
) -> tuple[bool, str]:
    """``loss_head`` resolved for this run (module docstring): (fused?, why, as the trainer prints it);
    ``fused`` where it cannot run: `ConfigError`."""
    if loss_head == "logits":
        return False, "loss_head=logits"
    why = "sharding is not none" if sharding != "none" else fused_blocker(terms, student, teacher)
    if loss_head == "fused" and why:
        raise ConfigError(f"loss_head=fused cannot run here: {why}; set loss_head=logits (or auto)")
    if loss_head == "fused":
        return True, "loss_head=fused"
    if why:
        return False, f"auto: {why}"
    if vocab < FUSED_MIN_VOCAB:
        return False, f"auto: vocabulary {vocab} < {FUSED_MIN_VOCAB}, where the logits path is as fast"
    return True, f"auto: vocabulary {vocab} >= {FUSED_MIN_VOCAB}, opd/nca terms, plain linear LM heads"


def use_fused(loss_head: str, terms: list[LossTerm], student: Any, teacher: Any, vocab: int, sharding: str) -> bool:
    """Whether `head_choice` takes the fused head."""
    return head_choice(loss_head, terms, student, teacher, vocab, sharding)[0]


def make_scorer(
    cfg: Any,
    student: Any,
    teacher: Any,
    terms: list[LossTerm],
    selector: Any,
    params: list,
    opts: Any,
    store: Any = None,
) -> StepScorer:
    """The main batch's scorer: `FusedStepScorer` when ``cfg.loss_head`` resolves to fused, else `StepScorer`."""
    fused, why = head_choice(cfg.loss_head, terms, student, teacher, opts.vocab, cfg.sharding)
    if fused:
        options = TermOptions(cfg.estimator, cfg.topk, cfg.renormalize, cfg.tail)
        scorer: StepScorer = FusedStepScorer(student, teacher, terms, selector, params, opts, store, options=options)
    else:
        scorer = StepScorer(student, teacher, terms, selector, params, opts, store)
    scorer.head_line = f"loss head: {'fused' if fused else 'logits'} ({why})"
    return scorer


class FusedStepScorer(StepScorer):
    """`StepScorer` whose per-micro-batch loss is the fused head (module docstring)."""

    head = "fused"
    shares_heads = False  # the fused head reads hidden states: the selection's logits are not kept for it

    def __init__(self, *args: Any, options: TermOptions, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.options = options
        blocker = fused_blocker(self.terms, self.student, self.teacher)
        if blocker:
            raise ConfigError(f"loss_head=fused cannot run here: {blocker}; set loss_head=logits (or auto)")

    def _loss(
        self,
        leaves: dict[str, Tensor],
        th: Tensor,
        tokens: Tensor,
        mask: Tensor,
        keep: Tensor | None,
        den: tuple,
        step: int,
        acc: Any,
        memo: Any = None,  # always None here (`shares_heads` is False: this head never forms the logits)
    ) -> None:
        pos = mask.nonzero(as_tuple=True)  # the real response positions of this micro-batch: [n] rows, [n] columns
        terms = {t.name: t for t in self.terms}
        nca = terms.get("nca")
        ones = torch.ones(pos[0].shape[0], device=mask.device)
        w_all = ones / den[0]  # a term over every response token: its share of the global token mean
        w_keep = w_all if keep is None else keep[pos].float() / den[1]
        pick = lambda t: w_keep if (t.selectable and keep is not None) else w_all  # noqa: E731
        beta = nca.weight_at(step) if nca is not None else 0.0
        hc = leaves["student_ctx"][pos] if nca is not None else None
        vocab = self.opts.vocab
        heads = head_split(self.student), head_split(self.teacher)
        if heads[0] is None or heads[1] is None:  # `fused_blocker` refuses such a model before any step
            raise ModelError("the fused loss head needs an LM head on both models (loss_head: logits)")
        w, wt = heads[0].weight[:vocab], heads[1].weight[:vocab]

        def head(wo: Tensor, hc_: Tensor | None, beta_: float):
            return fused_head_loss(
                leaves["student_nctx"][pos],
                w,
                th[pos],
                wt,
                wo,
                temperature=self.opts.temperature,
                hc=hc_,
                beta=beta_,
                chunk=self.opts.logit_chunk or DEFAULT_CHUNK,
                options=self.options,
                tokens=tokens[pos],
                anchor_weights=pick(nca) if nca is not None else None,
                stats_weights=w_all,
            )

        opd = terms.get("opd")  # None: the anchor alone (``anchor_only``), every position's OPD weight 0
        wo = pick(opd) if opd is not None else torch.zeros_like(w_all)
        if acc.per_term and nca is not None and opd is not None:  # one call per term: their gradients stay apart
            a, b = head(wo, None, 0.0), head(torch.zeros_like(wo), hc, beta)
            loss, weighted, nca_value = a.loss + b.loss, {"opd": a.loss, "nca": b.loss}, b.nca
        else:
            a = head(wo, hc, beta)
            loss, nca_value = a.loss, a.nca
            weighted = {"opd": a.loss if nca is None else a.opd, "nca": a.loss if opd is None else beta * a.nca}
        logs = {"loss/opd": a.opd} if opd is not None else {}
        stat = {"topk": "opd/topk_mass", "sampled": "opd/kl_estimate"}.get(self.options.estimator)
        if stat:
            logs[stat] = a.stat
        if nca is not None:
            logs["loss/nca"] = nca_value
        weights = {name: t.weight_at(step) for name, t in terms.items()}
        acc.chunk(LossResult(loss, logs, {k: weighted[k] for k in terms}, weights), leaves, a.kl)
