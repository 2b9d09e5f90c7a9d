"""Loss terms for on-policy distillation of privileged context: OPD, NCA and the ablations (docs/method.md §1–2).

What is non-standard here:

* Inputs are log-probabilities, computed ONCE per logits tensor and reused by every term and by the selector:
  ``logp = torch.log_softmax(logits.float() / temperature, -1)`` with shape ``[batch, seq, vocab]``, already
  restricted to the response positions. The three views (student without context ``q_x``, student with context
  ``q_c``, teacher ``f``) are aligned column for column: position ``t`` is the same response token ``y_t`` in all.
* A teacher whose vocabulary differs from the student's only by padding rows is compared on the common ids: call
  :func:`common_vocab` on the LOGITS, before ``log_softmax``, so every distribution is normalised over the same ids.
* Every per-position function returns ``[batch, seq]``; :func:`token_mean` reduces over the real response tokens
  of the whole batch. Gradients are analytic through the student's distribution (no REINFORCE term) except for the
  sampled-token estimator, which is a per-token policy gradient by design.
* A method is a list of :class:`LossTerm` (``method_terms``): OPD and NCA differ by one term, nothing else. Terms
  are registered by name (``@register_term``, ``TERMS``) and ``METHODS`` maps a method to its term names; the config,
  the CLI, the gradients probe and the trainer read these two tables.
* A term registers its options dataclass (``register_term(..., options=NCAOptions, weight="beta")``): its fields
  are config keys and CLI flags (`mechopd.core.options`), declared once there with their defaults; `config_terms` builds
  a config's terms from them. Values are validated once, by ``mechopd.config.TrainConfig``; the functions here
  assume valid options (``k >= 1``; ``renormalize`` and ``tail`` exclusive).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor

from mechopd.config import METHOD_ALIASES
from mechopd.config.terms import EstimatorOptions as TermOptions
from mechopd.config.terms import NCAOptions
from mechopd.core.options import register_options, register_registry
from mechopd.objectives.divergences import (
    _check_mask,
    dual_opd_ctx,
    forward_kl_full,
    nca_anchor,
    reverse_kl_full,
    reverse_kl_topk,
    sampled_token_kl_on_tokens,
    sym_kl,
)

VIEWS = frozenset({"student_nctx", "student_ctx", "teacher", "tokens", "student_nctx_token", "teacher_token"})
FULL_VIEWS = ("student_nctx", "student_ctx", "teacher")  # the [batch, seq, vocab] ones


# ---------------------------------------------------------------------------------------------------------------------
# A method is a set of loss terms; the terms are registered by name
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossInputs:
    """What the trainer scored for one batch; a term reads only the fields in its ``needs``.

    student_nctx, student_ctx, teacher: ``[batch, seq, vocab]`` log-probabilities (common vocab, same temperature);
    tokens: ``[batch, seq]`` long, the sampled response ids; student_nctx_token, teacher_token: ``[batch, seq]``
    ``log q_x(y_t)`` and ``log f(y_t)`` (a term that needs only these never makes the scorer build the full ones;
    `with_tokens` fills them from the full tensors when a caller has those).
    """

    student_nctx: Tensor | None = None
    student_ctx: Tensor | None = None
    teacher: Tensor | None = None
    tokens: Tensor | None = None
    student_nctx_token: Tensor | None = None
    teacher_token: Tensor | None = None

    def with_tokens(self) -> LossInputs:
        """The token views gathered from the full ones at ``tokens`` (for callers that scored full tensors)."""
        if self.tokens is None:
            return self
        idx = self.tokens.long().unsqueeze(-1)
        pick = lambda t: None if t is None else t.gather(-1, idx).squeeze(-1)  # noqa: E731
        return dataclasses.replace(
            self,
            student_nctx_token=self.student_nctx_token
            if self.student_nctx_token is not None
            else pick(self.student_nctx),
            teacher_token=self.teacher_token if self.teacher_token is not None else pick(self.teacher),
        )

    def get(self, name: str) -> Tensor:
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"LossInputs.{name} is None but a loss term needs it")
        return value


@dataclass(frozen=True)
class TermOutput:
    """per_pos: ``[batch, seq]`` loss per position (carries grad); stats: detached ``[batch, seq]`` diagnostics."""

    per_pos: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class LossTerm:
    """One weighted term of a method's loss.

    name: log key ("opd", "nca", "dual", "sym"); weight: its coefficient in the total; fn: ``LossInputs -> TermOutput``;
    needs: which ``LossInputs`` fields it reads ({"student_nctx", "student_ctx", "teacher", "tokens"});
    selectable: True when a token selector's keep-mask applies to it (the OPD term; the NCA term with
    ``nca_positions="selected"``); schedule: optional multiplier of ``weight`` per step (the anchor schedule);
    batch: the rollout batch its inputs come from ("main": y ~ q_x, the two views; "other": y ~ q_{c′} sampled under
    another context of the task, both views carrying c′, `objectives.follow`).
    """

    name: str
    weight: float
    fn: Callable[[LossInputs], TermOutput]
    needs: frozenset[str]
    selectable: bool = False
    schedule: Callable[[int], float] | None = None
    batch: str = "main"

    def weight_at(self, step: int) -> float:
        return self.weight * (self.schedule(step) if self.schedule is not None else 1.0)


@dataclass(frozen=True)
class TermSpec:
    """A registered term: ``build(estimator_options[, own_options]) -> (fn, needs)``; ``anchor``: weighted by β's
    schedule; ``batch``: "main" or "other" (`LossTerm.batch`); ``options``: its options dataclass (config keys and
    flags; a built-in's is a `TrainConfig` section); ``weight``: the options field that is its weight (else 1);
    ``added``: the term joins ANY method when that weight is > 0 (as follow); ``selectable``: a bool or a function of
    the options; ``label``: how a run with this term is labelled (`mechopd.objectives.labels`; None: it adds
    nothing to the label)."""

    name: str
    build: Callable[..., tuple[Callable[[LossInputs], TermOutput], frozenset[str]]]
    anchor: bool = False
    selectable: bool | Callable[[Any], bool] = False
    batch: str = "main"
    options: type | None = None
    weight: str | None = None
    added: bool = False
    label: Callable[[Any], str] | None = None


TERMS: dict[str, TermSpec] = {}


def register_term(
    name: str,
    anchor: bool = False,
    selectable: bool | Callable[[Any], bool] = False,
    batch: str = "main",
    *,
    options: type | None = None,
    weight: str | None = None,
    added: bool = False,
    label: Callable[[Any], str] | None = None,
):
    """Register a term builder under ``name`` (one file + this decorator, and a ``METHODS`` entry or ``added=True``,
    adds a term); ``options`` (a dataclass of `mechopd.core.options.option` fields) become config keys and CLI flags;
    ``label(run)``: the term's words in a run's label, read from the run's typed options (`objectives.labels`)."""
    if added and not weight:
        raise ValueError(f"loss term {name!r}: added=True needs weight= (the config field that switches it on)")

    def deco(build):
        if options is not None:  # a TrainConfig section's keys are its fields already (`options.plugin_facts`)
            register_options(options, f"loss term {name!r}")
        TERMS[name] = TermSpec(name, build, anchor, selectable, batch, options, weight, added, label)
        return build

    return deco


@register_term("opd", selectable=True)
def _opd_term(o: TermOptions):
    """L_OPD = KL(q_x ‖ f) in the chosen estimator's form; ``forward_full``: the ablation KL(f ‖ q_x) instead."""
    if o.estimator == "topk":

        def fn(x: LossInputs) -> TermOutput:
            kl, mass = reverse_kl_topk(x.get("student_nctx"), x.get("teacher"), o.topk, o.renormalize, o.tail)
            return TermOutput(kl, {"topk_mass": mass})

        return fn, frozenset({"student_nctx", "teacher"})
    if o.estimator == "full":
        return (lambda x: TermOutput(reverse_kl_full(x.get("student_nctx"), x.get("teacher")))), frozenset(
            {"student_nctx", "teacher"}
        )
    if o.estimator == "forward_full":
        return (lambda x: TermOutput(forward_kl_full(x.get("student_nctx"), x.get("teacher")))), frozenset(
            {"student_nctx", "teacher"}
        )

    def sampled(x: LossInputs) -> TermOutput:
        loss, log_ratio = sampled_token_kl_on_tokens(x.get("student_nctx_token"), x.get("teacher_token"))
        return TermOutput(loss, {"kl_estimate": log_ratio})

    return sampled, frozenset({"student_nctx_token", "teacher_token"})


def _nca_label(run: Any) -> str:
    """``NCA (β=0.5, from step 30)``: β and when the anchor starts (the KL gate's level, a step, or constant);
    ``anchor only (…)`` for a method whose terms hold no OPD (``anchor_only``, the deafness control)."""
    nca = run.section(NCAOptions)
    start, gate, acc = nca.nca_start, nca.nca_gate, nca.nca_gate_acc
    when = f"KL gate {gate:g}" if gate is not None else f"from step {start}" if start else "constant"
    when = f"accuracy gate {acc:g}" if acc is not None else when
    name = "NCA" if "opd" in METHODS.get(run.method, ("opd",)) else "anchor only"
    return f"{name} (β={nca.beta:g}, {when})"


@register_term(
    "nca",
    anchor=True,
    options=NCAOptions,
    weight="beta",
    selectable=lambda own: own.nca_positions == "selected",
    label=_nca_label,
)
def _nca_term(o: TermOptions, own: NCAOptions | None = None):
    """KL(sg[q_x] ‖ q_c)."""
    return (lambda x: TermOutput(nca_anchor(x.get("student_nctx"), x.get("student_ctx")))), frozenset(
        {"student_nctx", "student_ctx"}
    )


@register_term("dual")
def _dual_term(o: TermOptions):
    """KL(q_c ‖ f) with the OPD term's support; "sampled" uses the full sum (y was drawn from q_x, not q_c);
    "forward_full" the OPD term's direction, KL(f ‖ q_c)."""
    if o.estimator == "topk":

        def fn(x: LossInputs) -> TermOutput:
            kl, mass = reverse_kl_topk(x.get("student_ctx"), x.get("teacher"), o.topk, o.renormalize, o.tail)
            return TermOutput(kl, {"topk_mass": mass})

        return fn, frozenset({"student_ctx", "teacher"})
    if o.estimator == "forward_full":
        return (lambda x: TermOutput(forward_kl_full(x.get("student_ctx"), x.get("teacher")))), frozenset(
            {"student_ctx", "teacher"}
        )
    return (lambda x: TermOutput(dual_opd_ctx(x.get("student_ctx"), x.get("teacher")))), frozenset(
        {"student_ctx", "teacher"}
    )


@register_term("sym", anchor=True, options=NCAOptions, weight="beta")
def _sym_term(o: TermOptions, own: NCAOptions | None = None):
    """½[KL(q_x ‖ q_c) + KL(q_c ‖ q_x)]."""
    return (lambda x: TermOutput(sym_kl(x.get("student_nctx"), x.get("student_ctx")))), frozenset(
        {"student_nctx", "student_ctx"}
    )


METHODS: dict[str, tuple[str, ...]] = {
    "opd": ("opd",),
    "nca": ("opd", "nca"),
    "dual_opd": ("opd", "dual"),
    "sym_kl": ("opd", "sym"),
    "anchor_only": ("nca",),  # the deafness control: NCA's anchor alone, no OPD (docs/method.md §2)
}


def method_registry() -> dict[str, tuple[str, ...]]:
    """The ``method`` registry (`mechopd.core.options.registry`): every loss-term set, then the config's shorthands
    (`mechopd.config.METHOD_ALIASES`, each with its method's terms): the names ``method`` accepts."""
    return {**METHODS, **{alias: METHODS[m] for alias, (m, _) in METHOD_ALIASES.items() if m in METHODS}}


def _follow_note(value: str) -> str:
    if "follow" not in str(value):
        return ""
    return (
        " — the follow term is not a method: add it to any method with follow_weight (--set "
        "follow_weight=1, e.g. --method nca --set follow_weight=1)"
    )


register_registry("method", method_registry, _follow_note)


def make_term(
    name: str,
    options: TermOptions | None = None,
    weight: float = 1.0,
    schedule: Callable[[int], float] | None = None,
    selectable: bool | None = None,
    own: Any = None,
) -> LossTerm:
    """The registered term ``name`` as a ``LossTerm`` (``selectable`` None = the registration's rule, read on ``own``,
    the term's own options; None = their defaults; ``options`` None = the estimator's defaults)."""
    options = TermOptions() if options is None else options
    if name not in TERMS:
        raise ValueError(f"loss term {name!r} is not registered (registered: {', '.join(TERMS)})")
    spec = TERMS[name]
    if spec.options is not None and own is None:
        own = spec.options()
    fn, needs = spec.build(options, own) if spec.options is not None else spec.build(options)
    if selectable is None:
        selectable = spec.selectable(own) if callable(spec.selectable) else spec.selectable
    return LossTerm(name, float(weight), fn, needs, selectable, schedule, spec.batch)


def config_terms(cfg: Any, schedule: Callable[[int], float] | None = None) -> list[LossTerm]:
    """A config's loss terms (docs/method.md §1–2): its method's, then every ``added`` term whose weight is > 0;
    each with its options read from the config (``cfg.section(options)``); anchor terms carry ``schedule``.

    opd:      L_OPD
    nca:      L_OPD + β · KL(sg[q_x] ‖ q_c)
    dual_opd: L_OPD + KL(q_c ‖ f)
    sym_kl:   L_OPD + β · ½[KL(q_x ‖ q_c) + KL(q_c ‖ q_x)]
    anchor_only: β · KL(sg[q_x] ‖ q_c)   (the control: what the anchor alone does to the context view)
    (+ follow_weight · L_follow, `objectives.follow`)
    """
    if cfg.method not in METHODS:
        raise ValueError(f"method {cfg.method!r} has no terms (methods: {', '.join(METHODS)})")
    est = cfg.section(TermOptions)
    names = list(METHODS[cfg.method])
    names += [n for n, s in TERMS.items() if s.added and n not in names and s.weight and getattr(cfg, s.weight) > 0]
    terms = []
    for name in names:
        spec = TERMS[name]
        own = cfg.section(spec.options) if spec.options is not None else None
        weight = getattr(own, spec.weight) if spec.weight else 1.0
        terms.append(make_term(name, est, weight, schedule if spec.anchor else None, own=own))
    return terms


def method_terms(
    method: str,
    beta: float = NCAOptions.beta,
    estimator: str = TermOptions.estimator,
    topk: int = TermOptions.topk,
    renormalize: bool = TermOptions.renormalize,
    tail: bool = TermOptions.tail,
    *,
    nca_positions: str = NCAOptions.nca_positions,
    schedule: Callable[[int], float] | None = None,
) -> list[LossTerm]:
    """The loss terms of ``method`` from keyword options (tests, notebooks): `config_terms` on a view of them
    (added terms off). estimator picks L_OPD's form: "topk" (the student's top-``topk`` ids, optionally renormalised
    or with a tail bucket), "full", "sampled" or the forward-KL ablation "forward_full"."""
    values = dict(method=method, beta=beta, estimator=estimator, topk=topk, renormalize=renormalize, tail=tail)
    return config_terms(_Values({**values, "nca_positions": nca_positions}), schedule)


class _Values:
    """A mapping read as a config (`config_terms`): given values, else each options class's defaults."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def __getattr__(self, name: str) -> Any:
        if name in self.__dict__.get("values", {}):
            return self.values[name]
        if any(s.added and s.weight == name for s in TERMS.values()):
            return 0.0  # added terms are off unless their weight is given
        raise AttributeError(name)

    def section(self, cls: type) -> Any:
        return cls(**{f.name: self.values[f.name] for f in dataclasses.fields(cls) if f.name in self.values})


def terms_need(terms: list[LossTerm]) -> frozenset[str]:
    """Union of what the terms read: tells the trainer which forward passes to run."""
    return frozenset().union(*(t.needs for t in terms))


class LossResult(NamedTuple):
    """loss: the scalar to differentiate; logs: detached scalars; weighted: ``{name: w · term value}`` (with grad);
    weights: ``{name: w}``, each term's effective weight at the step (β·schedule for an anchor: its ``beta_eff``)."""

    loss: Tensor
    logs: dict[str, Tensor]
    weighted: dict[str, Tensor]
    weights: dict[str, float]


def _local_count(mask: Tensor) -> Tensor:
    return mask.sum()


def total_loss(
    terms: list[LossTerm],
    inputs: LossInputs,
    mask: Tensor,
    keep: Tensor | None = None,
    *,
    step: int = 0,
    count: Callable[[Tensor], Tensor] = _local_count,
    denominators: tuple[Tensor, Tensor | None] | None = None,
) -> LossResult:
    """Σ_term w_term(step) · Σ_{b,t} per_pos · mask_term / count(mask_term); returns ``LossResult``.

    mask: ``[batch, seq]`` bool, the real response tokens. keep: optional ``[batch, seq]`` bool selector mask; it
    applies only to ``selectable`` terms, whose mean is then over the kept tokens (a hard 0/1 loss mask).
    count: the denominator of a mask; the default counts this batch's tokens (a token mean); a multi-process trainer
    passes the count over ALL processes, so every value here is this process's share and the shares SUM to the
    global mean (the caller sums logs over processes). A zero count raises ``ValueError``.
    Logged: ``loss/<name>`` (the term's mean, unweighted) and ``<name>/<stat>`` (stat's mean over ``mask``).
    ``step`` (0-based) sets each term's weight through its schedule (``LossResult.weights``).
    denominators: ``(count of mask, count of mask & keep)`` fixed in advance, instead of ``count``: a micro-batch or a
    chunk of positions is then scored as its share of the WHOLE batch's means (`train.step`: the shares of every
    chunk, micro-batch and process sum to the one-shot value).
    """
    if not terms:
        raise ValueError("total_loss needs at least one term")
    logs: dict[str, Tensor] = {}
    weighted: dict[str, Tensor] = {}
    weights: dict[str, float] = {}
    for term in terms:
        with torch.profiler.record_function(f"mechopd.term.{term.name}"):  # bench/memory.py's profile reads it
            out = term.fn(inputs)
        selected = term.selectable and keep is not None
        term_mask = mask & keep if keep is not None and selected else mask
        den = None if denominators is None else denominators[1 if selected else 0]
        value = _masked_share(out.per_pos, term_mask, count, den)
        w = weights[term.name] = term.weight_at(step)
        weighted[term.name] = w * value
        logs[f"loss/{term.name}"] = value.detach()
        for key, stat in out.stats.items():
            logs[f"{term.name}/{key}"] = _masked_share(
                stat.detach(), mask, count, None if denominators is None else denominators[0]
            )
    loss = cast(Tensor, sum(weighted.values()))  # a method has at least one term: a tensor, never the int 0
    return LossResult(loss, logs, weighted, weights)


def _masked_share(
    per_pos: Tensor, mask: Tensor, count: Callable[[Tensor], Tensor], den: Tensor | None = None
) -> Tensor:
    """``Σ per_pos·mask / count(mask)`` (or ``/ den``; padded positions may hold inf/nan: selected out, never
    multiplied)."""
    _check_mask(mask, per_pos.shape)
    den = count(mask) if den is None else den
    if float(den) == 0:
        raise ValueError("total_loss: the mask selects no response token (all responses empty or fully masked)")
    return torch.where(mask, per_pos, torch.zeros_like(per_pos)).sum() / den
