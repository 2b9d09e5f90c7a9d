"""One writer per run directory (`mechopd.core.runlock`): two `train` processes on one --out, stale locks, nesting, and a
refusal that leaves the tree exactly as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mechopd.cli import main
from mechopd.core.errors import MechopdError
from mechopd.core.runlock import LOCK_NAME, RunLockedError, hold

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _cli(*argv: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mechopd.cli", *map(str, argv)],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _holder(code: str, cwd: Path) -> subprocess.Popen:
    """A python process that takes a lock and sleeps (prints 'held' once it holds it)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=ENV, stdout=subprocess.PIPE, text=True
    )


def _wait_for(predicate, timeout: float = 120.0) -> None:
    t0 = time.time()
    while not predicate():
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.1)


STEPS = 400  # ~0.05 s each: the first run must outlive the second's start (8 did not; the refusal took 4-17 s loaded)


def test_two_train_processes_on_one_out(tiny_rules_organism, tmp_path):
    """The second `train --out r` refuses at once (exit 2, one line naming pid, host and the fix); the first run
    finishes intact (metrics steps 1..N once each)."""
    argv = (
        "train",
        "--student",
        tiny_rules_organism,
        "--out",
        "r",
        "--steps",
        str(STEPS),
        "--batch-size",
        "2",
        "--no-progress",
    )
    first = _cli(*argv, cwd=tmp_path)
    _wait_for(lambda: (tmp_path / "r" / LOCK_NAME).is_file() and (tmp_path / "r" / LOCK_NAME).read_text())
    t0 = time.time()
    second = _cli(*argv, cwd=tmp_path)
    out2, err2 = second.communicate(timeout=120)
    assert first.poll() is None, "the first run must still be running while the second is refused"
    lines = [ln for ln in err2.splitlines() if ln.strip()]
    assert second.returncode == 2 and len(lines) == 1, err2
    assert f"pid {first.pid}" in lines[0] and "mechopd train" in lines[0] and "another --out" in lines[0], lines
    out1, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1[-2000:]
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))
    assert (tmp_path / "r" / "final" / "config.json").is_file()
    assert not (tmp_path / "r" / LOCK_NAME).exists()  # released (and removed) by the holder
    print(f"second refused after {time.time() - t0:.1f} s (interpreter start included)")


def test_a_lock_of_a_killed_process_is_taken_over(tmp_path):
    """kill -9 of the holder: the kernel drops the flock; the next command takes the directory without any cleanup."""
    p = _holder(
        f"""
        from mechopd.core.runlock import hold
        import time
        with hold({str(tmp_path / "d")!r}, "demo"):
            print("held", flush=True)
            time.sleep(600)
        """,
        tmp_path,
    )
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(RunLockedError, match=f"in use by mechopd demo \\(pid {p.pid}"):
        with hold(tmp_path / "d", "eval"):
            pass
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert (tmp_path / "d" / LOCK_NAME).exists()  # the stale file is still there ...
    with hold(tmp_path / "d", "eval"):  # ... and is simply reused
        rec = json.loads((tmp_path / "d" / LOCK_NAME).read_text())
        assert rec["pid"] == os.getpid() and rec["verb"] == "eval"


def test_a_dead_holder_whose_child_keeps_the_lock_is_named(tmp_path):
    """A holder that forked a worker and died: the lock is still held, and the error says the child holds it."""
    p = _holder(
        f"""
        import os, time
        from mechopd.core.runlock import hold
        ctx = hold({str(tmp_path / "d")!r}, "train")
        ctx.__enter__()
        if os.fork() == 0:   # the child inherits the open lock file
            time.sleep(600)
        print("held", flush=True)
        os._exit(0)
        """,
        tmp_path,
    )
    assert p.stdout.readline().strip() == "held"
    p.wait()
    try:
        with pytest.raises(RunLockedError, match="is gone, so a process it started"):
            with hold(tmp_path / "d", "train"):
                pass
    finally:
        out = subprocess.run(["pgrep", "-P", "1", "-f", "runlock import hold"], capture_output=True, text=True)
        for pid in out.stdout.split():  # the orphaned child of this test only (its command line names runlock)
            if str(tmp_path) in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(int(pid), signal.SIGKILL)


def test_nested_holds_in_one_process_and_refusal_leaves_nothing(tmp_path):
    """The demo holds RUN and then aggregates into RUN: re-entrant. A command that fails inside a fresh lock leaves no
    directory behind and the parent's mtime unchanged."""
    with hold(tmp_path / "run", "demo"):
        with hold(tmp_path / "run", "aggregate"):
            assert (tmp_path / "run" / LOCK_NAME).exists()
    assert not (tmp_path / "run").exists()  # nothing else was written: the directory hold made is gone
    before = tmp_path.stat().st_mtime_ns
    with pytest.raises(MechopdError):
        with hold(tmp_path / "new" / "deep", "eval"):
            raise MechopdError("refused")
    assert not (tmp_path / "new").exists() and tmp_path.stat().st_mtime_ns == before


def test_every_writing_verb_refuses_a_held_directory(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    """eval, probe, demo, aggregate, figures: exit 2 with the holder's line while another process holds the dir."""
    monkeypatch.chdir(tmp_path)
    held = tmp_path / "busy"
    p = _holder(
        f"""
        from mechopd.core.runlock import hold
        import time
        with hold({str(held)!r}, "demo"):
            print("held", flush=True)
            time.sleep(600)
        """,
        tmp_path,
    )
    assert p.stdout.readline().strip() == "held"
    try:
        (held / "demo.json").write_text("{}")
        cases = [
            ["eval", "--task", "rules", "--model", str(tiny_rules_organism), "--n", "2", "--out", str(held)],
            ["probe", "deltas", "--models", f"base={tiny_rules_organism}", "--out", str(held)],
            ["demo", "--fast", "--out", str(held)],
            ["figures", str(held)],
        ]
        for argv in cases:
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert f"in use by mechopd demo (pid {p.pid}" in err, (argv, err)
    finally:
        p.kill()
        p.wait()
