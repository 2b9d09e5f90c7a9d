"""Token selection for the OPD term: TA-OPD and its baselines (docs/method.md §3).

A selector turns the per-position signals of one rollout batch into a hard 0/1 keep-mask ``[batch, seq]`` for the OPD
term (unselected tokens stay in the context; only their loss is dropped). What is non-standard here:

* Signals per position t (student = no-context student ``p_s``, teacher = ``p_t``; both ``[batch, seq, vocab]``
  log-probabilities at the rollout temperature):
  ``S_t = TopK(p_s, K)``, ``U_t = S_t ∪ TopK(p_t, K)``, compatibility ``C``, union divergence ``D``, top-K student
  entropy ``H`` (see :func:`teachability_stats` for the exact variants).
* Normalisation is over the valid positions of the WHOLE rollout batch: ``Norm(z) = clip((z − Q05)/(Q95 − Q05), 0, 1)``.
* The budget is ONE global top ``⌈ρ·N⌉`` over the batch (N = valid positions), not per sequence; ties are broken
  deterministically (default: earlier position in the response first, then earlier sequence). By default exactly
  ``⌈ρ·N⌉`` positions are kept (the paper's text); ``min_one_per_response=True`` is the released code's rule: every
  response with a valid position keeps at least one, added ON TOP of the budget (so more than ρ may be kept).
* Everything is vectorised: union sets are built by concatenating the two top-K id lists and de-duplicating after a
  sort (``[.., 2K]``, never a ``[.., vocab]`` mask); no Python loop over positions.
* A selector is one scoring function and one ``@register_selector("name")``: the config, ``--selector``, the trainer
  and the demo's sweep read the registry (`SELECTORS`); nothing branches on a selector's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from mechopd.config.terms import TIE_BREAKS, SelectionOptions, SignalOptions
from mechopd.core.errors import ConfigError
from mechopd.core.options import register_options, register_registry
from mechopd.objectives.normalize import NormalizedStats, normalize_stats, soft_or
from mechopd.objectives.signals import (
    C_MODES,
    D_MODES,
    OPTIONAL_SIGNALS,
    TeachabilityStats,
    _check_choice,
    _check_mask,
    _fp32,
    teachability_stats,
)

# ---------------------------------------------------------------------------------------------------------------------
# The selector registry: a selector is one scoring function plus one `register_selector`
# ---------------------------------------------------------------------------------------------------------------------
Score = Callable[..., "Tensor | None"]


@dataclass(frozen=True)
class SelectorSpec:
    """A registered selector: ``score(normed, mask, generator) -> [batch, seq] | None`` (None keeps every valid
    position: "full"); ``needs_stats``: whether it reads the teacher/student signals (else ``normed`` is None);
    ``options``: its options dataclass (config keys and flags; the signal selectors': `SignalOptions`, a
    `TrainConfig` section). A plug-in's options (not a section) reach its score as ``options=``."""

    name: str
    score: Score
    needs_stats: bool = True
    options: type | None = None
    label: Callable[[Any], str] | None = None  # a run's label with this selector (`objectives.labels`)


_SELECTORS: dict[str, SelectorSpec] = {}
SELECTORS: tuple[str, ...] = ()  # the registered names, in registration order (kept current by register_selector)
register_registry("selector", lambda: _SELECTORS)  # TrainConfig.selector's choices: the live names


def register_selector(
    name: str,
    *,
    needs_stats: bool = True,
    replace: bool = False,
    options: type | None = None,
    label: Callable[[Any], str] | None = None,
) -> Callable[[Score], Score]:
    """Decorator: register ``score(normed, mask, generator)`` as the selector ``name`` (`TrainConfig.selector`,
    ``--selector``, `make_selector`). A taken name raises unless ``replace``. ``options``: a dataclass of
    `mechopd.core.options.option` fields: config keys and CLI flags; a plug-in's reach ``score(..., options=)``.
    ``label(run)``: a run's label with this selector, read from its typed options (`objectives.labels`)."""

    def deco(fn: Score) -> Score:
        global SELECTORS
        if name in _SELECTORS and not replace:
            raise ConfigError(f"selector {name!r} is already registered; pick another name or pass replace=True")
        if options is not None:  # a TrainConfig section's keys are its fields already (`options.plugin_facts`)
            register_options(options, f"selector {name!r}")
        _SELECTORS[name] = SelectorSpec(name, fn, needs_stats, options, label)
        SELECTORS = tuple(_SELECTORS)
        return fn

    return deco


def unregister_selector(name: str) -> None:
    global SELECTORS
    _SELECTORS.pop(name, None)
    SELECTORS = tuple(_SELECTORS)


def selector_specs() -> dict[str, SelectorSpec]:
    """Every registered selector by name (a copy)."""
    return dict(_SELECTORS)


def selector_spec(name: str) -> SelectorSpec:
    if name not in _SELECTORS:
        raise ConfigError(f"selector={name!r} is unknown: use one of {', '.join(_SELECTORS)}")
    return _SELECTORS[name]


def budget_label(title: str) -> Callable[[Any], str]:
    """A budgeted selector's label: ``TITLE (ρ=0.10, K=2, kept 0.12)``: the budget ρ, the signals' K where the run
    sets it, and the kept fraction MEASURED over its steps ("n/a" when not measured)."""

    def label(run: Any) -> str:
        kept = "n/a" if run.kept is None else f"{run.kept:.2f}"
        k = f", K={run.section(SignalOptions).k}" if run.given("k") else ""
        return f"{title} (ρ={run.section(SelectionOptions).budget:.2f}{k}, kept {kept})"

    return label


@register_selector("full", needs_stats=False)
def _full(normed: NormalizedStats | None, mask: Tensor, generator: torch.Generator | None) -> None:
    """Every valid position (plain OPD)."""
    return None


@register_selector("random", needs_stats=False, label=budget_label("random"))
def _random(normed: NormalizedStats | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """Uniform random scores (the random baseline; seeded from the run seed)."""
    if generator is None:
        raise ValueError("the random selector needs a torch.Generator (seed it from the run seed)")
    return torch.rand(mask.shape, generator=generator, device=generator.device).to(mask.device)


def _signal(name: str, fn: Callable[[NormalizedStats], Tensor]) -> None:
    register_selector(name, options=SignalOptions, label=budget_label("TA-OPD" if name == "ta_opd" else name))(
        lambda normed, mask, generator: fn(normed)
    )


# entropy: H̃;  divergence: D̃;  tip: H̃ + D̃ − H̃·D̃;  compat: C̃;  ta_opd: s = D̃·C̃;  ta_opd_ent: soft-OR(H̃, s).
# (The released code's "ca_softor" re-normalises the raw product D·C before the soft OR; here s = D̃·C̃ as written.)
_signal("entropy", lambda n: n.H)
_signal("divergence", lambda n: n.D)
_signal("tip", lambda n: soft_or(n.H, n.D))
_signal("compat", lambda n: n.C)
_signal("ta_opd", lambda n: n.DL)
_signal("ta_opd_ent", lambda n: soft_or(n.H, n.DL))


def selector_score(name: str, normed: NormalizedStats) -> Tensor:
    """The ranking score ``[batch, seq]`` of a score-based selector (one that reads the signals)."""
    spec = selector_spec(name)
    if not spec.needs_stats:
        raise ConfigError(
            f"selector={name!r} has no signal score: use one of "
            f"{', '.join(n for n, s in _SELECTORS.items() if s.needs_stats)}"
        )
    score = spec.score(normed, torch.ones(normed.H.shape, dtype=torch.bool), None)
    if score is None:  # a signal selector that keeps everything: no ranking to return
        raise ConfigError(f"selector={name!r} returned no score (it keeps every position)")
    return score


# ---------------------------------------------------------------------------------------------------------------------
# Gathering the signals across processes (by field name, so a new signal travels too)
# ---------------------------------------------------------------------------------------------------------------------
def pack_stats(mask: Tensor, stats: TeachabilityStats | None) -> Tensor:
    """``[batch, seq, 1 + n_fields]``: the mask, then every `TeachabilityStats` field that is set, by name, in field
    order (an optional field left None, e.g. ``kl_full`` in training, is not sent)."""
    present = (
        [] if stats is None else [v for f in fields(TeachabilityStats) if (v := getattr(stats, f.name)) is not None]
    )
    return torch.stack([mask.float(), *present], -1)


def unpack_stats(packed: Tensor) -> tuple[Tensor, TeachabilityStats | None]:
    """The inverse of `pack_stats` (on rows gathered from every process): (mask, stats or None). The column count
    says which optional fields were sent (they are the last fields: `OPTIONAL_SIGNALS`)."""
    names = [f.name for f in fields(TeachabilityStats)]
    n = packed.shape[-1] - 1
    if n == 0:
        return packed[..., 0] > 0.5, None
    if not len(names) - len(OPTIONAL_SIGNALS) <= n <= len(names):
        raise ValueError(
            f"unpack_stats: {n} signal columns, expected {len(names) - len(OPTIONAL_SIGNALS)}..{len(names)}"
        )
    stats = TeachabilityStats(**{name: packed[..., 1 + i] for i, name in enumerate(names[:n])})
    return packed[..., 0] > 0.5, stats


# ---------------------------------------------------------------------------------------------------------------------
# Budgeted selection
# ---------------------------------------------------------------------------------------------------------------------


def budget_size(rho: float, n_valid: int) -> int:
    """``⌈ρ·N⌉``, computed after rounding ρ·N to 9 decimals so that e.g. 0.1·30 gives 3, not 4."""
    _check_rho(rho)
    return min(n_valid, math.ceil(round(rho * n_valid, 9)))


def select_top_budget(
    score: Tensor,
    mask: Tensor,
    rho: float,
    tie_break: str = SelectionOptions.tie_break,
    min_one_per_response: bool = SelectionOptions.min_one_per_response,
) -> Tensor:
    """Keep one global top ``⌈ρ·N⌉`` of ``score`` over the batch's N valid positions; returns ``[batch, seq]`` bool.

    Ties: ``tie_break="position"`` ranks equal scores by (position in the response, then sequence index) — the
    paper's "ties to earlier positions"; ``"sequence"`` ranks by (sequence index, then position), the released code's
    row order. ``min_one_per_response``: a response with valid positions but none kept gets its highest-scoring valid
    position (earliest on ties) added ON TOP of the budget, so the kept count can exceed ``⌈ρ·N⌉`` by at most the
    number of responses. ρ must be in (0, 1] (``ConfigError``). score: ``[batch, seq]`` float, finite where valid.
    """
    _check_choice("tie_break", tie_break, TIE_BREAKS)
    _check_mask(mask, score.shape)
    budget = budget_size(rho, int(mask.sum()))
    if not torch.isfinite(score[mask]).all():
        raise ValueError("select_top_budget: non-finite scores at valid positions")
    ranked = _fp32(score).masked_fill(~mask, float("-inf"))  # [B, T]
    flat = ranked.t().reshape(-1) if tie_break == "position" else ranked.reshape(-1)  # tie order = flat order
    order = torch.sort(-flat, stable=True).indices[:budget]  # descending score, stable among ties
    keep_flat = torch.zeros_like(flat, dtype=torch.bool)
    keep_flat[order] = True
    batch, seq = mask.shape
    keep = keep_flat.view(seq, batch).t() if tie_break == "position" else keep_flat.view(batch, seq)
    keep = keep.clone()
    if min_one_per_response:
        starved = (mask.any(-1) & ~keep.any(-1)).nonzero().squeeze(-1)  # responses with nothing kept
        keep[starved, ranked[starved].argmax(-1)] = True  # argmax returns the first (earliest) maximum
    return keep


@dataclass(frozen=True)
class Selection:
    """A selector's result.

    keep: ``[batch, seq]`` bool keep-mask for the OPD term (a subset of the valid mask); n_valid: N; budget: ``⌈ρ·N⌉``
    (N for "full"); score: the ranking score ``[batch, seq]`` (None for "full"); stats / normed: the signals when the
    selector computed them (None for full / random).
    """

    keep: Tensor
    n_valid: int
    budget: int
    score: Tensor | None = None
    stats: TeachabilityStats | None = None
    normed: NormalizedStats | None = None

    @property
    def kept_fraction(self) -> float:
        """Kept positions / valid positions (for logging; 0 on an empty batch)."""
        return float(self.keep.sum()) / max(1, self.n_valid)


@dataclass(frozen=True)
class Selector:
    """A named token selector with its option sections (declared once, `config/terms.py`); call it on one
    rollout batch.

    name: one of SELECTORS; signals: `SignalOptions` (k, c_mode, d_mode, q_low, q_high: the teachability signals and
    their normalisation); selection: `SelectionOptions` (tie_break, min_one_per_response; its budget is the ``rho``
    of each call); options: a plug-in selector's options instance (handed to its score as ``options=``).
    """

    name: str
    signals: SignalOptions = field(default_factory=SignalOptions)
    selection: SelectionOptions = field(default_factory=SelectionOptions)
    options: Any = None

    def __post_init__(self) -> None:
        _check_choice("selector", self.name, SELECTORS)  # the registered names (register_selector)
        s = self.signals
        _check_choice("k", s.k, None)
        _check_choice("c_mode", s.c_mode, C_MODES)
        _check_choice("d_mode", s.d_mode, D_MODES)
        _check_choice("tie_break", self.selection.tie_break, TIE_BREAKS)
        if not 0.0 <= s.q_low < s.q_high <= 1.0:
            raise ConfigError(f"q_low={s.q_low}, q_high={s.q_high} are invalid: need 0 <= q_low < q_high <= 1")

    @property
    def needs_stats(self) -> bool:
        """Whether the registered selector reads the teacher/student signals (not "full", "random")."""
        return selector_spec(self.name).needs_stats

    def __call__(
        self,
        student_logp: Tensor | None,
        teacher_logp: Tensor | None,
        mask: Tensor,
        rho: float,
        generator: torch.Generator | None = None,
    ) -> Selection:
        """Select on one batch. student_logp, teacher_logp: ``[batch, seq, vocab]`` (ignored by full/random)."""
        stats = None
        if self.needs_stats:
            if student_logp is None or teacher_logp is None:
                raise ValueError(f"selector {self.name!r} needs the student and teacher log-probs")
            s = self.signals
            stats = teachability_stats(student_logp, teacher_logp, mask, s.k, s.c_mode, s.d_mode)
        return self.from_stats(stats, mask, rho, generator)

    def from_stats(
        self, stats: TeachabilityStats | None, mask: Tensor, rho: float, generator: torch.Generator | None = None
    ) -> Selection:
        """Select from precomputed signals (``stats`` may be None for full/random). mask: ``[batch, seq]`` bool."""
        n_valid = int(mask.sum())
        budget = budget_size(rho, n_valid)
        spec, normed = selector_spec(self.name), None
        if spec.needs_stats:
            if stats is None:
                raise ValueError(f"selector {self.name!r} needs TeachabilityStats")
            normed = normalize_stats(stats, mask, self.signals.q_low, self.signals.q_high)
        if spec.options not in (None, SignalOptions):  # a plug-in's own options
            own = self.options if self.options is not None else spec.options()
            score = spec.score(normed, mask, generator, options=own)
        else:
            score = spec.score(normed, mask, generator)
        if score is None:  # keeps every valid position
            return Selection(keep=mask.clone(), n_valid=n_valid, budget=n_valid)
        keep = select_top_budget(score, mask, rho, self.selection.tie_break, self.selection.min_one_per_response)
        return Selection(keep, n_valid, budget, score=score, stats=stats, normed=normed)


def make_selector(name: str, options: Any = None, **values: Any) -> Selector:
    """The selector ``name`` (one of SELECTORS); ``values``: fields of `SignalOptions` (k, c_mode, ...) and of
    `SelectionOptions` (tie_break, min_one_per_response), the rest at their declared defaults; ``options``: a plug-in
    selector's options instance. ConfigError for an unknown name or value."""
    signal_keys = {f.name for f in fields(SignalOptions)}
    selection_keys = {f.name for f in fields(SelectionOptions)} - {"selector", "budget"}
    unknown = sorted(set(values) - signal_keys - selection_keys)
    if unknown:
        raise TypeError(f"make_selector: unknown option(s) {', '.join(unknown)}")
    signals = SignalOptions(**{k: v for k, v in values.items() if k in signal_keys})
    selection = SelectionOptions(selector=name, **{k: v for k, v in values.items() if k in selection_keys})
    return Selector(name, signals, selection, options)


def config_selector(cfg: Any) -> Selector:
    """A config's selector: its name, the selection options and the options it registered (read from ``cfg``)."""
    spec = selector_spec(cfg.selector)
    own = cfg.section(spec.options) if spec.options is not None else None
    return Selector(cfg.selector, cfg.section(SignalOptions), cfg.section(SelectionOptions), own)


def select(
    name: str,
    student_logp: Tensor | None,
    teacher_logp: Tensor | None,
    mask: Tensor,
    rho: float,
    generator: torch.Generator | None = None,
    **options,
) -> Selection:
    """One-shot ``make_selector(name, **options)(student_logp, teacher_logp, mask, rho, generator)``."""
    return make_selector(name, **options)(student_logp, teacher_logp, mask, rho, generator)


# ---------------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------------


def _check_rho(rho: float) -> None:
    if not (isinstance(rho, (int, float)) and 0.0 < rho <= 1.0):
        raise ConfigError(f"rho={rho!r} is invalid: the token budget must be in (0, 1] (e.g. 0.1 keeps 10 %)")
