"""A killed demo leaves nothing running (`mechopd.pipeline.pool`): SIGTERM of the demo, kill -9 of its parent, a worker
that fails (a full disk). The pool runs stand-in jobs (`tests/cli/demo_jobs.py`) that hold their run locks and sleep;
`test_real_demo_*` (slow) does the same to `mechopd demo --fast`.

"No process of the run remains" is read from /proc: every process whose session is the demo's (it is started in a
session of its own), workers and multiprocessing's resource tracker included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mechopd.core.runlock import LOCK_NAME

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def session_pids(sid: int) -> list[int]:
    """Live processes of session `sid` (zombies not counted: they hold nothing)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(d.name))
    return pids


def wait_until(predicate, timeout: float) -> bool:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def start(out: Path, mode: str = "sleep") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.cli.demo_jobs", str(out), mode],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def both_started(out: Path) -> bool:
    return (out / "started-opd").exists() and (out / "started-nca").exists()


def locks(out: Path) -> list[Path]:
    return sorted(out.rglob(LOCK_NAME))


def _kill_session(sid: int) -> None:
    for pid in session_pids(sid):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_no_worker_survives_the_demo(tmp_path, how):
    out = tmp_path / "run"
    proc = start(out)
    try:
        assert wait_until(lambda: both_started(out) or proc.poll() is not None, 120) and proc.poll() is None, (
            proc.stderr.read() if proc.poll() is not None else "slow"
        )
        assert len(session_pids(proc.pid)) >= 3  # the parent and two workers (and the resource tracker)
        os.kill(proc.pid, signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        code = proc.wait(timeout=30)
        gone = wait_until(lambda: not session_pids(proc.pid), 10)
        assert gone, f"still running 10 s later: {session_pids(proc.pid)}"
    finally:
        _kill_session(proc.pid)
    err = proc.stderr.read()
    assert "Traceback" not in err, err
    if how == "sigterm":
        assert code == 130 and err.strip().splitlines()[-1] == "interrupted", (code, err)
    else:
        assert code == -signal.SIGKILL
    # the workers unwound their jobs: every run lock they held released and its file removed; the parent's own lock
    # file is left by kill -9 only (a stale lock, taken over by the next run)
    assert [p.relative_to(out) for p in locks(out)] == ([Path(LOCK_NAME)] if how == "kill9" else [])
    rerun = start(out, "enospc")  # the next run takes the directory and its locks over (and fails as asked)
    assert rerun.wait(timeout=120) == 2, rerun.stderr.read()


@pytest.mark.parametrize("mode", ["enospc", "safetensors"])
def test_a_worker_with_a_full_disk_is_one_error_line(tmp_path, mode):
    out = tmp_path / "run"
    proc = start(out, mode)
    try:
        code = proc.wait(timeout=120)
        assert wait_until(lambda: not session_pids(proc.pid), 10), session_pids(proc.pid)
    finally:
        _kill_session(proc.pid)
    err = proc.stderr.read()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and "Traceback" not in err, err
    assert lines == [lines[-1]] and lines[-1].startswith("error: no space left on the device"), lines
    assert not locks(out)


def _demo(cwd: Path, out: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mechopd.cli", "demo", "--fast", "--workers", "2", "--out", out],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _evals(run: Path) -> dict[str, dict]:
    import json

    return {
        p.name: {k: v for k, v in json.loads(p.read_text()).items() if k in ("summary", "other_contexts")}
        for p in sorted((run / "eval").glob("*.json"))
    }


@pytest.mark.slow
def test_real_demo_killed_by_sigterm_and_kill9_leaves_nothing_and_resumes(tmp_path, fast_demo_two_workers):
    """`mechopd demo --fast --workers 2`: SIGTERM while both workers train, then kill -9 of the parent while they
    train again; 10 s after each no process of the demo is alive; the rerun completes and its evaluations equal an
    uninterrupted run's (the session's `fast_demo_two_workers`, started the same way in a directory of its own: this
    run pretrains its own organism, which the worker-count test shows gives the same numbers)."""
    run = tmp_path / "killed"
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc = _demo(tmp_path, "killed")
        try:
            running = lambda: len(list(run.glob(f"train/*/{LOCK_NAME}"))) >= 2  # noqa: E731  (two trainings hold locks)
            assert wait_until(lambda: running() or proc.poll() is not None, 600) and proc.poll() is None  # noqa: B023
            time.sleep(2)
            assert len(session_pids(proc.pid)) >= 3
            os.kill(proc.pid, sig)
            proc.wait(timeout=60)
            assert wait_until(lambda: not session_pids(proc.pid), 10), session_pids(proc.pid)  # noqa: B023
        finally:
            _kill_session(proc.pid)
        assert "Traceback" not in proc.stderr.read()
    rerun = _demo(tmp_path, "killed")
    assert rerun.wait(timeout=1800) == 0, rerun.stderr.read()[-3000:]
    assert _evals(run) == _evals(fast_demo_two_workers) and len(_evals(run)) >= 5


STOP_MIDWAY = """
import os, signal, sys, time
from pathlib import Path
from mechopd.core import runlock
from mechopd.pipeline import pool

phase, out = sys.argv[1], Path(sys.argv[2])
signal.signal(signal.SIGTERM, pool._stop_worker)  # as a demo worker, inside a job
pool._IN_JOB = True
name = "_open_locked" if phase == "acquire" else "_release"
real = getattr(runlock, name)

def midway(*args):
    result = real(*args) if phase == "acquire" else None  # acquire: the lock file exists now; release: not yet removed
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the handler runs in here
    return result if phase == "acquire" else real(*args)

setattr(runlock, name, midway)
try:
    with runlock.hold(out, "train"):
        time.sleep(0.5)
    time.sleep(1.0)
except pool.WorkerStopped:
    print("stopped", "lock left" if (out / runlock.LOCK_NAME).exists() else "clean", flush=True)
    os._exit(0)
print("not stopped", flush=True)
"""


@pytest.mark.parametrize("phase", ["acquire", "release"])
def test_a_stop_inside_a_lock_acquire_or_release_waits_for_it(tmp_path, phase):
    """The race behind a lock file left by a failed demo worker: the parent's SIGTERM landed while the worker's job
    was taking or releasing its run lock. The stop now waits until the lock is held (the job unwinds and releases
    it) or released, and then stops the job."""
    out = subprocess.run(
        [sys.executable, "-c", STOP_MIDWAY, phase, str(tmp_path / "run")],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "stopped clean", (out.stdout, out.stderr)
    assert not locks(tmp_path)


def _study_run(tmp_path: Path, student: Path, out: str) -> subprocess.Popen:
    """`mechopd run` of a one-seed OPD study (40 steps, a checkpoint every 10) of ``student`` into ``tmp_path/out``."""
    import yaml

    doc = {
        "task": "rules",
        "student": str(student),
        "seeds": [0],
        "train": {"steps": 40, "batch_size": 2, "estimator": "full", "save_every": 10},
        "runs": {"opd": {"method": "opd"}},
        "eval": {"n": 4, "other_contexts": False},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    return subprocess.Popen(
        [sys.executable, "-m", "mechopd.cli", "run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / out)],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _results(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "eval").glob("*.csv"))}


@pytest.mark.slow
def test_mechopd_run_handles_sigterm_as_the_demo_and_a_kill9_resumes_to_the_same_files(tiny_rules_organism, tmp_path):
    """`mechopd run` stopped by SIGTERM while it trains: exit 130, "interrupted", no traceback, no process and no lock
    left (today it died by the signal, -15); then kill -9 while it trains again; the rerun's evaluations are byte for
    byte an uninterrupted run's."""
    ref = _study_run(tmp_path, tiny_rules_organism, "ref")
    assert ref.wait(timeout=600) == 0, ref.stderr.read()[-3000:]
    out = tmp_path / "killed"
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc = _study_run(tmp_path, tiny_rules_organism, "killed")
        try:
            training = lambda: (out / "train" / "opd" / LOCK_NAME).exists()  # noqa: E731
            assert wait_until(lambda: training() or proc.poll() is not None, 300) and proc.poll() is None  # noqa: B023
            time.sleep(1)
            os.kill(proc.pid, sig)
            code = proc.wait(timeout=60)
            assert wait_until(lambda: not session_pids(proc.pid), 10), session_pids(proc.pid)  # noqa: B023
        finally:
            _kill_session(proc.pid)
        err = proc.stderr.read()
        assert "Traceback" not in err, err[-3000:]
        if sig == signal.SIGTERM:
            said = [seg.strip() for seg in err.replace("\r", "\n").splitlines()[-4:]]  # a worker's bar may end last
            assert code == 130 and any(seg.endswith("interrupted") for seg in said), (code, err[-2000:])
            assert locks(out) == [], locks(out)
    rerun = _study_run(tmp_path, tiny_rules_organism, "killed")
    assert rerun.wait(timeout=600) == 0, rerun.stderr.read()[-3000:]
    assert _results(out) == _results(tmp_path / "ref") and len(_results(out)) == 2
