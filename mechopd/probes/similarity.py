"""Two-view hidden-state similarity per layer (docs/method.md section 2, mechanistic study).

Which positions are compared, and why: the PREDICTING positions of the response, at the same response index t in both
views — the state whose logits predict response token t (the last prompt token for t = 0, then response token t − 1),
the positions every loss term scores and every other probe (lens, patching, attention) reads. The two views share the
response ids y and differ only in the prompt (x vs c, x), so index t is the same token with the same left context
inside y; the prompt positions further back have no counterpart (different lengths, different words). The state OF the
response's last token (the stop token when the response stopped) predicts nothing any loss trains: its cosine is
reported apart (``cos_stop``), never averaged in. Padded response slots are excluded (``response_mask``).

Per site s (``embed``, ``layers.{i}.resid_post``, ``final_norm``; see capture.py) and predicting position t:

    cos_t(s) = <h_x(s, t), h_c(s, t)> / (||h_x(s, t)|| ||h_c(s, t)||)         (float32)

aggregated as the per-token mean over all predicting positions (``cos_mean``, the default the paper's numbers are read
against), the median over tokens (``cos_median``), the mean of per-example means (``cos_example_mean``), and one value
per example (the per-example table). Optional linear CKA over tokens (Kornblith et al. 2019), tokens as samples:

    CKA(X, Y) = ||X~^T Y~||_F^2 / (||X~^T X~||_F ||Y~^T Y~||_F),   X~ = X - mean over tokens   (X, Y: [tokens, d])

Memory model (streaming): hidden states live for one batch only. Per batch: the no-context view's captures,
``[batch, R, d]`` per requested site in the model's dtype, held until the context view's hook of the same site consumes
them (e.g. 38 sites x 4096 response slots x d 2560 x 2 bytes = 0.8 GB for Qwen3-4B in bf16: choose the batch size, or
fewer layers, accordingly), on top of one forward's activations. Kept across batches, per site: the per-token cosines
(4 bytes per response token, needed for the exact median) and one float per example; with ``cka=True`` three
``[d, d]`` float64 sums and two ``[d]`` sums (8 * (3 d^2 + 2 d) bytes per site, independent of the number of tokens).
`ProbeItems` keeps the items and their response ids. Nothing ``[tokens, d]`` accumulates. The forward stops after the
last requested site (capture.py), so a request without ``final_norm`` skips the layers above it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from mechopd.core.artifacts import Summary, read_float, write_jsonl, write_rows
from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.options import option
from mechopd.core.sites import sites_for
from mechopd.probes.items import ProbeItems
from mechopd.probes.options import Role, cache_option, greedy_option, int_list, models_option, normalise
from mechopd.probes.registry import ProbeSpec, register_probe
from mechopd.probes.runner import ProbeContext
from mechopd.probes.setup import TEACHER, ProbeSetup
from mechopd.probes.store import ActivationStore
from mechopd.probes.view_cosine import CosineAccumulator, SimilarityResult, two_view_cosine

CSV_NAME = "similarity.csv"


@dataclass
class SimilaritySummary(Summary):
    """Two-view cosine (``similarity.csv``), per-token means: ``per_layer[label]`` after each decoder layer,
    ``mean_cos[label]`` their mean over decoder layers, ``apart[label]`` the other sites (``embed``: 1 by
    construction, both views embed the same response tokens; ``final_norm``), reported apart."""

    FILE: ClassVar[str] = "similarity.json"
    PROBE: ClassVar[str] = "similarity"

    models: list[str]
    mean_cos: dict[str, float]
    sites: list[str]
    responses_from: str
    n_items: int
    settings: dict[str, Any] = field(default_factory=dict)
    per_layer: dict[str, list[float]] = field(default_factory=dict)
    apart: dict[str, dict[str, float]] = field(default_factory=dict)
    stop: dict[str, list[float]] = field(default_factory=dict)  # per decoder layer: the stop token's own state

    def __post_init__(self) -> None:
        self.mean_cos = {k: read_float(v) for k, v in self.mean_cos.items()}

    def lines(self) -> list[str]:
        def row(m: str) -> str:
            layers = " / ".join(f"{v:.4f}" for v in self.per_layer.get(m, []))
            other = ", ".join(f"{site} {v:.4f}" for site, v in self.apart.get(m, {}).items())
            stop = " / ".join(f"{v:.4f}" for v in self.stop.get(m, []))
            return (
                f"{m} {self.mean_cos[m]:.4f} (layers {layers or 'n/a'}"
                + (f"; apart: {other}" if other else "")
                + (f"; stop token {stop}" if stop else "")
                + ")"
            )

        means = "; ".join(row(m) for m in self.models if m in self.mean_cos)
        return [
            f"- **Two-view hidden-state cosine** (per-token mean over the predicting positions after each decoder "
            f"layer and their mean over decoder layers, the number the claims read; embed — 1 by construction — "
            f"and final_norm apart; the stop token's own state apart, per layer; "
            f"{self.n_items} items, responses from {self.responses_from}): {means}."
        ]

    def layer_cosines(self, model: str) -> list[float]:
        """Per-token mean two-view cosine of ``model`` after each decoder layer (``layers.{i}.resid_post``), in layer
        order, from ``similarity.csv``; [] when the table is absent or has no such rows."""
        if not (Path(getattr(self, "probes_dir", ".")) / CSV_NAME).is_file():
            return []
        rows = [r for r in self.table(CSV_NAME) if r["model"] == model and r["site"].endswith("resid_post")]
        return [read_float(r["cos_mean"]) for r in sorted(rows, key=lambda r: int(r["layer"]))]


# ---------------------------------------------------------------------------------------------------------------------
# End to end: `mechopd probe similarity`.


def _read_config(label: str, path: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(
            f"model {label!r}: cannot read the config at {path} ({type(e).__name__}); pass a directory "
            "written by save_pretrained"
        ) from None


def _items(ctx: ProbeContext, src: str, loaded: dict, *, greedy: bool, dtype: torch.dtype | None) -> ProbeItems:
    """The items with the responses of ``src``: a compared label (sampled from it; kept in ``loaded``), ``answers``,
    or a ``.jsonl`` of response ids (the runner saves them as ``similarity_items.jsonl``)."""
    if src in ctx.models:
        loaded[src] = ctx.load(src, dtype)
        return ctx.sample(loaded[src], greedy=greedy)
    if src == "answers":
        return ctx.answers()
    if src.endswith(".jsonl") and Path(src).is_file():
        return ctx.given(src)
    raise ConfigError(
        f"responses_from {src!r} is not a model label ({', '.join(ctx.models)}), 'answers' or an "
        "existing .jsonl file of response ids"
    )


@dataclass(frozen=True)
class SimilarityOptions:
    """`mechopd probe similarity`'s options (`mechopd.probes.options`)."""

    models: list[Role] | None = models_option()
    layers: Sequence[int] | None = option(None, "comma-separated decoder layers (default: all sites)")
    cka: bool = option(False, "also linear CKA over tokens")
    greedy: bool = greedy_option()
    cache: str | None = cache_option()

    def __post_init__(self) -> None:  # the list's syntax before any model loads; "0,1" -> [0, 1]
        normalise(self, layers=int_list)


def run_similarity(
    setup: ProbeSetup,
    out_dir: str | os.PathLike,
    opts: SimilarityOptions | None = None,
    *,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    progress: bool = True,
) -> list[str]:
    """`mechopd probe similarity`: every compared model on the same items of the setup and the same responses.

    models: labels / dirs / ``NAME=DIR`` items or a mapping (`ProbeSetup.pick`; default every model of the setup but
    the teacher; ``teacher`` named is compared too, forward only), loaded one at a time. Models of one tokenizer
    (`ProbeContext` checks it) but of other depths or widths (a cross-model study's 1.5B teacher beside its 0.5B
    students) are each measured at their own sites (``settings.sites_by_model``). Responses: ``setup.responses_from`` (a compared label,
    ``"answers"``, a ``.jsonl`` of response ids), default the first trained model, else the first model. Writes
    ``similarity.csv`` (per model x site), ``similarity_examples.csv`` (per model x item x site),
    ``similarity_responses.jsonl`` (the response ids used), ``similarity_items.jsonl`` (the runner's exact items) and
    ``similarity.json`` (`SimilaritySummary`). Returns the lines `mechopd probe similarity` prints.
    opts.cache: an activation store (`mechopd probe cache`): its items and responses, its activations instead of
    forwards. A mapping of label -> dir may stand in ``opts.models`` (`ProbeSetup.pick`).
    """
    opts = opts or SimilarityOptions()
    store, setup = ActivationStore.open(opts.cache, setup)  # (None, setup) without a cache
    models = setup.pick(opts.models, [k for k in setup.models if k != TEACHER])
    labels = list(models)
    if store is not None:  # the store holds these labels, written from these very weights
        store.check(labels, [])
        store.check_models(models)
    configs = {label: _read_config(label, path) for label, path in models.items()}
    sites = {label: sites_for(cfg.num_hidden_layers, opts.layers) for label, cfg in configs.items()}  # own depth
    ctx = ProbeContext.prepare(setup, "similarity", out_dir, dict(models), default_split="test", device=device)
    src = setup.responses_from or next((k for k in labels if k in setup.trained), labels[0])
    loaded: dict[str, nn.Module] = {}
    items = _items(ctx, src, loaded, greedy=opts.greedy, dtype=dtype)
    items.check_lengths(getattr(configs[labels[0]], "max_position_embeddings", None))
    results = _measure(ctx, items, labels, configs, sites, loaded, store, cka=opts.cka, dtype=dtype, progress=progress)
    out = Path(out_dir)
    _write_tables(out, ctx, items, labels, results)
    _summary(ctx, items, models, labels, results, sites, src, greedy=opts.greedy, cka=opts.cka, dtype=dtype).save(out)
    return [f"similarity table: {out / CSV_NAME}"] + SimilaritySummary.require(out).lines()


def _measure(
    ctx: ProbeContext,
    items: ProbeItems,
    labels: list[str],
    configs: dict,
    sites: dict[str, list[str]],
    loaded: dict[str, nn.Module],
    store: ActivationStore | None,
    *,
    cka: bool,
    dtype: torch.dtype | None,
    progress: bool,
) -> dict[str, SimilarityResult]:
    """Each compared model's `SimilarityResult`, one model resident at a time (a cache's rows instead of forwards)."""
    results: dict[str, SimilarityResult] = {}
    for label in sorted(labels, key=lambda k: k not in loaded):  # the sampler first: one model resident at a time
        if store is not None:  # the store's rows instead of forwards (same numbers), shard by shard
            acc = CosineAccumulator(sites[label], configs[label].num_hidden_layers, cka)
            store.feed(label, sites[label], "predict_stop", acc.add, ctx.out / "similarity_items.jsonl")
            results[label] = SimilarityResult(acc.site_rows(label), acc.example_rows(label, items.uids))
            continue
        model = loaded.pop(label) if label in loaded else ctx.load(label, dtype)
        results[label] = two_view_cosine(
            model, items, sites[label], cka, label=label, uids=items.uids, progress=progress
        )
        del model
    return results


def _write_tables(
    out: Path, ctx: ProbeContext, items: ProbeItems, labels: list[str], results: dict[str, SimilarityResult]
) -> None:
    """``similarity.csv``, ``similarity_examples.csv`` and ``similarity_responses.jsonl``."""
    rows = [r for label in labels for r in results[label].rows]
    write_rows(rows, out / CSV_NAME)
    write_rows([r for label in labels for r in results[label].example_rows], out / "similarity_examples.csv")
    write_jsonl(
        out / "similarity_responses.jsonl",
        (
            {"uid": ex.uid, "response_ids": r, "response": ctx.tokenizer.decode(r)}
            for ex, r in zip(items.examples, items.responses)
        ),
    )


def _summary(
    ctx: ProbeContext,
    items: ProbeItems,
    models: Mapping[str, str],
    labels: list[str],
    results: dict[str, SimilarityResult],
    sites: dict[str, list[str]],
    src: str,
    *,
    greedy: bool,
    cka: bool,
    dtype: torch.dtype | None,
) -> SimilaritySummary:
    """The `SimilaritySummary` of the results: per decoder layer, their mean, the other sites and the stop token."""
    layer_rows = {
        label: sorted(
            (r for r in results[label].rows if str(r["site"]).endswith("resid_post")), key=lambda r: int(r["layer"])
        )
        for label in labels
    }
    per_layer = {label: [float(r["cos_mean"]) for r in rows] for label, rows in layer_rows.items()}
    mean_cos = {label: float(np.mean(v)) if v else float("nan") for label, v in per_layer.items()}  # decoder layers
    apart = {
        label: {
            r["site"]: float(r["cos_mean"]) for r in results[label].rows if not str(r["site"]).endswith("resid_post")
        }
        for label in labels
    }  # embed, final_norm
    settings = ctx.settings(
        models=dict(models),
        greedy=greedy,
        cka=cka,
        dtype=str(dtype or torch.float32),
        aggregate="cos_mean: per-token mean over the predicting positions; cos_stop: the "
        "state of the response's last token (the stop token), apart",
        files=["similarity.csv", "similarity_examples.csv", "similarity_responses.jsonl", "similarity_items.jsonl"],
    )
    stop = {label: [read_float(r.get("cos_stop")) for r in rows] for label, rows in layer_rows.items()}
    if len({tuple(v) for v in sites.values()}) > 1:  # a cross-model study (a deeper teacher): each model's own sites
        settings["sites_by_model"] = {label: sites[label] for label in labels}
    first = sites[labels[0]]
    return SimilaritySummary(labels, mean_cos, first, src, len(items.examples), settings, per_layer, apart, stop)


register_probe(
    ProbeSpec(
        "similarity",
        "layerwise two-view hidden-state cosine (several models, same items, same responses)",
        run_similarity,
        options=SimilarityOptions,
        order=10,
        outputs=("similarity.csv", "similarity_examples.csv", "similarity_responses.jsonl", "similarity.json"),
        demo={"models": ["base", "opd", "nca"]},
        role_options=("models",),
        reads_teacher=True,  # forward only: the study's teacher, of any depth and width, among the models
        summary=SimilaritySummary,
    )
)
