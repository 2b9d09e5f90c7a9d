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
  * Streaming: every checkpoint is read through ``safe_open`` one window of rows at a time, never two whole models.
    A helper thread copies window i + 1 of every checkpoint out of the file mappings into reused staging buffers
    while the caller's thread computes on window i; a checkpoint's file is re-opened once 4 x window_numel bytes went
    through it, so that the pages it touched leave this process's RSS. The arithmetic runs in cache-sized chunks of
    X = [W0, Δ_1 .. Δ_M, (θ_b - θ_a)] ([R, chunk], float64 by default), one norm per row, summed in float64;
    ⟨Δ_a, Δ_b⟩ comes from ‖Δ_a‖², ‖Δ_b‖², ‖Δ_b - Δ_a‖² (absolute error of cos ~ machine epsilon).
  * Tied embeddings: a checkpoint is tied when config.json says ``tie_word_embeddings`` (else: when it has no
    lm_head tensor). A tied head is not read (a copy stored next to the embedding is dropped, as transformers ties it
    on load); the table repeats the embedding's values on ``lm_head`` rows with ``tied_to="embed_tokens"``, and
    aggregates skip those rows. A tied and an untied checkpoint in one comparison is an error naming lm_head.weight.
  * Sites follow mechopd.models: ``layers.{i}.self_attn.q_proj`` (layer i, module ``q_proj``), ``embed``,
    ``final_norm``, ``lm_head`` (layer None; modules ``embed_tokens``, ``norm``, ``lm_head``). A bias shares its
    module's site with ``param="bias"``; site aggregates combine weight and bias.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from mechopd.errors import ConfigError, DataError, ModelError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
BASE = "base"
WRAPPERS = ("model", "language_model", "base_model", "transformer")  # leading path parts dropped from sites
SITE_ALIASES = {"embed_tokens": "embed", "norm": "final_norm", "lm_head": "lm_head"}  # as models.module_at
MODULE_ORDER = ("input_layernorm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "o_proj",
                "post_attention_layernorm", "gate_proj", "up_proj", "down_proj")  # forward order, for tables/plots
METRICS = ("w0_norm", "delta_norm", "rel_delta", "cos")
AGGREGATE_BY = ("site", "layer", "module", "all")


# ----------------------------------------------------------------------------------------------------- site naming
class Site(NamedTuple):
    """Where a parameter lives: ``site`` (probe address), ``layer`` (None outside layers), ``module``, ``param``."""

    site: str
    layer: int | None
    module: str
    param: str


def site_of(param_name: str) -> Site:
    """``model.layers.3.self_attn.q_proj.bias`` -> Site("layers.3.self_attn.q_proj", 3, "q_proj", "bias").

    Leading wrappers (``model.``, ``language_model.``, ``base_model.``, ``transformer.``) are dropped; the last part is
    the parameter (``weight`` / ``bias``); ``embed_tokens`` / final ``norm`` / ``lm_head`` map to the sites ``embed`` /
    ``final_norm`` / ``lm_head``. Other names keep their path as site, with layer None.
    """
    parts = param_name.split(".")
    param = parts.pop() if len(parts) > 1 else ""
    while len(parts) > 1 and parts[0] in WRAPPERS:
        parts.pop(0)
    path = ".".join(parts)
    if len(parts) >= 3 and parts[0] == "layers" and parts[1].isdigit():
        return Site(path, int(parts[1]), parts[-1], param)
    if path in SITE_ALIASES:
        return Site(SITE_ALIASES[path], None, path, param)
    return Site(path, None, parts[-1], param)


def _natural_key(site: Site) -> tuple:
    """Embedding, decoder layers in forward order, other tensors, final norm, lm_head."""
    group = {"embed": 0, "final_norm": 3, "lm_head": 4}.get(site.site, 1 if site.layer is not None else 2)
    rank = MODULE_ORDER.index(site.module) if site.module in MODULE_ORDER else len(MODULE_ORDER)
    return (group, site.layer if site.layer is not None else -1, rank, site.site, site.param)


# ------------------------------------------------------------------------------------------------------ checkpoints
def checkpoint_tensors(path: str | os.PathLike) -> dict[str, Path]:
    """Tensor name -> safetensors file of a HF checkpoint dir: ``model.safetensors`` or a sharded
    ``model.safetensors.index.json`` (its ``weight_map``)."""
    d = Path(path)
    if not d.is_dir():
        raise ModelError(f"checkpoint directory {d} does not exist; pass a directory written by save_pretrained")
    if (d / SINGLE_FILE).is_file():
        with _open(d / SINGLE_FILE) as f:
            return {name: d / SINGLE_FILE for name in f.keys()}
    if (d / INDEX_FILE).is_file():
        return _sharded_index(d / INDEX_FILE)
    if any(d.glob("*.bin")) or any(d.glob("*.pt")):
        raise ModelError(f"{d} holds PyTorch .bin/.pt weights but no safetensors; load it and re-save it with "
                         f"save_pretrained(dir, safe_serialization=True)")
    raise ModelError(f"{d} has no {SINGLE_FILE} or {INDEX_FILE}; pass a checkpoint saved with save_pretrained")


def _open(file: Path) -> safe_open:
    try:
        return safe_open(file, framework="pt")
    except (SafetensorError, OSError) as err:
        raise ModelError(f"cannot read {file} as safetensors ({err}); re-save it with save_pretrained") from None


def _sharded_index(index: Path) -> dict[str, Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        items = list(weight_map.items())
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise ModelError(f"{index} is not a safetensors index (no 'weight_map'); re-save the checkpoint") from None
    files = {}
    for name, shard in items:
        file = index.parent / shard
        if not file.is_file():
            raise ModelError(f"shard {file} (tensor {name!r} in {index}) is missing; copy the whole checkpoint dir")
        files[name] = file
    return files


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's tensor index. ``files`` omits the head of a tied checkpoint (``embed`` names the shared one)."""

    path: Path
    files: dict[str, Path]
    tied: bool
    embed: str | None


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Index a checkpoint dir and resolve tied embeddings (config.json ``tie_word_embeddings``, else no lm_head)."""
    files = checkpoint_tensors(path)
    embed = next((n for n in files if site_of(n)[1:] == (None, "embed_tokens", "weight")), None)
    tied = _config_tied(Path(path))
    if tied is None:
        tied = not any(site_of(n).site == "lm_head" for n in files)
    if tied and embed is not None:  # a head stored next to tied embeddings duplicates them: transformers ties on load
        files = {n: f for n, f in files.items() if site_of(n).site != "lm_head"}
    return Checkpoint(Path(path), files, bool(tied and embed is not None), embed)


def _config_tied(d: Path) -> bool | None:
    """config.json's tie_word_embeddings (top level, else text_config); None without config.json or the key."""
    try:
        cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    except json.JSONDecodeError as err:
        raise ModelError(f"{d / 'config.json'} is not valid JSON ({err}); fix or re-save the checkpoint") from None
    scopes = [c for c in (cfg, cfg.get("text_config") or {}) if "tie_word_embeddings" in c]
    return bool(scopes[0]["tie_word_embeddings"]) if scopes else None


def tensor_shapes(ckpt: Checkpoint) -> dict[str, tuple[int, ...]]:
    """Shapes from the safetensors headers only (no data read)."""
    shapes = {}
    for file in sorted(set(ckpt.files.values())):
        with _open(file) as f:
            shapes.update({n: tuple(f.get_slice(n).get_shape()) for n in f.keys() if ckpt.files.get(n) == file})
    return shapes


def check_same_layout(a: Checkpoint, b: Checkpoint, shapes_a: Mapping, shapes_b: Mapping) -> None:
    """Same tensor names, shapes and embedding tying, or a ModelError naming the first offending tensor."""
    if a.tied != b.tied:
        tied, untied = (a, b) if a.tied else (b, a)
        raise ModelError(f"tensor 'lm_head.weight': {tied.path} ties it to the embeddings but {untied.path} does not; "
                         f"compare checkpoints with the same tie_word_embeddings")
    for x, y in ((a, b), (b, a)):
        missing = sorted(set(x.files) - set(y.files))
        if missing:
            raise ModelError(f"tensor {missing[0]!r} is in {x.path} but not in {y.path}; "
                             f"compare checkpoints of one architecture")
    for name in sorted(a.files):
        if shapes_a[name] != shapes_b[name]:
            raise ModelError(f"tensor {name!r} has shape {list(shapes_a[name])} in {a.path} but "
                             f"{list(shapes_b[name])} in {b.path}; compare checkpoints of one architecture and size")


class _Reader:
    """One checkpoint, read window by window through ``safe_open`` into two reused staging buffers (one being computed
    on while the other fills). One file is mapped at a time and re-opened once ``budget`` bytes went through it, so
    that the pages it touched leave this process's RSS."""

    def __init__(self, ckpt: Checkpoint, window_numel: int):  # staging pages are only touched as used
        self.ckpt, self.budget = ckpt, 4 * window_numel
        self._staging = [torch.empty(4 * window_numel, dtype=torch.uint8) for _ in range(2)]  # <= 4-byte dtypes
        self._stack, self._file, self._handle, self._read = ExitStack(), None, None, 0

    def read(self, name: str, start: int, stop: int, slot: int) -> torch.Tensor:
        """Rows [start, stop) along dim 0 of tensor ``name``, flattened: [(stop - start) * row_numel] ([1] if 0-d),
        in the stored dtype; valid until staging buffer ``slot`` (0 or 1) is read into again."""
        file = self.ckpt.files[name]
        if file != self._file:
            self.close()
            self._handle, self._file = self._stack.enter_context(_open(file)), file
        piece = self._handle.get_slice(name)
        view = (piece[start:stop] if piece.get_shape() else self._handle.get_tensor(name)).reshape(-1)  # lazy
        nbytes, stage = view.numel() * view.element_size(), self._staging[slot]
        out = stage[:nbytes].view(view.dtype).copy_(view) if nbytes <= stage.numel() else view.clone()
        del view, piece
        self._read += nbytes
        if self._read >= self.budget:
            self.close()
        return out

    def close(self) -> None:
        self._stack.close()
        self._stack, self._file, self._handle, self._read = ExitStack(), None, None, 0


# ------------------------------------------------------------------------------------------------------- streaming
@dataclass
class _Sums:
    """Squared Frobenius norms and inner products of one tensor or a group of tensors (float64)."""

    numel: int = 0
    w0: float = 0.0  # ‖W0‖²
    sq: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, vs) -> ‖θ_model - θ_vs‖²
    dot: dict[tuple[str, str], float] = field(default_factory=dict)  # (b, a) -> ⟨Δ_b, Δ_a⟩


def _accumulate(acc: torch.Tensor, views: list[torch.Tensor], pair: tuple[int, int] | None,
                buf: torch.Tensor) -> None:
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


def _stream_sums(readers: list[_Reader], names: list[str], shapes: Mapping, pair: tuple[int, int] | None,
                 dtype: torch.dtype, window_numel: int, chunk_numel: int, bar) -> dict[str, torch.Tensor]:
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
            nxt = pool.submit(load, 0) if windows else None
            for i, (name, _, _) in enumerate(windows):
                views = nxt.result()
                nxt = pool.submit(load, i + 1) if i + 1 < len(windows) else None  # fills the other staging slot
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


def parameter_deltas(base_dir: str | os.PathLike, models: Mapping[str, str | os.PathLike],
                     pair: tuple[str, str] | None = None, *, dtype: torch.dtype = torch.float64,
                     window_numel: int = 1 << 23, chunk_numel: int = 1 << 17,
                     progress: bool = True) -> list[DeltaRow]:
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
    readers = [_Reader(c, window_numel) for c in (base, *ckpts)]
    pair_rows = None if pair is None else (1 + labels.index(pair[0]), 1 + labels.index(pair[1]))
    names = sorted(base.files, key=lambda n: (str(base.files[n]), n))  # file by file
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
            raise ModelError(f"{ckpt.files.get(name, ckpt.path)}: tensor {name!r} holds NaN/inf values; the weights "
                             "are corrupted (a diverged run or a damaged copy); use an earlier checkpoint")


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
@dataclass(frozen=True)
class DeltaRow:
    """One value of the parameter-delta table. ``model``: a label, "base" on w0_norm rows; ``vs``: "base" (update
    from W0), a label (pair rows), "" (w0_norm); ``site``: a probe address, in aggregates also ``layers.3``,
    ``layers.*.self_attn.q_proj``, ``*``; ``layer``: None outside decoder layers; ``module``: ``q_proj``,
    ``embed_tokens``, ... ("*" for many); ``param``: ``weight`` / ``bias`` ("*" aggregated); ``numel``: parameters
    covered; ``tied_to``: "embed_tokens" on lm_head rows of tied checkpoints, else ""; ``metric``: one of METRICS;
    ``value``: NaN where undefined (cos of a zero update, ratio 0/0)."""

    model: str
    vs: str
    site: str
    layer: int | None
    module: str
    param: str
    numel: int
    tied_to: str
    metric: str
    value: float


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
                raise ConfigError(f"cos rows at {r.site} need the delta_norm rows of {r.model} and {r.vs} vs base; "
                                  f"aggregate the whole table")
            dot = r.value * na * nb if na > 0 and nb > 0 else 0.0
            s.dot[(r.model, r.vs)] = s.dot.get((r.model, r.vs), 0.0) + dot
    out = []
    for site in sorted(groups, key=_natural_key):
        out += _sum_rows(groups[site], site)
    return out


# -------------------------------------------------------------------------------------------------------------- io
def write_table(rows: Iterable[DeltaRow], path: str | os.PathLike) -> list[Path]:
    """Write ``<path>.csv`` and ``<path>.json`` atomically (a suffix on ``path`` is replaced); returns both paths.

    CSV: a header line, layer empty when None, floats as repr (nan, inf). JSON: a list of objects, NaN as null and
    ±inf as the strings "inf" / "-inf", so that strict JSON readers accept it.
    """
    rows, stem = list(rows), Path(path).with_suffix("")
    cols = [f.name for f in fields(DeltaRow)]

    def cell(v: object) -> object:
        return "" if v is None else repr(v) if isinstance(v, float) else v

    def write_csv(fh) -> None:
        csv.writer(fh, lineterminator="\n").writerows([cols] + [[cell(getattr(r, c)) for c in cols] for r in rows])

    def write_json(fh) -> None:
        json.dump([{**asdict(r), "value": _json_number(r.value)} for r in rows], fh, indent=0)

    targets = ((".csv", write_csv), (".json", write_json))
    return [_atomic_write(stem.with_name(stem.name + sfx), writer) for sfx, writer in targets]


def _json_number(x: float) -> float | str | None:
    return None if math.isnan(x) else repr(x) if math.isinf(x) else x


def _atomic_write(target: Path, writer) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            writer(fh)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_table(path: str | os.PathLike) -> list[DeltaRow]:
    """Read a table written by ``write_table`` (``.csv`` or ``.json``)."""
    p = Path(path)
    try:
        if p.suffix == ".json":
            records = json.loads(p.read_text())
        else:
            with p.open(newline="") as fh:
                records = list(csv.DictReader(fh))
        return [DeltaRow(**{**{k: str(rec[k]) for k in ("model", "vs", "site", "module", "param", "tied_to", "metric")},
                            "layer": None if rec["layer"] in (None, "") else int(rec["layer"]),
                            "numel": int(rec["numel"]),
                            "value": math.nan if rec["value"] is None else float(rec["value"])}) for rec in records]
    except FileNotFoundError:
        raise DataError(f"table {p} does not exist; write it with mechopd probe deltas") from None
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        raise DataError(f"{p} is not a parameter-delta table ({err!r}); rewrite it with write_table") from None
