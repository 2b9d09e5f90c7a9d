"""Parameter deltas per layer x module, streamed tensor by tensor (docs/method.md section 2: parameter updates).

Per tensor W, with base weights W0, trained weights θ_m of model m and its update Δ_m = θ_m - W0:

    w0_norm    = ‖W0‖_F                                  rows model="base", vs=""
    delta_norm = ‖θ_m - θ_vs‖_F                          rows model=m, vs="base" (= ‖Δ_m‖_F)
    rel_delta  = delta_norm / ‖W0‖_F                     same rows (the paper's normalisation, made explicit)
    cos        = ⟨Δ_a, Δ_b⟩ / (‖Δ_a‖_F ‖Δ_b‖_F)          rows model=b, vs=a, only with pair=(a, b)

With ``pair=("opd", "nca")`` the rows model="nca", vs="opd" hold the NCA-specific part θ_NCA - θ_OPD (delta_norm,
rel_delta) and the cosine between the two updates, both measured from W0.

The table is long ("tidy"), one value per row: model, vs, site, layer, module, param, numel, tied_to, metric, value.
A layer x module heatmap is ``aggregate_deltas(rows, "site")`` filtered on (model, vs, metric) and pivoted on
(layer, module). Aggregates sum squares and inner products over tensors, never norms.

Non-standard things here:
  * Streaming (the reader is `mechopd.probes.weights`): every checkpoint is read through ``safe_open`` one window of
    rows at a time, never two whole models.
    A helper thread copies window i + 1 of every checkpoint out of the file mappings into reused staging buffers
    while the caller's thread computes on window i; a checkpoint's file is re-opened once 4 x window_numel bytes went
    through it, so that the pages it touched leave this process's RSS. The arithmetic runs in cache-sized chunks of
    X = [W0, Δ_1 .. Δ_M, (θ_b - θ_a)] ([R, chunk], float64 by default), one norm per row, summed in float64;
    ⟨Δ_a, Δ_b⟩ comes from ‖Δ_a‖², ‖Δ_b‖², ‖Δ_b - Δ_a‖² (absolute error of cos ~ machine epsilon).
  * A LoRA checkpoint (``adapter/`` beside merged weights, `mechopd.models.lora`): each adapted tensor is read as W0 + ΔW with
    ΔW = (α / r) B A from the adapter (`weights.reader_for`), so its update is the adapter's, not a rounded merge.
  * Tied embeddings: a checkpoint is tied when config.json says ``tie_word_embeddings`` (else: when it has no
    lm_head tensor). A tied head is not read (a copy stored next to the embedding is dropped, as transformers ties it
    on load); the table repeats the embedding's values on ``lm_head`` rows with ``tied_to="embed_tokens"``, and
    aggregates skip those rows. A tied and an untied checkpoint in one comparison is an error naming lm_head.weight.
  * Sites follow mechopd.core.sites: ``layers.{i}.self_attn.q_proj`` (layer i, module ``q_proj``), ``embed``,
    ``final_norm``, ``lm_head`` (layer None; modules ``embed_tokens``, ``norm``, ``lm_head``). A bias shares its
    module's site with ``param="bias"``; site aggregates combine weight and bias.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mechopd.core.artifacts import Summary, read_float
from mechopd.core.errors import ConfigError
from mechopd.core.options import GE1, option
from mechopd.models.lora import AdapterDeltas, adapter_dir
from mechopd.probes.delta_rows import DeltaRow, read_table, write_table
from mechopd.probes.delta_sums import aggregate_deltas, parameter_deltas
from mechopd.probes.delta_svd import run_delta_svd, svd_lines
from mechopd.probes.options import MODEL_HELP, Role, models_option, normalise
from mechopd.probes.options import pair as two_items
from mechopd.probes.registry import ProbeSpec, register_probe
from mechopd.probes.setup import BASE, ProbeSetup

CSV_NAME = "deltas.csv"
METRICS = ("w0_norm", "delta_norm", "rel_delta", "cos")


@dataclass
class DeltaSummary(Summary):
    """Parameter deltas, whole model: ``rel_delta[label]`` = ‖θ − W0‖/‖W0‖ over all tensors; with a pair (a, b),
    ``pair_rel_delta`` = ‖θ_b − θ_a‖/‖W0‖ and ``pair_cos`` = cos(Δ_a, Δ_b)."""

    FILE: ClassVar[str] = "deltas_summary.json"
    PROBE: ClassVar[str] = "deltas"
    FLOATS: ClassVar[tuple[str, ...]] = ("pair_rel_delta", "pair_cos")

    models: list[str]
    rel_delta: dict[str, float]
    pair: list[str] | None = None
    pair_rel_delta: float = math.nan
    pair_cos: float = math.nan
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rel_delta = {k: read_float(v) for k, v in self.rel_delta.items()}

    def lines(self) -> list[str]:
        rel = ", ".join(
            f"{m} {self.rel_delta[m]:.3g}{' (no update)' if self.rel_delta[m] == 0 else ''}"
            for m in self.models
            if m in self.rel_delta
        )
        out = f"- **Parameter updates** ‖θ − W0‖/‖W0‖ over all tensors: {rel}"
        if self.pair:
            a, b = self.pair
            cos = self.pair_cos
            said = f"{cos:.3f}" if isinstance(cos, (int, float)) and cos == cos else "undefined (a zero update)"
            out += f"; {b} − {a}: {self.pair_rel_delta:.3g}, cos(Δ{a}, Δ{b}) = {said}"
        return [out + "."]

    def update_norms(self, model: str, vs: str = "base") -> tuple[dict[int, float], dict[str, float]] | None:
        """Relative update ‖ΔW‖/‖W0‖ of ``model`` vs ``vs``, pooled per decoder layer and per module name
        (`aggregate_deltas`: squares summed over the group's tensors, weight and bias), from ``deltas.csv``; None
        without the table. Parameters outside the decoder layers (embeddings, final norm, lm_head) are not pooled."""
        path = Path(getattr(self, "probes_dir", ".")) / CSV_NAME
        if not path.is_file():
            return None
        rows = [r for r in read_table(path) if r.layer is not None]

        def pick(by):
            return [
                r for r in aggregate_deltas(rows, by) if r.model == model and r.vs == vs and r.metric == "rel_delta"
            ]

        return {r.layer: r.value for r in pick("layer")}, {r.module: r.value for r in pick("module")}


def summarize_deltas(rows: Sequence[DeltaRow], pair: tuple[str, str] | None, settings: dict) -> DeltaSummary:
    """Whole-model values (``aggregate_deltas(rows, "all")``) as a `DeltaSummary`."""
    overall = aggregate_deltas(rows, "all")
    rel = {r.model: r.value for r in overall if r.metric == "rel_delta" and r.vs == BASE}
    pick = {r.metric: r.value for r in overall if pair is not None and (r.vs, r.model) == tuple(pair)}
    return DeltaSummary(
        list(rel),
        rel,
        list(pair) if pair else None,
        pick.get("rel_delta", math.nan),
        pick.get("cos", math.nan),
        settings,
    )


@dataclass(frozen=True)
class DeltasOptions:
    """`mechopd probe deltas`'s options (`mechopd.probes.options`)."""

    base: Role | None = option(None, f"W0: {MODEL_HELP} (default: the run's base)")
    models: list[Role] | None = models_option("trained models (default: every trained model of the run)")
    pair: Sequence[str] | None = option(None, "two labels to compare, e.g. opd,nca (default: the first two)")
    svd: bool = option(
        False,
        "also the update's geometry per layer x module (deltas_svd.csv: eff_rank, top-k energy, "
        "sparsity, overlap with W0's subspace)",
    )
    svd_k: int = option(8, "k of the top-k energy and overlap", range=GE1)

    def __post_init__(self) -> None:  # "opd,nca" -> ("opd", "nca"), before any model loads
        normalise(self, pair=two_items)


def run_deltas(
    setup: ProbeSetup, out_dir: str | os.PathLike, opts: DeltasOptions | None = None, *, progress: bool = True
) -> list[str]:
    """`mechopd probe deltas`: every model's update from ``opts.base`` (a setup label or a dir; default the setup's
    base); opts.models: a mapping label -> dir, labels / dirs / ``NAME=DIR`` items, or None = the setup's trained
    models; opts.pair: two labels (default the first two models, when there are two). Writes ``deltas.csv``,
    ``deltas.json`` and ``deltas_summary.json`` (`DeltaSummary`), with ``opts.svd`` also ``deltas_svd.csv`` /
    ``.json`` (`delta_svd`); returns the lines `mechopd probe deltas` prints."""
    opts = opts or DeltasOptions()
    pair = opts.pair
    _, base_dir = setup.model(opts.base, BASE)
    chosen = setup.pick(opts.models, setup.trained)
    if pair and len(pair) != 2:  # the message of delta_sums._check_labels, which checks the rest
        raise ConfigError(f"pair {tuple(pair)} must name two different model labels out of {', '.join(chosen)}")
    labels = list(chosen)
    two = (pair[0], pair[1]) if pair else ((labels[0], labels[1]) if len(labels) >= 2 else None)
    rows = parameter_deltas(base_dir, chosen, pair=two, progress=progress)
    out = Path(out_dir)
    paths = write_table(rows, out / "deltas.csv")
    settings = {
        "probe": "deltas",
        "base": base_dir,
        "models": chosen,
        "pair": list(two) if two else None,
        "adapters": {k: AdapterDeltas(a).record for k, d in chosen.items() if (a := adapter_dir(d)) is not None},
        "model_paths": {"base": base_dir, **chosen},
    }  # weights only: no task, items or tokenizer to resolve
    if opts.svd:
        paths += run_delta_svd(base_dir, chosen, out, opts.svd_k, progress=progress)
    paths.append(summarize_deltas(rows, two, settings).save(out))
    return [f"delta table: {', '.join(str(p) for p in paths)}"] + report(out)


def report(probes_dir: Path) -> list[str]:
    """The deltas probe's report lines: `DeltaSummary.lines()`, then the update geometry when ``--svd`` ran."""
    result = DeltaSummary.load(probes_dir)
    return (result.lines() if result is not None else []) + svd_lines(probes_dir)


register_probe(
    ProbeSpec(
        "deltas",
        "parameter-delta attribution per layer x module (streamed safetensors)",
        run_deltas,
        options=DeltasOptions,
        order=30,
        outputs=("deltas.csv", "deltas.json", "deltas_summary.json"),
        demo={"models": ["opd", "nca"], "pair": "opd,nca", "svd": True},
        role_options=("models", "pair"),
        summary=DeltaSummary,
        report=report,
    )
)
