"""An activation store proves what it holds (#41): read for other models' weights, a shard outside the store, a
truncated or corrupted shard, a full disk while writing: one ``error:`` line each (exit 2), no traceback, no table."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mechopd.cli import main
from mechopd.probes.store import MANIFEST
from tests.integration.test_activation_store import run, store  # noqa: F401  (the module's fixtures)


def _similarity(run_dir: Path, cache: Path, out: Path, capsys) -> str:
    args = ["probe", "similarity", "--run", str(run_dir), "--n", "6", "--batch-size", "4", "--cache", str(cache)]
    capsys.readouterr()
    code = main([*args, "--out", str(out)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert lines and lines[-1].startswith("error:"), lines
    assert not (out / "similarity.csv").exists()
    return lines[-1]


def _copy_store(store: Path, tmp_path: Path) -> Path:  # noqa: F811
    return Path(shutil.copytree(store, tmp_path / "copy"))


def _manifest(d: Path) -> dict:
    return json.loads((d / MANIFEST).read_text())


def test_a_store_of_other_weights_is_refused(run, store, tmp_path, capsys):  # noqa: F811
    other = Path(shutil.copytree(run, tmp_path / "seed-1"))  # another seed: same labels, other trained weights
    f = other / "final" / "model.safetensors"
    tensors = load_file(str(f))
    key = next(k for k in tensors if "layers.0" in k)
    tensors[key] = tensors[key] + 1e-3
    save_file(tensors, str(f), metadata={"format": "pt"})
    line = _similarity(other, store, tmp_path / "sim", capsys)
    assert "other weights for 'nca'" in line and "mechopd probe cache" in line


def test_a_shard_named_outside_the_store_is_refused(run, store, tmp_path, capsys):  # noqa: F811
    d = _copy_store(store, tmp_path)
    doc = _manifest(d)
    first = doc["models"]["nca"]["shards"][0]
    shutil.move(str(d / first["file"]), str(tmp_path / "outside.safetensors"))
    first["file"] = str(tmp_path / "outside.safetensors")  # an absolute path
    (d / MANIFEST).write_text(json.dumps(doc))
    assert "not a file name inside the store" in _similarity(run, d, tmp_path / "sim", capsys)
    first["file"] = "../outside.safetensors"
    (d / MANIFEST).write_text(json.dumps(doc))
    assert "not a file name inside the store" in _similarity(run, d, tmp_path / "sim", capsys)
    first["file"] = "link.safetensors"
    (d / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    (d / MANIFEST).write_text(json.dumps(doc))
    assert "leads out of the store" in _similarity(run, d, tmp_path / "sim", capsys)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "offsets"])
def test_a_damaged_shard_is_one_error_line(run, store, tmp_path, capsys, damage):  # noqa: F811
    d = _copy_store(store, tmp_path)
    doc = _manifest(d)
    shard = d / doc["models"]["nca"]["shards"][-1]["file"]
    data = bytearray(shard.read_bytes())
    if damage == "truncated":
        shard.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "flipped":
        data[-5] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:  # a re-saved shard with other offsets, its sha256 dropped from the manifest (an edited store)
        tensors = load_file(str(shard))
        tensors["offsets"] = tensors["offsets"][:-1].contiguous()
        save_file(tensors, str(shard))
        for sh in doc["models"]["nca"]["shards"]:
            sh.pop("sha256", None)
        (d / MANIFEST).write_text(json.dumps(doc))
    line = _similarity(run, d, tmp_path / "sim", capsys)
    assert shard.name in line and "rewrite the store" in line


def test_a_store_written_to_a_full_disk_is_one_error_line(run, tmp_path, capsys, monkeypatch):  # noqa: F811
    real = Path.write_bytes

    def full(self, data):
        if self.suffix == ".safetensors":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    out = tmp_path / "cache"
    code = main(["probe", "cache", "--run", str(run), "--n", "2", "--batch-size", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "no space left" in err.splitlines()[-1], err[-2000:]
    assert not list(out.glob("*.safetensors")) and not (out / MANIFEST).exists()


def test_the_store_records_each_shards_sha256(store):  # noqa: F811
    import hashlib

    for rec in _manifest(store)["models"].values():
        for sh in rec["shards"]:
            assert sh["sha256"] == hashlib.sha256((store / sh["file"]).read_bytes()).hexdigest()
    assert torch.is_tensor(load_file(str(store / rec["shards"][0]["file"]))["offsets"])


def test_a_store_on_a_real_full_tmpfs_is_one_error_line(tiny_rules_organism, tmp_path):
    """`probe cache` on a 64 KiB tmpfs (a private user + mount namespace): safetensors' ``SafetensorError … No space
    left on device`` was a traceback; skipped where unprivileged namespaces are not allowed."""
    import os
    import shlex
    import subprocess
    import sys

    from tests.cli.test_hostile_disk import ENV, _tmpfs_works

    mnt = tmp_path / "small"
    mnt.mkdir()
    if not _tmpfs_works(mnt):
        pytest.skip("no unprivileged user + mount namespaces here (unshare -rm)")
    argv = [sys.executable, "-m", "mechopd.cli", "probe", "cache", "--task", "rules", "--models"]
    argv += [f"base={tiny_rules_organism}", "--n", "8", "--max-new-tokens", "8", "--shard-mb", "0.004"]
    cli = " ".join(shlex.quote(a) for a in [*argv, "--out", str(mnt / "cache")])
    res = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(mnt))} && {cli}"],
        capture_output=True,
        text=True,
        env={**ENV, **{k: v for k, v in os.environ.items() if k == "PATH"}},
        cwd=tmp_path,
        timeout=600,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert lines[-1].startswith("error:") and "no space left" in lines[-1], lines[-1]
