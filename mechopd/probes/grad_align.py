"""The gradient-alignment probe's measurement (`mechopd.probes.gradients`, whose docstring has the math and the null):
the loss terms and parameters to differentiate, the two terms' gradients on one batch, their inner products summed per
parameter group, and the split-half null.

    cos = Σ_{θ∈P} <g_a, g_b> / (sqrt(Σ_{θ∈P} ‖g_a‖²) · sqrt(Σ_{θ∈P} ‖g_b‖²)),   g_t = ∇θ L_t (unweighted token means)
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from mechopd.config.terms import ESTIMATORS
from mechopd.core.errors import ConfigError
from mechopd.core.sites import module_kind, param_layer
from mechopd.core.views import TwoViewBatch
from mechopd.generate.groups import take_rows
from mechopd.generate.scorer import ROLES, score_roles
from mechopd.models import num_layers
from mechopd.models.arch import model_views
from mechopd.objectives.divergences import token_mean
from mechopd.objectives.losses import TERMS as TERM_REGISTRY
from mechopd.objectives.losses import LossInputs, LossTerm, TermOptions, make_term, terms_need

TERMS = tuple(TERM_REGISTRY)  # every registered loss term (losses.register_term)
WARN_RATIO = 1e-3  # a row warns when one gradient norm is below WARN_RATIO x the other (its cosine is then noise)
SCOPES = ("global", "layer", "module", "layer_module")


@dataclass(frozen=True)
class GradRow:
    """One parameter group's alignment between terms a and b (see the module docstring for the formulas).

    value_a / value_b: the terms' scalar values on the batch (the same on every row, for reference);
    warning: "" or e.g. "norm_a < 1e-3 x norm_b" when one norm is below ``WARN_RATIO`` of the other.
    """

    term_a: str
    term_b: str
    scope: str
    layer: int | None
    module: str
    numel: int
    dot: float
    norm_a: float
    norm_b: float
    cos: float
    norm_ratio: float
    value_a: float
    value_b: float
    warning: str = ""


# ---------------------------------------------------------------------------------------------------------------------
# Terms and parameters
# ---------------------------------------------------------------------------------------------------------------------


def loss_term(name: str, estimator: str = TermOptions.estimator, topk: int = TermOptions.topk) -> LossTerm:
    """The registered ``LossTerm`` called ``name`` (one of TERMS, `losses.register_term`), unweighted."""
    if name not in TERMS:
        raise ConfigError(f"gradient term {name!r} is unknown: use one of {', '.join(TERMS)} (e.g. --terms opd,nca)")
    if estimator not in ESTIMATORS:
        raise ConfigError(f"estimator={estimator!r} is unknown: use one of {', '.join(ESTIMATORS)}")
    return make_term(name, TermOptions(estimator=estimator, topk=topk))


def select_parameters(
    model: nn.Module, layers: Sequence[int] | None = None, include_non_layer: bool = False
) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` pairs to differentiate: all of them, or only ``layers`` (+ non-layer ones if asked).

    Tied weights appear once (``named_parameters`` de-duplicates; see the module docstring). Layers out of range raise
    ``ConfigError`` naming the valid range.
    """
    named = list(model.named_parameters())
    if layers is None:
        return named
    n = num_layers(model)
    bad = [i for i in layers if not (isinstance(i, int) and 0 <= i < n)]
    if bad or not layers:
        raise ConfigError(
            f"layers={list(layers)} is invalid: the model has {n} decoder layers (0..{n - 1}); "
            "pass --layers with indices in that range"
        )
    wanted = set(layers)
    return [(k, p) for k, p in named if (param_layer(k) in wanted) or (include_non_layer and param_layer(k) is None)]


def _score_inputs(
    student: nn.Module, teacher: nn.Module | None, batch: TwoViewBatch, needs: frozenset[str], temperature: float
) -> LossInputs:
    """The log-probabilities the terms need, aligned ``[batch, R, vocab]`` (common vocab), student ones with grad:
    the one scorer (``generate.scorer.score_roles``), as the trainer scores."""
    if needs & {"teacher", "teacher_token"} and teacher is None:
        raise ConfigError("a gradient term needs the teacher (opd, dual) but no teacher was given")
    roles = [r for r in ROLES if r in needs or f"{r}_token" in needs]  # a token view is read off its full one
    logp = score_roles(student, teacher, batch, roles, temperature=temperature)
    return LossInputs(
        student_nctx=logp.get("student_nctx"),
        student_ctx=logp.get("student_ctx"),
        teacher=logp.get("teacher"),
        tokens=batch.response_ids,
    ).with_tokens()


# ---------------------------------------------------------------------------------------------------------------------
# Gradients and their inner products
# ---------------------------------------------------------------------------------------------------------------------


def _row(
    term_a: str, term_b: str, scope: str, layer: int | None, module: str, sums: list[float], values: tuple[float, float]
) -> GradRow:
    numel, dot, sq_a, sq_b = sums
    na, nb = math.sqrt(sq_a), math.sqrt(sq_b)
    cos = dot / (na * nb) if na > 0 and nb > 0 else float("nan")
    ratio = na / nb if nb > 0 else float("nan")
    warning = (
        f"norm_a < {WARN_RATIO:g} x norm_b"
        if na < WARN_RATIO * nb
        else (f"norm_b < {WARN_RATIO:g} x norm_a" if nb < WARN_RATIO * na else "")
    )
    return GradRow(term_a, term_b, scope, layer, module, int(numel), dot, na, nb, cos, ratio, *values, warning)


def aggregate(
    names: list[str],
    sums: list[tuple[float, ...]],
    sizes: list[int],
    term_a: str,
    term_b: str,
    values: tuple[float, float],
) -> list[GradRow]:
    """Per-parameter sums -> rows for every scope (global, layer, module, layer_module), in a stable order."""
    groups: dict[tuple[str, int | None, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for name, (dot, sq_a, sq_b), size in zip(names, sums, sizes):
        layer, module = param_layer(name), module_kind(name)
        keys = [("global", None, ""), ("module", None, module), ("layer_module", layer, module)]
        if layer is not None:
            keys.append(("layer", layer, ""))
        for key in keys:
            acc = groups[key]
            acc[0] += size
            acc[1] += dot
            acc[2] += sq_a
            acc[3] += sq_b

    def order(key: tuple[str, int | None, str]) -> tuple[int, int, str]:
        scope, layer, module = key
        return (SCOPES.index(scope), -1 if layer is None else layer, module)

    return [_row(term_a, term_b, *key, groups[key], values) for key in sorted(groups, key=order)]


def term_gradients(
    student: nn.Module,
    teacher: nn.Module | None,
    batch: TwoViewBatch,
    terms: Sequence[str],
    *,
    estimator: str = TermOptions.estimator,
    topk: int = TermOptions.topk,
    temperature: float = 1.0,
    layers: Sequence[int] | None = None,
    include_non_layer: bool = False,
) -> list[GradRow]:
    """Cosine and norm ratio of ∇θ of two loss terms on one batch, globally, per layer, per module type.

    student: the model whose gradients are taken (its parameters get ``requires_grad`` for the call, then restored);
    teacher: scores the context view (None is fine when neither term needs it: nca, sym);
    batch: a `TwoViewBatch` on the student's device; terms: two names from TERMS (the same name twice is allowed:
    cosine 1 by construction); estimator / topk: L_OPD's form (losses.method_terms); temperature: divides all logits;
    layers / include_non_layer: see `select_parameters`.
    """
    if len(terms) != 2:
        raise ConfigError(
            f"terms={list(terms)} is invalid: gradient alignment compares exactly two terms (e.g. --terms opd,nca)"
        )
    if not temperature > 0:
        raise ConfigError(f"temperature={temperature} is invalid: it must be > 0 (docs/method.md: 1.0 QA, 0.7 games)")
    loss_terms = [loss_term(t, estimator, topk) for t in terms]
    named = select_parameters(student, layers, include_non_layer)
    names, params = [k for k, _ in named], [p for _, p in named]
    sizes = [p.numel() for p in params]
    was = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(True)
        inputs = _score_inputs(student, teacher, batch, terms_need(loss_terms), temperature)
        mask = batch.response_mask
        value_a = token_mean(loss_terms[0].fn(inputs).per_pos, mask)
        value_b = token_mean(loss_terms[1].fn(inputs).per_pos, mask)
        buf_dtype = torch.promote_types(params[0].dtype, torch.float32)
        flat_a = _flatten_into(_grads(value_a, params, retain=True), sizes, buf_dtype, params[0].device)
        by_raw: dict[str, list] = defaultdict(list)
        for view in model_views(student).values():  # fused q/k/v (gate/up) tensors: one row per part
            by_raw[view.raw].append(view)
        names, sums, sizes = view_sums(
            flat_a, _grads(value_b, params, retain=False), params, [by_raw[n] for n in names]
        )
    finally:
        for p, w in zip(params, was):
            p.requires_grad_(w)
    values = (float(value_a.detach()), float(value_b.detach()))
    return aggregate(names, sums, sizes, terms[0], terms[1], values)


def split_half_cos(
    student: nn.Module,
    teacher: nn.Module | None,
    batch: TwoViewBatch,
    term: str = "opd",
    *,
    estimator: str = TermOptions.estimator,
    topk: int = TermOptions.topk,
    temperature: float = 1.0,
    layers: Sequence[int] | None = None,
    include_non_layer: bool = False,
) -> float:
    """cos(∇L[even items], ∇L[odd items]) of one term over the selected parameters (the null of module docstring);
    NaN with fewer than two items or a zero gradient."""
    if batch.batch_size < 2:
        return math.nan
    term_fn = loss_term(term, estimator, topk)
    params = [p for _, p in select_parameters(student, layers, include_non_layer)]
    sizes, was = [p.numel() for p in params], [p.requires_grad for p in params]
    halves = [take_rows(batch, range(k, batch.batch_size, 2)) for k in (0, 1)]
    try:
        for p in params:
            p.requires_grad_(True)
        grads = []
        for half in halves:
            inputs = _score_inputs(student, teacher, half, terms_need([term_fn]), temperature)
            grads.append(_grads(token_mean(term_fn.fn(inputs).per_pos, half.response_mask), params, retain=False))
        flat = _flatten_into(grads[0], sizes, torch.promote_types(params[0].dtype, torch.float32), params[0].device)
        sums = _param_sums(flat, grads[1], sizes)
    finally:
        for p, w in zip(params, was):
            p.requires_grad_(w)
    dot, sq_a, sq_b = (sum(v[i] for v in sums) for i in range(3))
    return dot / math.sqrt(sq_a * sq_b) if sq_a > 0 and sq_b > 0 else math.nan


# ---------------------------------------------------------------------------------------------- the gradient sums
# Term a's gradient copied into ONE flat buffer, term b's compared with it slice by slice; per parameter, in float64,
# (<g_a, g_b>, ||g_a||^2, ||g_b||^2): the memory-bounded sums the cosines are built from.
def _grads(value: torch.Tensor, params: list[nn.Parameter], retain: bool) -> list[torch.Tensor | None]:
    return list(torch.autograd.grad(value, params, retain_graph=retain, allow_unused=True))


def _flatten_into(
    grads: list[torch.Tensor | None], sizes: list[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Copy gradients into one preallocated flat buffer, releasing each autograd tensor as it goes. ``[Σ numel]``."""
    flat = torch.zeros(sum(sizes), dtype=dtype, device=device)
    offset = 0
    for i, size in enumerate(sizes):
        g = grads[i]
        if g is not None:
            flat[offset : offset + size].copy_(g.reshape(-1))
        grads[i] = None  # drop autograd's copy now
        offset += size
    return flat


def _param_sums(flat_a: torch.Tensor, grads_b: list[torch.Tensor | None], sizes: list[int]) -> list[tuple[float, ...]]:
    """Per parameter: ``(<g_a, g_b>, ‖g_a‖², ‖g_b‖²)`` in float64."""
    out: list[tuple[float, ...]] = []
    offset = 0
    for g_b, size in zip(grads_b, sizes):
        a = flat_a[offset : offset + size].double()
        b = torch.zeros_like(a) if g_b is None else g_b.reshape(-1).double()
        out.append((float(a @ b), float(a @ a), float(b @ b)))
        offset += size
    return out


def view_sums(
    flat_a: torch.Tensor, grads_b: list[torch.Tensor | None], params: list[nn.Parameter], views: list[list]
) -> tuple[list[str], list[tuple[float, ...]], list[int]]:
    """`_param_sums` per canonical view (`mechopd.models.arch.ParamView`; ``views[i]``: those of ``params[i]``): a
    fused q/k/v (gate/up) tensor's parts get their own sums. Returns (view names, sums, sizes)."""
    names: list[str] = []
    out: list[tuple[float, ...]] = []
    sizes: list[int] = []
    offset = 0
    for g_b, p, vs in zip(grads_b, params, views):
        a = flat_a[offset : offset + p.numel()].view(p.shape).double()
        b = torch.zeros_like(a) if g_b is None else g_b.double()
        for v in vs:
            va, vb = v.take(a).reshape(-1), v.take(b).reshape(-1)
            names.append(v.name)
            out.append((float(va @ vb), float(va @ va), float(vb @ vb)))
            sizes.append(va.numel())
        offset += p.numel()
    return names, out, sizes
