"""A full disk in every verb: one ``error:`` line, the older artifacts intact, and the same command completes once
there is space again. ENOSPC is injected at the write primitives (``open`` / ``os.open`` of one file name under the
workspace); one end-to-end case fills a real tmpfs (root only)."""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from mechopd.cli import main

TRAIN = ("--batch-size", "2", "--set", "save_every=2", "--no-progress")


def _digest(root: Path) -> dict[str, str]:
    """path -> sha256 of every file under root, the lock file excluded."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".mechopd.lock"
    }


def inject_enospc(monkeypatch, root: Path, name: str) -> None:
    """Opening any file under `root` whose name contains `name` for writing raises OSError(ENOSPC)."""
    real_open, real_os_open = builtins.open, os.open

    def hit(path, writing: bool) -> bool:
        p = Path(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else None
        return writing and p is not None and name in p.name and str(root) in str(p.resolve())

    def fake_open(file, mode="r", *a, **k):
        if hit(file, any(c in mode for c in "wax+")):
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return real_open(file, mode, *a, **k)

    def fake_os_open(path, flags, *a, **k):
        if hit(path, bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))):
            raise OSError(errno.ENOSPC, "No space left on device", os.fsdecode(path))
        return real_os_open(path, flags, *a, **k)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)


def _one_error(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) >= 1 and err[-1].startswith("error: no space left on the device"), err
    assert not any("Traceback" in ln for ln in err), err
    return err[-1]


def _full_then_free(monkeypatch, capsys, root: Path, name: str, argv: list[str], kept: Path) -> None:
    """`argv` with ENOSPC on `name`: exit 2, one line, `kept` unchanged; then the same argv completes."""
    before = _digest(kept)
    with monkeypatch.context() as m:
        inject_enospc(m, root, name)
        assert main(argv) == 2
    line = _one_error(capsys)
    assert name in line and "rerun the same command" in line
    assert _digest(kept) == before
    assert not [p for p in root.rglob("*") if ".stage-" in p.name or ".tmp" in p.name]
    assert main(argv) == 0


def test_train_metrics_write(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--student", str(tiny_rules_organism), "--out", "r", "--steps", "2", *TRAIN]) == 0
    argv = ["train", "--student", str(tiny_rules_organism), "--out", "r", "--steps", "4", *TRAIN, "--resume"]
    _full_then_free(monkeypatch, capsys, tmp_path, "metrics.jsonl", argv, tmp_path / "r" / "checkpoints")
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_train_config_write_of_a_new_run(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--student", str(tiny_rules_organism), "--out", "r", "--steps", "2", *TRAIN]
    _full_then_free(monkeypatch, capsys, tmp_path, "config.yaml", argv, tmp_path / "org-absent")


def test_eval(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    argv = ["eval", "--task", "rules", "--model", str(tiny_rules_organism), "--n", "3", "--out", str(tmp_path / "e")]
    (tmp_path / "e").mkdir()
    assert main(argv) == 0
    _full_then_free(monkeypatch, capsys, tmp_path, "rules.csv", argv, tmp_path / "e")


def test_probe(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    import shutil

    from tests.cli.reliability_harness import poison

    trained = poison(Path(shutil.copytree(tiny_rules_organism, tmp_path / "t")), 0.5)
    argv = [
        "probe",
        "deltas",
        "--base",
        str(tiny_rules_organism),
        "--models",
        f"opd={trained}",
        "--out",
        str(tmp_path / "p"),
        "--force",
    ]  # the rerun replaces the probe's own files
    assert main(argv) == 0
    _full_then_free(monkeypatch, capsys, tmp_path, "deltas.csv", argv, tmp_path / "p")


def test_figures_and_aggregate(tmp_path, monkeypatch, capsys):
    from tests.unit.plotting_run import make_run

    runs = [make_run(tmp_path / f"s{k}", seed=k) for k in range(2)]
    assert main(["figures", str(runs[0])]) == 0
    _full_then_free(monkeypatch, capsys, runs[0], ".png", ["figures", str(runs[0])], runs[0])
    argv = ["aggregate", *map(str, runs), "--out", str(tmp_path / "agg")]
    _full_then_free(monkeypatch, capsys, tmp_path, "aggregate.json", argv, runs[1])


def test_demo_first_write(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("mechopd.pipeline.demo.organism", lambda cfg: Path(tiny_rules_organism))
    with monkeypatch.context() as m:
        inject_enospc(m, tmp_path, "demo.json")
        assert main(["demo", "--fast", "--out", str(tmp_path / "d")]) == 2
    assert "demo.json" in _one_error(capsys)
    assert not (tmp_path / "d").exists()  # nothing left behind


def test_pretrain(tmp_path, monkeypatch, capsys):
    argv = ["pretrain", "--task", "rules", "--out", str(tmp_path / "o"), "--steps", "2", "--n", "2"]
    with monkeypatch.context() as m:
        inject_enospc(m, tmp_path, "accuracy.json")
        assert main(argv) == 2
    _one_error(capsys)
    organism = _digest(tmp_path / "o")
    assert "organism.json" in organism
    assert main(argv) == 0  # the organism is reused, the report written
    assert {k: v for k, v in _digest(tmp_path / "o").items() if k != "accuracy.json"} == organism


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_real_full_tmpfs(tiny_rules_organism, tmp_path, capsys):
    """eval into a 256 KiB tmpfs: a first report fits; with the disk filled the next eval fails on one line and the
    first report is intact; after freeing the space the same command completes."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        first = ["eval", "--task", "rules", "--model", str(tiny_rules_organism), "--n", "3", "--out", str(mnt)]
        assert main(first) == 0
        before = _digest(mnt)
        fd = os.open(mnt / "ballast", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)
        second = [a if a != "3" else "40" for a in first]
        assert main(second) == 2
        _one_error(capsys)
        (mnt / "ballast").unlink()
        assert _digest(mnt) == before
        assert main(second) == 0
        assert len(json.loads((mnt / "rules.json").read_text())["records"]) == 40
    finally:
        subprocess.run(["umount", str(mnt)])
