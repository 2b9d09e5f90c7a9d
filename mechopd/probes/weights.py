"""Streamed safetensors reading for probes over weights (parameter deltas): a checkpoint's tensor index (single file
or sharded ``model.safetensors.index.json``), its embedding tying, a layout check between checkpoints, and a reader
that copies one window of rows at a time out of the file mapping (never a whole model in memory).

Tensors are read as canonical views (`mechopd.models.arch.ParamView`): a fused ``qkv_proj`` / ``c_attn`` /
``query_key_value`` / ``gate_up_proj`` is read as its q / k / v (gate / up) rows, a Conv1D weight as its transpose,
every name in Llama's words (``model.layers.0.self_attn.q_proj.weight``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open

from mechopd.core.errors import ModelError
from mechopd.models.arch import ParamView
from mechopd.models.lora import AdapterDeltas, adapter_dir, check_base

if TYPE_CHECKING:
    from mechopd.models.lora import AdapterDeltas  # the run-time import stays lazy (in `reader_for`)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


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
        raise ModelError(
            f"{d} holds PyTorch .bin/.pt weights but no safetensors; load it and re-save it with "
            f"save_pretrained(dir, safe_serialization=True)"
        )
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
    """A checkpoint's tensor index: ``files`` stored name -> file, ``views`` canonical name -> view (fused tensors
    split; the head of a tied checkpoint omitted, ``embed`` names the shared view)."""

    path: Path
    files: dict[str, Path]
    tied: bool
    embed: str | None
    views: dict[str, ParamView]

    def file_of(self, name: str) -> Path:
        return self.files[self.views[name].raw]


def _config_tied(d: Path) -> bool | None:
    """config.json's tie_word_embeddings (top level, else text_config); None without config.json or the key."""
    try:
        cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    except json.JSONDecodeError as err:
        raise ModelError(f"{d / 'config.json'} is not valid JSON ({err}); fix or re-save the checkpoint") from None
    scopes = [c for c in (cfg, cfg.get("text_config") or {}) if "tie_word_embeddings" in c]
    return bool(scopes[0]["tie_word_embeddings"]) if scopes else None


def stored_shapes(files: Mapping[str, Path]) -> dict[str, tuple[int, ...]]:
    """Shapes of the stored tensors from the safetensors headers only (no data read)."""
    shapes = {}
    for file in sorted(set(files.values())):
        with _open(file) as f:
            shapes.update({n: tuple(f.get_slice(n).get_shape()) for n in f.keys() if files.get(n) == file})
    return shapes


def tensor_shapes(ckpt: Checkpoint) -> dict[str, tuple[int, ...]]:
    """Shapes of the canonical views (headers only)."""
    return {name: v.shape for name, v in ckpt.views.items()}


def check_same_layout(a: Checkpoint, b: Checkpoint, shapes_a: Mapping, shapes_b: Mapping) -> None:
    """Same tensor names, shapes and embedding tying, or a ModelError naming the first offending tensor."""
    if a.tied != b.tied:
        tied, untied = (a, b) if a.tied else (b, a)
        raise ModelError(
            f"tensor 'lm_head.weight': {tied.path} ties it to the embeddings but {untied.path} does not; "
            f"compare checkpoints with the same tie_word_embeddings"
        )
    for x, y in ((a, b), (b, a)):
        missing = sorted(set(x.views) - set(y.views))
        if missing:
            raise ModelError(
                f"tensor {missing[0]!r} is in {x.path} but not in {y.path}; compare checkpoints of one architecture"
            )
    for name in sorted(a.views):
        if shapes_a[name] != shapes_b[name]:
            raise ModelError(
                f"tensor {name!r} has shape {list(shapes_a[name])} in {a.path} but "
                f"{list(shapes_b[name])} in {b.path}; compare checkpoints of one architecture and size"
            )


class _Reader:
    """One checkpoint, read window by window through ``safe_open`` into two reused staging buffers (one being computed
    on while the other fills). One file is mapped at a time and re-opened once ``budget`` bytes went through it, so
    that the pages it touched leave this process's RSS."""

    def __init__(self, ckpt: Checkpoint, window_numel: int):  # staging pages are only touched as used
        self.ckpt, self.budget = ckpt, 4 * window_numel
        self._staging = [torch.empty(4 * window_numel, dtype=torch.uint8) for _ in range(2)]  # <= 4-byte dtypes
        self._stack, self._read = ExitStack(), 0
        self._file: Path | None = None  # the file mapped now, and its handle (both None when closed)
        self._handle: safe_open | None = None

    def read(self, name: str, start: int, stop: int, slot: int) -> torch.Tensor:
        """Rows [start, stop) along dim 0 of view ``name`` (`Checkpoint.views`), flattened: [(stop - start) *
        row_numel] ([1] if 0-d), in the stored dtype; valid until staging buffer ``slot`` (0 or 1) is read into
        again."""
        v = self.ckpt.views[name]
        file = self.ckpt.files[v.raw]
        if file != self._file or self._handle is None:
            self.close()
            self._handle, self._file = self._stack.enter_context(_open(file)), file
        handle = self._handle
        piece = handle.get_slice(v.raw)
        if not piece.get_shape():
            view = handle.get_tensor(v.raw).reshape(-1)
        elif v.transposed:  # Conv1D [in, out]: the view's rows are columns
            view = torch.cat([piece[:, a:b].T for a, b in v.window(start, stop)]).reshape(-1)
        else:
            view = torch.cat([piece[a:b] for a, b in v.window(start, stop)]).reshape(-1)  # lazy when one span
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


class _AdapterReader:
    """A LoRA checkpoint (`mechopd.models.lora`: merged weights + ``adapter/``) read as W0 + ΔW: for every tensor the adapter
    covers, the base's window plus ΔW = (α / r) B A rows [start, stop) from the adapter (float64; the merged weights
    are not read, so the update is the adapter's exactly), every other tensor from the checkpoint itself."""

    def __init__(self, ckpt: Checkpoint, base: Checkpoint, adapter: AdapterDeltas, window_numel: int):
        self.own, self.base, self.adapter = _Reader(ckpt, window_numel), _Reader(base, window_numel), adapter

    def read(self, name: str, start: int, stop: int, slot: int) -> torch.Tensor:
        v = self.own.ckpt.views[name]
        if v.raw not in self.adapter.pairs:
            return self.own.read(name, start, stop, slot)
        a, b = self.adapter.pairs[v.raw]  # B: [out, r] in the view's output order (Conv1D: peft's fan_in_fan_out)
        rows = torch.cat([b[lo:hi] for lo, hi in v.window(start, stop)])
        w0 = self.base.read(name, start, stop, slot).double()
        return w0 + (rows.double() @ a.double()).reshape(-1) * self.adapter.scale

    def close(self) -> None:
        self.own.close()
        self.base.close()


def _raw_shapes(base: Checkpoint) -> dict[str, tuple[int, ...]]:
    """Stored parameter name -> its [out, in] shape (a Conv1D weight, stored [in, out], turned around): the shape a
    LoRA ΔW = B A of that parameter must have, whole (a fused ``qkv_proj`` / ``gate_up_proj`` is adapted whole)."""
    stored = stored_shapes(base.files)
    return {v.raw: tuple(reversed(stored[v.raw])) if v.transposed else stored[v.raw] for v in base.views.values()}


def reader_for(
    ckpt: Checkpoint, base: Checkpoint, window_numel: int, shapes: Mapping[str, tuple[int, ...]] | None = None
) -> _Reader | _AdapterReader:
    """`_AdapterReader` for a checkpoint with a LoRA adapter beside its weights, else `_Reader`. With ``shapes`` (the
    base's tensor shapes), every ΔW = B A must have its weight's shape (else one ModelError: shapes win)."""
    found = adapter_dir(ckpt.path)
    if found is None:
        return _Reader(ckpt, window_numel)
    adapter = AdapterDeltas(found)
    check_base(found, base.path)  # the W0 it is added to is the one it was trained on
    known = _raw_shapes(base) if shapes is not None else {}  # the adapter names stored (fused, Conv1D) parameters
    for name, (a, b) in adapter.pairs.items() if shapes is not None else ():
        if tuple(known.get(name, ())) != (b.shape[0], a.shape[1]):
            raise ModelError(
                f"{found}: its ΔW for {name} is {b.shape[0]} x {a.shape[1]}, the weight is "
                f"{'absent' if name not in known else ' x '.join(map(str, known[name]))}; this adapter belongs to "
                "another model: pass its own checkpoint"
            )
    return _AdapterReader(ckpt, base, adapter, window_numel)
