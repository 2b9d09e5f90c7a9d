"""The four built-in probes' registrations (`mechopd.probes.registry`): CLI flags, the run adapters that print, the
demo's choice of models (ROLES of the study, `role_options`), the typed summary (which gives the report lines), the
figures. Each adapter imports its probe module when it runs; the summaries are named by "module:Class".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechopd.errors import ConfigError
from mechopd.probes.registry import Arg, FigureSpec, ProbeSpec, register_probe

MODEL_HELP = "a label of the run (base, teacher, opd, ...) or a checkpoint dir"


def _layers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--layers {text!r} must be comma-separated integers, e.g. --layers 0,1,2") from None


def _pair(text: str | None, flag: str) -> tuple[str, str] | None:
    if text is None:
        return None
    parts = tuple(t.strip() for t in text.split(","))
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{flag} {text!r} must name two items, e.g. {flag} opd,nca")
    if parts[0] == parts[1]:  # a term against itself is cos 1.0 by construction, not a measurement
        raise ConfigError(f"{flag} {text!r} names {parts[0]!r} twice; name two different items, e.g. {flag} opd,nca")
    return parts  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------------- adapters
def similarity(setup: Any, out: Path, *, models: list[str] | None, layers: str | None, cka: bool,
               greedy: bool, cache: str | None) -> list[str]:
    from mechopd.probes.similarity import run_similarity

    from mechopd.probes.similarity import SimilaritySummary

    path = run_similarity(setup, out, models=models, layers=_layers(layers), cka=cka, greedy=greedy, cache=cache)
    return [f"similarity table: {path}"] + SimilaritySummary.load(out).lines()


def gradients(setup: Any, out: Path, *, model: str | None, teacher: str | None, terms: str, layers: str | None,
              estimator: str) -> list[str]:
    from mechopd.probes.gradients import GradientSummary, run_gradients

    try:
        pair = _pair(terms, "--terms")
    except ConfigError as e:
        if "twice" in str(e):
            raise
        raise ConfigError(f"--terms {terms!r} must name two terms, e.g. --terms opd,nca") from None
    run_gradients(setup, out, model=model, teacher=teacher, terms=pair, estimator=estimator, layers=_layers(layers))
    s = GradientSummary.load(out)
    return [f"cos(grad {s.term_a}, grad {s.term_b}) = {s.cos:.4f}, norm ratio {s.norm_ratio:.4f}; "
            f"table: {out / 'gradients.csv'}"]


def deltas(setup: Any, out: Path, *, base: str | None, models: list[str] | None, pair: str | None, svd: bool,
           svd_k: int) -> list[str]:
    from mechopd.probes.deltas import run_deltas

    paths = run_deltas(setup, out, base=base, models=models, pair=_pair(pair, "--pair"), svd=svd, svd_k=svd_k)
    return [f"delta table: {', '.join(str(p) for p in paths)}"] + deltas_report(out)


def deltas_report(probes_dir: Path) -> list[str]:
    """The deltas probe's report lines: `DeltaSummary.lines()`, then the update geometry when ``--svd`` ran."""
    from mechopd.probes.delta_svd import svd_lines
    from mechopd.probes.deltas import DeltaSummary

    result = DeltaSummary.load(probes_dir)
    return (result.lines() if result is not None else []) + svd_lines(probes_dir)


def teachability(setup: Any, out: Path, *, student: str | None, trained: str | None, teacher: str | None,
                 bank: str | None, n_boot: int) -> list[str]:
    from mechopd.probes.teachability import TeachabilitySummary, run_teachability

    run_teachability(setup, out, student=student, trained=trained, teacher=teacher, bank=bank, n_boot=n_boot)
    return [f"teachability: {out / TeachabilitySummary.FILE}"] + TeachabilitySummary.load(out).lines()


# -------------------------------------------------------------------------------------------------- registrations
register_probe(ProbeSpec(
    "similarity", "layerwise two-view hidden-state cosine (several models, same items, same responses)", similarity,
    arguments=(
        Arg(("--models",), dict(nargs="+", default=None, metavar="LABEL|NAME=DIR",
                                help="models to compare (default: every model of the run but the teacher)")),
        Arg(("--layers",), dict(default=None, help="comma-separated decoder layers (default: all sites)")),
        Arg(("--cka",), dict(action="store_true", help="also linear CKA over tokens")),
        Arg(("--greedy",), dict(action="store_true", help="argmax responses instead of sampled ones")),
        Arg(("--cache",), dict(default=None, metavar="DIR", help="an activation store written by `mechopd probe "
                               "cache`: its items, responses and activations instead of forwards (same numbers)")),
    ),
    outputs=("similarity.csv", "similarity_examples.csv", "similarity_responses.jsonl", "similarity.json"),
    demo={"models": ["base", "opd", "nca"]}, role_options=("models",),
    summary="mechopd.probes.similarity:SimilaritySummary",
    figures=(FigureSpec(
        "layer_cosine", "Two-view hidden-state cosine per layer",
        "Cosine between the hidden states of the same response token with and without the context, per-token mean "
        "over the response tokens, at the embedding, after each decoder layer and after the final norm; one line "
        "per model.", "mechopd.plots.layers:plot_layer_cosine"),),
))

register_probe(ProbeSpec(
    "gradients", "alignment of two loss terms' gradients (global, per layer, per module)", gradients,
    arguments=(
        Arg(("--model",), dict(default=None, help=f"model to differentiate: {MODEL_HELP} (default: first trained)")),
        Arg(("--teacher",), dict(default=None, help=f"teacher: {MODEL_HELP} (default: the run's teacher, else base)")),
        Arg(("--terms",), dict(default="opd,nca", help="two of opd,nca,dual,sym")),
        Arg(("--layers",), dict(default=None, help="comma-separated decoder layers (default: every parameter)")),
        Arg(("--estimator",), dict(default="full", help="full | topk | sampled (the OPD term's estimator)")),
    ),
    outputs=("gradients.csv", "gradients.json"),
    demo={"model": "opd", "terms": "opd,nca", "estimator": "full"}, role_options=("model",),
    summary="mechopd.probes.gradients:GradientSummary",
    figures=(FigureSpec(
        "gradient_alignment", "Gradient alignment of the OPD and NCA terms",
        "Cosine between the gradients of the two loss terms on the same batch, per decoder layer and module (blue "
        "negative, red positive); the panel title gives the global cosine over all parameters and the ratio of the "
        "gradient norms.", "mechopd.plots.layers:plot_gradient_alignment"),),
))

register_probe(ProbeSpec(
    "deltas", "parameter-delta attribution per layer x module (streamed safetensors)", deltas,
    arguments=(
        Arg(("--base",), dict(default=None, help=f"W0: {MODEL_HELP} (default: the run's base)")),
        Arg(("--models",), dict(nargs="+", default=None, metavar="LABEL|NAME=DIR",
                                help="trained models (default: every trained model of the run)")),
        Arg(("--pair",), dict(default=None, help="two labels to compare, e.g. opd,nca (default: the first two)")),
        Arg(("--svd",), dict(action="store_true", help="also the update's geometry per layer x module (deltas_svd.csv: "
                                                     "eff_rank, top-k energy, sparsity, overlap with W0's subspace)")),
        Arg(("--svd-k",), dict(dest="svd_k", type=int, default=8,
                               help="k of the top-k energy and overlap (default 8)")),
    ),
    outputs=("deltas.csv", "deltas.json", "deltas_summary.json"),
    demo={"models": ["opd", "nca"], "pair": "opd,nca", "svd": True}, role_options=("models", "pair"),
    summary="mechopd.probes.deltas:DeltaSummary", report=deltas_report,
    figures=(FigureSpec(
        "parameter_deltas", "Parameter updates per layer and module",
        "Relative Frobenius norm of the update ‖θ − W0‖/‖W0‖ per decoder layer and module for each trained model, "
        "and of the difference between two trained models (e.g. NCA − OPD, with the cosine between their updates), "
        "on one colour scale.", "mechopd.plots.layers:plot_parameter_deltas"),),
))

register_probe(ProbeSpec(
    "teachability", "fixed-context token teachability diagnostic (TA-OPD)", teachability,
    arguments=(
        Arg(("--student",), dict(default=None, help=f"the initial student θ0: {MODEL_HELP} (default: base)")),
        Arg(("--trained",), dict(default=None, help=f"the trained student θ1: {MODEL_HELP} (default: first trained)")),
        Arg(("--teacher",), dict(default=None, help=f"teacher: {MODEL_HELP} (default: the run's teacher, else base)")),
        Arg(("--bank",), dict(default=None, help="an existing bank.json (default: sample one from θ0)")),
        Arg(("--n-boot",), dict(dest="n_boot", type=int, default=1000, help="sequence-bootstrap resamples")),
    ),
    outputs=("teachability_summary.json", "teachability_tokens.csv", "bank.json"),
    demo={"trained": "ta_opd"}, role_options=("trained",),
    summary="mechopd.probes.teachability:TeachabilitySummary",
    figures=(FigureSpec(
        "teachability", "Teachability of teacher–student disagreement",
        "Fixed-context gain (KL to the teacher before minus after training, same token ids) by quartile of the "
        "pre-update compatibility C̃, learnable D^L, incompatible D^I and raw KL; the high-support gain gap inside "
        "the low-entropy / high-divergence cell with its sequence-bootstrap interval; the standardized regression "
        "coefficients of the gain.", "mechopd.plots.teachability:plot_teachability"),),
))

import mechopd.probes.causal_builtin  # noqa: E402,F401  (lens, patching, attention: their own registrations)
import mechopd.probes.mechanism_builtin  # noqa: E402,F401  (weightpatch, ...: their own registrations)
