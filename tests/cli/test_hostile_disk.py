"""A real full disk: `mechopd train` on a small tmpfs (mounted in a private user + mount namespace, `unshare -rm`)
ends in one ``error:`` line, not safetensors' ``SafetensorError … No space left on device`` traceback. Skipped where
the kernel does not allow unprivileged namespaces; the injected ENOSPC tests (tests/cli/test_rundir_disk.py,
test_hostile_signals.py) run everywhere."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _tmpfs_works(where: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    res = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(where))}"],
        capture_output=True,
    )
    return res.returncode == 0


def test_train_on_a_real_full_tmpfs_is_one_error_line(tiny_rules_organism, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if not _tmpfs_works(mnt):
        pytest.skip("no unprivileged user + mount namespaces here (unshare -rm)")
    weights = (Path(tiny_rules_organism) / "model.safetensors").stat().st_size
    size = max(64 * 1024, weights // 2)  # the run's config and metrics fit, its first checkpoint does not
    cli = " ".join(
        shlex.quote(a)
        for a in [
            sys.executable,
            "-m",
            "mechopd.cli",
            "train",
            "--student",
            str(tiny_rules_organism),
            "--out",
            str(mnt / "run"),
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--no-progress",
        ]
    )
    res = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(mnt))} && {cli}"],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=tmp_path,
        timeout=600,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert [ln for ln in lines if ln.startswith("error:")] == lines[-1:], lines
    assert "No space left on device" in lines[-1] or "no space left" in lines[-1], lines[-1]
