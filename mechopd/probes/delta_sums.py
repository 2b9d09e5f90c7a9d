"""The parameter-delta probe's arithmetic (`mechopd.probes.deltas`, whose docstring has the math): checkpoints opened
with tied embeddings resolved, squared norms streamed window by window (``parameter_deltas``), and the tidy rows made
from sums of squares and inner products (``aggregate_deltas`` sums squares again, never norms).

Per tensor, with R = M + 1 (+ 1 with a pair) rows X = [W0, Δ_1 .. Δ_M, (θ_b - θ_a)]:

    sums = [‖W0‖², ‖Δ_1‖² .. ‖Δ_M‖², (‖θ_b - θ_a‖²)]      ⟨Δ_a, Δ_b⟩ = (‖Δ_a‖² + ‖Δ_b‖² - ‖Δ_b - Δ_a‖²) / 2
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.model_checks import read_config
from mechopd.core.sites import Site, site_of
from mechopd.core.sites import natural_key as _natural_key
from mechopd.models.arch import param_views
from mechopd.probes.delta_rows import DeltaRow
from mechopd.probes.setup import BASE
from mechopd.probes.weights import (
    Checkpoint,
    _AdapterReader,
    _config_tied,
    _Reader,
    check_same_layout,
    checkpoint_tensors,
    reader_for,
    stored_shapes,
    tensor_shapes,
)

AGGREGATE_BY = ("site", "layer", "module", "all")


# ------------------------------------------------------------------------------------------------------ checkpoints
def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Index a checkpoint dir as canonical views (`mechopd.models.arch.param_views`: fused projections split, every
    family's names in Llama's words) and resolve tied embeddings (config.json ``tie_word_embeddings``, else no
    lm_head)."""
    files = checkpoint_tensors(path)
    views = param_views(stored_shapes(files), LazyConfig(path, read_config))
    embed = next((n for n in views if site_of(n)[1:] == (None, "embed_tokens", "weight")), None)
    tied = _config_tied(Path(path))
    if tied is None:
        tied = not any(site_of(n).site == "lm_head" for n in views)
    if tied and embed is not None:  # a head stored next to tied embeddings duplicates them: transformers ties on load
        views = {n: v for n, v in views.items() if site_of(n).site != "lm_head"}
    return Checkpoint(Path(path), files, bool(tied and embed is not None), embed, views)


class LazyConfig:
    """A checkpoint's config, read on first use (only fused projections need the head counts)."""

    def __init__(self, path: str | os.PathLike, read) -> None:
        self._path, self._read, self._config = path, read, None

    def __getattr__(self, key: str):
        if key.startswith("_"):
            raise AttributeError(key)
        if self._config is None:
            self._config = self._read(self._path)
        return getattr(self._config, key)


# ------------------------------------------------------------------------------------------------------- streaming
@dataclass
class _Sums:
    """Squared Frobenius norms and inner products of one tensor or a group of tensors (float64)."""

    numel: int = 0
    w0: float = 0.0  # ‖W0‖²
    sq: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, vs) -> ‖θ_model - θ_vs‖²
    dot: dict[tuple[str, str], float] = field(default_factory=dict)  # (b, a) -> ⟨Δ_b, Δ_a⟩


def _accumulate(acc: torch.Tensor, views: list[torch.Tensor], pair: tuple[int, int] | None, buf: torch.Tensor) -> None:
    """acc += [‖W0‖², ‖Δ_1‖² .. ‖Δ_M‖², (‖θ_b - θ_a‖²)] over one window.

    acc: [R] float64; views: M + 1 tensors [n] (base first, stored dtype); buf: [R, chunk] compute dtype, R = M + 1
    (+ 1 with a pair). Chunk by chunk, so that the rows of X = buf stay in cache: upcast, subtract, one norm per row.
    """
    m, chunk = len(views) - 1, buf.shape[1]
    for pieces in zip(*(v.split(chunk) for v in views)):
        x = buf[:, : pieces[0].numel()]  # [R, k]
        for j, p in enumerate(pieces):
            x[j].copy_(p)  # upcast the stored dtype
        x[1 : m + 1].sub_(x[0])  # Δ_i = θ_i - W0
        if pair is not None:
            torch.sub(x[pair[1]], x[pair[0]], out=x[m + 1])  # θ_b - θ_a
        norms = torch.linalg.vector_norm(x, dim=1)  # [R]
        acc.addcmul_(norms, norms)


def _stream_sums(
    readers: list[_Reader | _AdapterReader],
    names: list[str],
    shapes: Mapping,
    pair: tuple[int, int] | None,
    dtype: torch.dtype,
    window_numel: int,
    chunk_numel: int,
    bar,
) -> dict[str, torch.Tensor]:
    """Per tensor name, the accumulator of ``_accumulate``. A helper thread reads window i + 1 (page faults, copy)
    while this one computes on window i, single-threaded: elementwise work on cache-sized chunks gains nothing
    from intra-op threads and stalls badly when the cores are shared."""
    n_rows = len(readers) + (pair is not None)
    buf = torch.empty(n_rows, max(1, chunk_numel), dtype=dtype)
    acc = {name: torch.zeros(n_rows, dtype=torch.float64) for name in names}
    windows = []  # (name, start, stop): rows along dim 0, at most window_numel elements or one row (0-d: one row)
    for name in names:
        n, row = (shapes[name][0], math.prod(shapes[name][1:])) if shapes[name] else (1, 1)
        step = max(1, window_numel // max(1, row))
        windows += [(name, start, min(n, start + step)) for start in range(0, n, step)]

    def load(i: int) -> list[torch.Tensor]:
        return [r.read(*windows[i], slot=i % 2) for r in readers]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="mechopd-deltas-read") as pool:
            pending = [pool.submit(load, 0)] if windows else []
            for i, (name, _, _) in enumerate(windows):
                views = pending.pop().result()
                if i + 1 < len(windows):  # fills the other staging slot
                    pending.append(pool.submit(load, i + 1))
                _accumulate(acc[name], views, pair, buf)
                bar.update(views[0].numel())
                del views
    finally:
        torch.set_num_threads(threads)
    return acc


def _acc_sums(acc: torch.Tensor, numel: int, labels: list[str], pair: tuple[str, str] | None) -> _Sums:
    """Sums of one tensor; ⟨Δ_a, Δ_b⟩ = (‖Δ_a‖² + ‖Δ_b‖² - ‖Δ_b - Δ_a‖²) / 2."""
    v = acc.tolist()
    sums = _Sums(numel, v[0], {(label, BASE): v[i] for i, label in enumerate(labels, start=1)})
    if pair is not None:
        a, b = (1 + labels.index(p) for p in pair)
        sums.sq[(pair[1], pair[0])] = v[-1]
        sums.dot[(pair[1], pair[0])] = (v[a] + v[b] - v[-1]) / 2
    return sums


def parameter_deltas(
    base_dir: str | os.PathLike,
    models: Mapping[str, str | os.PathLike],
    pair: tuple[str, str] | None = None,
    *,
    dtype: torch.dtype = torch.float64,
    window_numel: int = 1 << 23,
    chunk_numel: int = 1 << 17,
    progress: bool = True,
) -> list[DeltaRow]:
    """Per-tensor update norms of each model in ``models`` (label -> checkpoint dir) against ``base_dir``.

    Returns tidy rows (see the module docstring), tensors in forward order. ``pair=(a, b)`` adds the rows model=b,
    vs=a: ‖θ_b - θ_a‖_F, its ratio to ‖W0‖_F, and cos(Δ_a, Δ_b). ``dtype`` is the elementwise dtype (float64: exact
    differences of float32/bf16 weights; float32: faster, ~1e-5 relative); per-chunk norms are summed in float64.
    Memory: at most ~16 x window_numel bytes per checkpoint (staging + mapped pages), whatever the model size.
    """
    labels = _check_labels(models, pair)
    if dtype not in (torch.float64, torch.float32):
        raise ConfigError(f"dtype {dtype} is not supported for parameter deltas; use torch.float64 or torch.float32")
    base = open_checkpoint(base_dir)
    ckpts = [open_checkpoint(models[label]) for label in labels]
    shapes = tensor_shapes(base)
    for ckpt in ckpts:
        check_same_layout(base, ckpt, shapes, tensor_shapes(ckpt))
    readers = [_Reader(base, window_numel)] + [
        reader_for(c, base, window_numel, shapes) for c in ckpts
    ]  # LoRA: ΔW = BA
    pair_rows = None if pair is None else (1 + labels.index(pair[0]), 1 + labels.index(pair[1]))
    names = sorted(base.views, key=lambda n: (str(base.file_of(n)), n))  # file by file
    numel = {n: math.prod(shapes[n]) for n in names}
    bar = tqdm(total=sum(numel.values()), unit="param", unit_scale=True, desc="deltas", disable=not progress)
    try:
        acc = _stream_sums(readers, names, shapes, pair_rows, dtype, window_numel, chunk_numel, bar)
    finally:
        bar.close()
        for r in readers:
            r.close()
    _check_finite(acc, [base, *ckpts])
    return _tensor_rows({n: _acc_sums(acc[n], numel[n], labels, pair) for n in names}, base)


def _check_finite(acc: Mapping[str, torch.Tensor], ckpts: list[Checkpoint]) -> None:
    """Sums of squares are finite iff the streamed values were: a NaN/inf weight names its checkpoint and tensor
    (acc rows: [‖W0‖², ‖Δ_1‖², ...]; a bad base spoils every row, so row 0 is looked at first)."""
    for name, row in acc.items():
        bad = [i for i in range(len(ckpts)) if not math.isfinite(float(row[i]))]
        if bad:
            ckpt = ckpts[bad[0]]
            raise ModelError(
                f"{ckpt.file_of(name) if name in ckpt.views else ckpt.path}: tensor {name!r} holds NaN/inf values; the weights "
                "are corrupted (a diverged run or a damaged copy); use an earlier checkpoint"
            )


def _check_labels(models: Mapping[str, object], pair: tuple[str, str] | None) -> list[str]:
    if not models:
        raise ConfigError("models is empty; pass at least one label=DIR (e.g. opd=runs/opd/final)")
    for label in models:
        if not isinstance(label, str) or not label.strip() or label == BASE:
            raise ConfigError(f"model label {label!r} is empty or reserved ({BASE!r} names W0); pick another label")
    if pair is not None and (len(pair) != 2 or pair[0] == pair[1] or any(p not in models for p in pair)):
        raise ConfigError(f"pair {tuple(pair)} must name two different model labels out of {', '.join(models)}")
    return list(models)


# ------------------------------------------------------------------------------------------------------------ rows
def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else (math.nan if num == 0 else math.inf)


def _sum_rows(s: _Sums, site: Site, tied_to: str = "") -> list[DeltaRow]:
    """Metric rows of one tensor / group from its sums (norms = sqrt of squared sums)."""

    def row(model: str, vs: str, metric: str, value: float) -> DeltaRow:
        return DeltaRow(model, vs, site.site, site.layer, site.module, site.param, s.numel, tied_to, metric, value)

    w0 = math.sqrt(s.w0)
    out = [row(BASE, "", "w0_norm", w0)]
    for (model, vs), sq in s.sq.items():
        d = math.sqrt(max(sq, 0.0))
        out += [row(model, vs, "delta_norm", d), row(model, vs, "rel_delta", _ratio(d, w0))]
        if (model, vs) in s.dot:
            den = math.sqrt(s.sq[(model, BASE)] * s.sq[(vs, BASE)])
            out.append(row(model, vs, "cos", s.dot[(model, vs)] / den if den > 0 else math.nan))
    return out


def _tensor_rows(sums: dict[str, _Sums], base: Checkpoint) -> list[DeltaRow]:
    rows = []
    for name in sorted(sums, key=lambda n: _natural_key(site_of(n))):
        rows += _sum_rows(sums[name], site_of(name))
    if base.tied:
        if base.embed is None:  # open_checkpoint marks a checkpoint tied only when it has the embedding
            raise ModelError(f"{base.path} is marked tied but has no embed_tokens weight; re-save the checkpoint")
        rows += _sum_rows(sums[base.embed], Site("lm_head", None, "lm_head", "weight"), tied_to="embed_tokens")
    return rows


def _group_site(row: DeltaRow, by: str) -> Site:
    if by == "all":
        return Site("*", None, "*", "*")
    if by == "layer" and row.layer is not None:
        return Site(f"layers.{row.layer}", row.layer, "*", "*")
    if by == "module" and row.layer is not None:
        return Site("layers.*." + row.site.split(".", 2)[2], None, row.module, "*")
    return Site(row.site, row.layer, row.module, "*")


def aggregate_deltas(rows: Iterable[DeltaRow], by: str = "site") -> list[DeltaRow]:
    """Combine per-tensor rows by summing squares and inner products, then taking norms and ratios again.

    by: "site" (weight + bias of each module: the layer x module heatmap), "layer" (all modules of a layer),
    "module" (one module type over all layers: ``layers.*.self_attn.q_proj``), "all" (one global row per model).
    Rows with ``tied_to`` set are skipped (their tensor is counted under ``embed``). Needs per-tensor rows
    (param != "*"), as parameter_deltas returns them.
    """
    if by not in AGGREGATE_BY:
        raise ConfigError(f"aggregate by {by!r} is not one of {', '.join(AGGREGATE_BY)}")
    rows = [r for r in rows if not r.tied_to]
    if any(r.param == "*" for r in rows):
        raise ConfigError("rows are already aggregated (param '*'); aggregate the per-tensor rows")
    norm = {(r.site, r.param, r.model): r.value for r in rows if r.metric == "delta_norm" and r.vs == BASE}
    groups: dict[Site, _Sums] = {}
    for r in rows:
        s = groups.setdefault(_group_site(r, by), _Sums())
        if r.metric == "w0_norm":
            s.numel += r.numel
            s.w0 += r.value**2
        elif r.metric == "delta_norm":
            s.sq[(r.model, r.vs)] = s.sq.get((r.model, r.vs), 0.0) + r.value**2
        elif r.metric == "cos":  # ⟨Δ_b, Δ_a⟩ = cos ‖Δ_b‖ ‖Δ_a‖ (0 where an update is 0)
            na, nb = norm.get((r.site, r.param, r.model)), norm.get((r.site, r.param, r.vs))
            if na is None or nb is None:
                raise ConfigError(
                    f"cos rows at {r.site} need the delta_norm rows of {r.model} and {r.vs} vs base; "
                    f"aggregate the whole table"
                )
            dot = r.value * na * nb if na > 0 and nb > 0 else 0.0
            s.dot[(r.model, r.vs)] = s.dot.get((r.model, r.vs), 0.0) + dot
    out = []
    for site in sorted(groups, key=_natural_key):
        out += _sum_rows(groups[site], site)
    return out
