"""Gradient alignment between two loss terms on the same batch (docs/method.md §2: "at an OPD-converged checkpoint the OPD
gradient and the NCA gradient are nearly orthogonal").

For two named terms a, b (token means over the response tokens of one `TwoViewBatch`, UNWEIGHTED: β is not applied),
with gradients g_a = ∇θ L_a, g_b = ∇θ L_b restricted to a parameter group P:

    dot        = Σ_{θ∈P} <g_a, g_b>
    norm_a     = sqrt(Σ_{θ∈P} ‖g_a‖²),   norm_b likewise
    cos        = dot / (norm_a · norm_b)          (NaN when a norm is 0)
    norm_ratio = norm_a / norm_b                  (NaN when norm_b is 0; multiply by w_a/w_b for weighted terms)

The null for "nearly orthogonal" (docs/method.md §8): the same term's gradient on two DISJOINT halves of the batch
(even and odd items), ``null_cos = cos(∇L_a[even], ∇L_a[odd])``. Two draws of one objective's gradient agree this
much; a cos(∇a, ∇b) well below it says the two objectives point apart, not that the gradients are noise. No
checkpoint is dropped for a small norm: a noisy gradient shows as a small null_cos instead.

Groups (``scope``): "global" (all selected parameters), "layer" (one decoder layer), "module" (one module type over
all layers: q_proj ... down_proj, the norms, embed_tokens, lm_head, the final norm ``norm``), "layer_module" (one
module of one layer; layer None for embeddings / final norm / lm_head). Aggregates sum squares and inner products over
parameters, never norms, so Σ norm_a² over the "module" rows equals the "global" norm_a².

Term names (each reuses losses.py; none is reimplemented here):
  opd   L_OPD = KL(q_x ‖ f) with the chosen estimator ("topk", "full", "sampled")
  nca   KL(sg[q_x] ‖ q_c)                 (gradient only through the context view)
  dual  KL(q_c ‖ f)                        (DualOPD's with-context distillation term)
  sym   ½[KL(q_x ‖ q_c) + KL(q_c ‖ q_x)]   (SymKL, no stop-gradient)

Non-standard things here:
  * One forward per view: the student on the no-context view (grad), on the context view only when a term needs it
    (grad), the teacher on the context view under ``torch.inference_mode`` (only when a term needs it).
  * Memory: term a's gradient is copied tensor by tensor into ONE preallocated flat buffer (the autograd tuple is
    released as it is copied); term b's gradient stays in autograd's tuple and is compared slice by slice with the
    buffer. At most two parameter-sized gradient copies exist at once. Sums are accumulated in float64.
  * Tied embeddings (the organisms, many small HF models): ``lm_head.weight`` IS ``embed_tokens.weight``; it is
    listed once, as ``embed_tokens``, and its gradient includes the output-head contribution. No ``lm_head`` row then.
  * Layer restriction (``layers=[i, ...]``): only those decoder layers' parameters are differentiated; embeddings,
    the final norm and lm_head join only with ``include_non_layer=True``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from mechopd.config.sections import RolloutOptions
from mechopd.config.terms import ESTIMATORS
from mechopd.config.terms import EstimatorOptions as TermOptions
from mechopd.core.artifacts import Summary, write_csv
from mechopd.core.errors import ConfigError
from mechopd.core.options import option
from mechopd.core.views import RenderSpec, TwoViewBatch
from mechopd.probes.grad_align import TERMS, GradRow, loss_term, select_parameters, split_half_cos, term_gradients
from mechopd.probes.items import ProbeItems, sample_responses
from mechopd.probes.options import MODEL_HELP, Role, int_list, normalise, pair
from mechopd.probes.registry import ProbeSpec, register_probe
from mechopd.probes.runner import ProbeContext
from mechopd.probes.setup import TEACHER, ProbeSetup

CSV_NAME = "gradients.csv"


@dataclass
class GradientSummary(Summary):
    """Gradient alignment: the "global" row of ``gradients.csv`` (cos, norm ratio, the terms' values)."""

    FILE: ClassVar[str] = "gradients.json"
    PROBE: ClassVar[str] = "gradients"
    FLOATS: ClassVar[tuple[str, ...]] = ("cos", "norm_ratio", "value_a", "value_b", "null_cos")

    term_a: str
    term_b: str
    model: str
    cos: float
    norm_ratio: float
    value_a: float
    value_b: float
    response_tokens: int
    settings: dict[str, Any] = field(default_factory=dict)
    null_cos: float = math.nan  # cos(∇a on the even items, ∇a on the odd items): the split-half null

    def lines(self) -> list[str]:
        a, b = self.term_a, self.term_b
        null = (
            ""
            if not math.isfinite(self.null_cos)
            else f"; split-half null cos(∇{a}[even], ∇{a}[odd]) = {self.null_cos:.3f}"
        )
        return [
            f"- **Gradient alignment** cos(∇{a}, ∇{b}) at the {self.model} checkpoint: {self.cos:.3f} "
            f"(gradient norm ratio ‖∇{a}‖/‖∇{b}‖ = {self.norm_ratio:.3g}{null}; "
            f"{self.response_tokens} response tokens)."
        ]


# ---------------------------------------------------------------------------------------------------------------------
# End to end: sample a batch, measure, write
# ---------------------------------------------------------------------------------------------------------------------


def sample_batch(
    student: nn.Module,
    tokenizer: Any,
    task: Any,
    examples: Sequence[Any],
    spec: RenderSpec,
    *,
    rollout: RolloutOptions,
    seed: int,
    batch_size: int | None = None,
) -> TwoViewBatch:
    """Responses sampled from the student on the no-context view (the one sampler, `items.sample_responses`: a
    response depends on (seed, example), not on `batch_size`; `rollout`: the sampling section, None fields `task`'s),
    as ONE batch of both views on the student's device."""
    responses = sample_responses(
        student,
        tokenizer,
        task,
        examples,
        spec,
        seed=seed,
        batch_size=batch_size or max(1, len(examples)),
        rollout=rollout,
    )
    items = ProbeItems(
        tokenizer,
        list(examples),
        responses,
        spec,
        max(1, len(examples)),
        max_length=getattr(student.config, "max_position_embeddings", None),
    )
    return next(iter(items)).to(next(student.parameters()).device)


@dataclass(frozen=True)
class GradientsOptions:
    """`mechopd probe gradients`'s options (`mechopd.probes.options`)."""

    model: Role | None = option(None, f"model to differentiate: {MODEL_HELP} (default: first trained)")
    teacher: Role | None = option(None, f"teacher: {MODEL_HELP} (default: the run's teacher, else base)")
    terms: Sequence[str] = option(("opd", "nca"), "two loss terms, e.g. opd,nca (dual and sym too)")
    layers: Sequence[int] | None = option(None, "comma-separated decoder layers (default: every parameter)")
    estimator: str = option("full", "the OPD term's estimator", choices=ESTIMATORS)

    def __post_init__(self) -> None:  # the text options' syntax and the terms' names, before any model loads
        normalise(self, terms=lambda text, flag: parse_terms(text), layers=int_list)
        for name in self.terms:
            if name not in TERMS:
                loss_term(name)  # the unknown term's one line


def parse_terms(terms: str) -> tuple[str, str]:
    """``--terms opd,nca`` -> ("opd", "nca"); anything but two different names refused with one line."""
    try:
        return pair(terms, "--terms")
    except ConfigError as e:
        if "twice" in str(e):
            raise
        raise ConfigError(f"--terms {terms!r} must name two terms, e.g. --terms opd,nca") from None


def run_gradients(
    setup: ProbeSetup,
    out_dir: str | os.PathLike,
    opts: GradientsOptions | None = None,
    *,
    topk: int = TermOptions.topk,
    include_non_layer: bool = False,
    device: str | None = None,
) -> list[str]:
    """Sample one response of the student per setup item (split default "train"), measure the alignment of
    ``opts.terms``, write ``gradients.csv``, ``gradients.json`` (`GradientSummary` + rows) and
    ``gradients_items.jsonl``; returns the line `mechopd probe gradients` prints (the rows are in gradients.csv and gradients.json).

    opts.model / opts.teacher: labels of the setup or checkpoint dirs; None = the first trained model / the setup's
    teacher (else base). The setup's temperature (None: the task's) is used for sampling and for the terms. A teacher
    whose tokenizer differs from the student's raises ``ModelError``.
    """
    opts = opts or GradientsOptions()
    terms, estimator, layers = opts.terms, opts.estimator, opts.layers
    for name in terms:
        loss_term(name, estimator, topk)  # validate before loading anything
    ctx = ProbeContext.prepare(
        setup,
        "gradients",
        out_dir,
        {"model": (opts.model, "trained"), "teacher": (opts.teacher, TEACHER)},
        default_split="train",
        device=device,
    )
    student = ctx.load("model")
    select_parameters(student, layers, include_non_layer)  # layers out of range: fail before sampling
    teacher_model = ctx.load("teacher")
    items = ctx.sample(student, batch_size=max(1, len(ctx.examples)))  # one sampling call over every item
    batch = next(iter(replace(items, batch_size=max(1, len(items.examples))))).to(ctx.device)
    kw: dict[str, Any] = dict(
        estimator=estimator,
        topk=topk,
        temperature=ctx.task.temperature,
        layers=layers,
        include_non_layer=include_non_layer,
    )  # the same for both measurements
    rows = term_gradients(student, teacher_model, batch, terms, **kw)
    null = split_half_cos(student, teacher_model, batch, terms[0], **kw)
    settings = ctx.settings(
        model=ctx.path("model"),
        teacher=ctx.path("teacher"),
        terms=list(terms),
        estimator=estimator,
        topk=topk,
        layers=None if layers is None else list(layers),
        include_non_layer=include_non_layer,
        response_tokens=int(batch.response_mask.sum()),
        null_cos=null,
        null="cos of term a's gradient on the even vs the odd items",
    )
    write_gradients(rows, out_dir, settings, model=ctx.label("model"))
    return _lines(Path(out_dir))


def _lines(out: Path) -> list[str]:
    """The line `mechopd probe gradients` prints: the global cosine and norm ratio, and the table's path."""
    s = GradientSummary.require(out)
    return [
        f"cos(grad {s.term_a}, grad {s.term_b}) = {s.cos:.4f}, norm ratio {s.norm_ratio:.4f}; table: {out / CSV_NAME}"
    ]


def write_gradients(
    rows: Iterable[GradRow], out_dir: str | os.PathLike, settings: dict[str, Any], model: str = "model"
) -> Path:
    """Write ``gradients.csv`` (one row per group) and ``gradients.json`` (`GradientSummary` of the global row, with
    the settings and every row); returns the CSV path. ``model``: the label of the differentiated checkpoint."""
    out = Path(out_dir)
    rows = list(rows)
    write_csv(out / CSV_NAME, rows, [f.name for f in fields(GradRow)])
    g = next(r for r in rows if r.scope == "global")
    summary = GradientSummary(
        g.term_a,
        g.term_b,
        model,
        g.cos,
        g.norm_ratio,
        g.value_a,
        g.value_b,
        int(settings.get("response_tokens", 0)),
        settings,
        float(settings.get("null_cos", math.nan)),
    )
    summary.save(out, rows=rows)
    return out / CSV_NAME


register_probe(
    ProbeSpec(
        "gradients",
        "alignment of two loss terms' gradients (global, per layer, per module)",
        run_gradients,
        options=GradientsOptions,
        order=20,
        outputs=("gradients.csv", "gradients.json"),
        demo={"model": "opd", "terms": "opd,nca", "estimator": "full"},
        role_options=("model",),
        summary=GradientSummary,
    )
)
