"""The built-in loss terms' and selectors' options, declared once (`mechopd.core.options.option`), with the config (it
imports only `mechopd.core.options`): `mechopd.config` composes `TrainConfig` from these sections and
`objectives.losses`, `objectives.follow` and `objectives.select`, a layer above, register them with their terms and
selectors (config imports nothing above itself)."""

from __future__ import annotations

from dataclasses import dataclass

from mechopd.core.options import GE0, GE1, GT0, UNIT, Range, option

ESTIMATORS = ("topk", "full", "sampled", "forward_full")  # L_OPD's forms (`objectives.losses`)
C_MODES, D_MODES = ("exact", "lower_bound"), ("union", "floored")  # TA-OPD signals (`objectives.signals`)
TIE_BREAKS = ("position", "sequence")  # `objectives.select`


@dataclass
class NCAOptions:
    """The anchor terms' options (NCA, SymKL): L = L_OPD + β·m(s)·KL(sg[q_x] ‖ q_c) (docs/method.md §2)."""

    beta: float = option(0.5, range=GE0, short=True, help="β, the NCA / SymKL anchor weight")
    nca_start: int = option(0, range=GE0, help="steps with β = 0 before the anchor starts")
    beta_warmup: int = option(
        0, range=GE0, help="steps of a linear ramp 0 → β after nca_start (both 0: the papers' constant β)"
    )
    nca_gate: float | None = option(
        None,
        range=GT0,
        help="null = no gate; a level in nats: the anchor starts no "
        "earlier than the step after the mean KL(q_x ‖ f) of the last nca_gate_window "
        "steps falls to it (`objectives.schedule.AnchorGate`)",
    )
    nca_gate_window: int = option(
        5, range=GE1, help="steps averaged by the KL gate; the accuracy gate checks every nca_gate_window steps"
    )
    nca_gate_acc: float | None = option(
        None,
        range=Range(0, 1, open_lo=True),
        help="null = no accuracy gate; a share r: the anchor starts no earlier than the step after the no-context "
        "view's greedy accuracy on nca_gate_n training items reaches r x the teacher's with the context on them "
        "(`objectives.schedule.AccuracyGate`; exclusive with nca_gate)",
    )
    nca_gate_n: int = option(16, range=GE1, help="training items the accuracy gate decodes, greedy")
    nca_positions: str = option(
        "all",
        choices=("all", "selected"),
        help="all: the NCA term covers every response token; selected: only the selector's kept tokens",
    )


@dataclass
class FollowOptions:
    """The follow term's options: L += follow_weight · KL(q_θ(·|x,c′) ‖ f(·|x,c′)) (`objectives.follow`)."""

    follow_weight: float = option(
        0.0,
        range=GE0,
        help="0 = off; > 0 adds the follow term (on-policy "
        "self-distillation under the task's OTHER contexts) to any method",
    )
    follow_contexts: list[str] | None = option(
        None, help="labels of Task.other_contexts the follow term draws from; null = all of them"
    )


@dataclass
class EstimatorOptions:
    """L_OPD's form (and the dual / follow terms', which share it)."""

    estimator: str = option(
        "topk",
        choices=ESTIMATORS,
        help="topk: sum over the student's top-k ids; full: the whole vocabulary; sampled: per-token advantage on y_t; "
        "forward_full: KL(f ‖ q_x) on the student's rollouts (GKD's on-policy forward KL, an ablation, not the papers' OPD)",
    )
    topk: int = option(256, range=GE1, help="k of the student-top-k reverse KL")
    renormalize: bool = option(False, help="renormalise the top-k distributions (exclusive with tail)")
    tail: bool = option(False, help="add the tail bucket (mass outside the top k) to the top-k KL")


@dataclass
class SelectionOptions:
    """Which tokens the selectable terms train on (docs/method.md §3)."""

    selector: str = option("full", short=True, registry="selector", help="token selector: a registered name")
    budget: float = option(0.10, range=Range(0, 1, open_lo=True), short=True, help="TA-OPD token budget ρ")
    tie_break: str = option("position", choices=TIE_BREAKS, help="order among equal scores")
    min_one_per_response: bool = option(
        False,
        help="false: exactly the top ⌈ρN⌉ (the paper's text); true: the "
        "released code's ≥ 1 token per response, added on top",
    )


@dataclass
class SignalOptions:
    """The teachability signals' options, read by every signal selector (entropy ... ta_opd_ent)."""

    k: int = option(16, range=GE1, help="TA-OPD top-K of the signals")
    c_mode: str = option("exact", choices=C_MODES, help="compatibility signal form")
    d_mode: str = option("union", choices=D_MODES, help="divergence signal support")
    q_low: float = option(0.05, range=UNIT, help="lower normalisation quantile (< q_high)")
    q_high: float = option(0.95, range=UNIT, help="upper normalisation quantile")
