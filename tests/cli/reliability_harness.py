"""The harness of the bad-input tests (test_reliability.py, test_reliability_controls.py and the hostile-input suites,
tests/cli/hostile.py): the directory snapshot that proves nothing was written, the helpers that corrupt a copy of the
tiny rules organism (weights, config, shards, pickles), the `Case` record, and `_run`, which runs one case in-process
or as a ``python -m mechopd.cli`` subprocess."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mechopd.cli import main

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------------------- helpers
def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every path under `roots` (recursive) -> (kind, size, mtime_ns); directories too (an entry created and removed
    again changes its directory's mtime)."""
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = Path(dirpath, name)
                st = p.lstat()
                out[str(p)] = ("d" if p.is_dir() else "f", 0 if p.is_dir() else st.st_size, st.st_mtime_ns)
        st = root.lstat()
        out[str(root)] = ("d", 0, st.st_mtime_ns)
    return out


def copy_org(org: Path, ws: Path, name: str = "org") -> Path:
    dst = ws / name
    shutil.copytree(org, dst)
    return dst


def edit_config(d: Path, **changes) -> Path:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def more_layers(d: Path, extra: int) -> Path:
    cfg = json.loads((d / "config.json").read_text())
    n = cfg["num_hidden_layers"] + extra
    return edit_config(d, num_hidden_layers=n, layer_types=(cfg.get("layer_types") or ["full_attention"])[:1] * n)


def poison(d: Path, value: float, tensor: str = "model.norm.weight") -> Path:
    """Overwrite one float32 tensor's bytes with `value` under an intact header."""
    f = d / "model.safetensors"
    raw = bytearray(f.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    start, stop = json.loads(raw[8 : 8 + n])[tensor]["data_offsets"]
    raw[8 + n + start : 8 + n + stop] = struct.pack("<f", value) * ((stop - start) // 4)
    f.write_bytes(bytes(raw))
    return d


def truncate(d: Path, keep: float) -> Path:
    f = d / "model.safetensors"
    raw = f.read_bytes()
    f.write_bytes(raw[: int(len(raw) * keep)])
    return d


class _Trap:
    """Unpickling this creates a file next to it: the snapshot proves the .bin was never unpickled."""

    def __init__(self, target: Path):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


def pickle_only(org: Path, ws: Path) -> Path:
    d = copy_org(org, ws, "binonly")
    (d / "model.safetensors").unlink()
    with open(d / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"model.norm.weight": _Trap(ws / "UNPICKLED")}, fh)
    return d


def jsonl_task(ws: Path, words: tuple[str, str, str] = ("zyzzyva quux?", "blorp", "frobnicate")) -> Path:
    data = ws / "qa.jsonl"
    data.write_text(json.dumps({"prompt": words[0], "answer": words[1], "context": words[2]}) + "\n")
    return data


# ------------------------------------------------------------------------------------------------------ the cases
@dataclass(frozen=True)
class Case:
    cls: str  # the class of bad input (the groups)
    name: str
    argv: Callable[[Path, Path], list[str]]  # (organism fixture, workspace) -> argv; prepares the workspace
    needle: str  # a piece of the one error line
    subprocess: bool = False
    skip: str | None = None


def _eval(model: str, *more: str) -> list[str]:
    return ["eval", "--task", "rules", "--model", model, "--n", "2", *more]


def train(student: str | Path, ws: Path, *more: str) -> list[str]:
    """`mechopd train` of one step at batch 2 into ``ws/run`` (the reliability and hostile cases' common verb)."""
    return [
        "train",
        "--student",
        str(student),
        "--out",
        str(ws / "run"),
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--no-progress",
        *more,
    ]


ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
CUDA = torch.cuda.is_available()


def _readonly(ws: Path) -> Path:
    d = ws / "ro"
    d.mkdir()
    d.chmod(0o555)
    return d


def _compare(ws: Path, *pairs: str) -> list[str]:
    return ["eval", "--task", "rules", "--n", "2", "--out", str(ws / "cmp"), "--compare", *pairs]


def _file(ws: Path, name: str = "afile") -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    p = ws / name
    p.write_text("precious\n")
    return p


def _cut(d: Path, name: str) -> Path:
    (d / name).write_text((d / name).read_text()[:100])
    return d


def _rm(d: Path, name: str) -> Path:
    (d / name).unlink()
    return d


def _bad_header(d: Path) -> Path:
    f = d / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[8:16] = b"{garbag!"
    f.write_bytes(bytes(raw))
    return d


def _sharded_missing(d: Path) -> Path:
    """A sharded layout whose index names a shard that is not there."""
    f = d / "model.safetensors"
    n = struct.unpack("<Q", f.read_bytes()[:8])[0]
    names = [k for k in json.loads(f.read_bytes()[8 : 8 + n]) if k != "__metadata__"]
    f.rename(d / "model-00001-of-00002.safetensors")
    weight_map = {k: "model-00001-of-00002.safetensors" for k in names}
    weight_map[names[-1]] = "model-00002-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


# ---------------------------------------------------------------------------------------------------------- runner
def _run(case: Case, argv: list[str], ws: Path, capsys) -> tuple[int, str]:
    if not case.subprocess:
        code = main(argv)
        return code, capsys.readouterr().err
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    res = subprocess.run(
        [sys.executable, "-m", "mechopd.cli", *argv], cwd=ws, env=env, capture_output=True, text=True, timeout=300
    )
    return res.returncode, res.stderr
