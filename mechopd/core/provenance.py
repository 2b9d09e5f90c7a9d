"""What a run was made from, by content: a file's or a directory's sha256 and its resolved path.

A finished run is reused only when it was made from the same things: `mechopd run` records the study's inputs (its
student and teacher directories, the data and context files its options name) before its first job, and a rerun
compares the content hashes, not the names (``student: ./base`` is another model when run from another folder).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CHUNK = 1 << 23  # 8 MiB reads


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def weight_hashes(path: str | os.PathLike) -> dict[str, str]:
    """``{file name: sha256}`` of a checkpoint dir's weight files (``*.safetensors``) and its config.json: what an
    activation store and a LoRA adapter record of the models they were made from (`probes.store`, `models.lora`)."""
    files = sorted(Path(path).glob("*.safetensors")) + [Path(path) / "config.json"]
    return {f.name: sha256_file(f) for f in files if f.is_file()}


def sha256_tree(path: str | os.PathLike) -> str:
    """One sha256 over every file under a directory: each file's path relative to it and its content's sha256, in
    sorted order (a renamed, added, removed or edited file changes it)."""
    root = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(root).as_posix()}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def input_record(value: Any) -> dict[str, str] | None:
    """``{"path": resolved, "sha256": content}`` of a value that names an existing local file or directory; None for
    anything else (a hub id, a number, a name)."""
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        return None
    p = Path(value).expanduser()
    try:
        if p.is_file():
            return {"path": str(p.resolve()), "sha256": sha256_file(p)}
        if p.is_dir():
            return {"path": str(p.resolve()), "sha256": sha256_tree(p)}
    except OSError:
        return None
    return None


def changed_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The keys whose recorded content differs (or that one record has and the other lacks), each as
    ``KEY (OLD_PATH -> NEW_PATH)``."""
    if not isinstance(old, Mapping):
        return ["the record itself (not a mapping: damaged)"]
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        a, b = (a if isinstance(a, Mapping) else {}), (b if isinstance(b, Mapping) else {})
        if a.get("sha256") != b.get("sha256"):
            out.append(f"{key} ({a.get('path', 'none')} -> {b.get('path', 'none')})")
    return out
