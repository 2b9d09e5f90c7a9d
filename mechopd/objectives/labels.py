"""A run's display label, told by its plug-ins: each loss term and selector describes itself from the run's typed
options sections (``register_term(..., label=)``, ``register_selector(..., label=)``; the LoRA adapter:
`mechopd.models.lora.adapter_label`). The runner (`mechopd.pipeline.stages.method_label`) and the report ask here;
neither reads a plug-in's keys itself, so a newly registered term or selector labels its own runs.

A label reads `RunSettings`: the run's training fields (a study's run entry, or the config a checkpoint records) with
``section(cls)``, the typed options dataclass built from them (its declared defaults for what the run leaves out),
``given(key)`` (whether the run sets a key) and the MEASURED kept fraction of a selector run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from mechopd.config import METHOD_ALIASES
from mechopd.config.sections import RolloutOptions, RunOptions
from mechopd.config.terms import EstimatorOptions, SelectionOptions
from mechopd.core.options import bind

T = TypeVar("T")
Label = Callable[["RunSettings"], str]  # a plug-in's label: the run's settings -> its text ("" = nothing to add)


@dataclass(frozen=True)
class RunSettings:
    """A run's training fields, read through the options dataclasses that declare them; ``kept``: the mean kept
    fraction measured over its steps (None: not measured)."""

    over: Mapping[str, Any]
    kept: float | None = None

    def section(self, cls: type[T]) -> T:
        """``cls`` (an options dataclass) from the run's fields it declares, its defaults for the rest, checked."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return bind(cls, {k: v for k, v in self.over.items() if k in names}, source="run settings")

    def given(self, key: str) -> bool:
        """Whether the run sets ``key`` (to something other than null)."""
        return self.over.get(key) is not None

    @property
    def method(self) -> str:
        """The method's loss-term set (a shorthand such as ``ta_opd`` resolved to its method)."""
        method = str(self.over.get("method", RunOptions.method))
        return METHOD_ALIASES[method][0] if method in METHOD_ALIASES else method

    @property
    def selector(self) -> str:
        """The token selector (a method shorthand names its own)."""
        method = self.over.get("method")
        if method in METHOD_ALIASES and "selector" not in self.over:
            return METHOD_ALIASES[method][1]
        return self.section(SelectionOptions).selector


def plugin_label(run: RunSettings) -> tuple[str | None, str]:
    """``(head, tail)``: head, the label of the method's first loss term that has one, else of its selector (None:
    neither describes itself); tail, the labels of the added terms the run switches on (weight > 0), in order."""
    from mechopd.objectives import follow  # noqa: F401  (registers the follow term)
    from mechopd.objectives.losses import METHODS, TERMS
    from mechopd.objectives.select import selector_specs

    own = METHODS.get(run.method, ())
    head = next((text for name in own if (text := _term_text(name, run))), None)
    if head is None:
        spec = selector_specs().get(run.selector)
        head = spec.label(run) if spec is not None and spec.label is not None else None
    added = [
        name
        for name, spec in TERMS.items()
        if spec.added and name not in own and spec.options and getattr(run.section(spec.options), str(spec.weight)) > 0
    ]
    return head, "".join(_term_text(name, run) for name in added)


def _term_text(name: str, run: RunSettings) -> str:
    from mechopd.objectives.losses import TERMS

    spec = TERMS.get(name)
    return spec.label(run) if spec is not None and spec.label is not None else ""


# Estimators that are not the papers' OPD divergence (reverse KL): a run trained with one says so in its label.
ABLATION_ESTIMATORS = {"forward_full": " (forward KL)"}


def estimator_label(run: RunSettings) -> str:
    """``" (forward KL)"`` for a run whose OPD term is GKD's forward KL (`divergences.forward_kl_full`), an ablation
    that must not read as the papers' OPD; ``""`` for every reverse-KL estimator (full, topk, sampled)."""
    return ABLATION_ESTIMATORS.get(run.section(EstimatorOptions).estimator, "")


def rollout_label(run: RunSettings) -> str:
    """``" (bf16 rollouts)"`` for a run whose rollouts were sampled from a bfloat16 copy of the float32 student
    (``rollout_dtype: bfloat16``, `train.rollcopy`): off-policy by the cast, so never labelled as on-policy OPD."""
    dtype = run.section(RolloutOptions).rollout_dtype
    return "" if dtype == RolloutOptions.rollout_dtype else " (bf16 rollouts)"
