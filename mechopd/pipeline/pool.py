"""A study's stages as jobs on worker processes, each computed on ONE intra-op thread (`mechopd run`, `mechopd demo`).

Jobs, per seed run k (``RUN`` with one seed, ``RUN/seed-k`` with several): one job per training run (OPD, NCA, ...:
`run.train_runs`), then, once that seed's trainings are done, its finish job (evaluation, probes, figures, report:
`run.finish_seed`, which finds its trainings done and skips them). Training jobs are queued longest first (`EXPECTED_COST`), finish jobs as
soon as their seed is ready; the aggregate over seeds runs in the parent at the end.

Why processes with one thread each. The organisms are small enough that a step is bound by per-call overhead, not by
arithmetic: 60 OPD steps of the rules organism took 7.6 s with two intra-op threads and 8.1 s with one, while two
one-thread processes side by side do about 1.8 times the work of one two-thread process. So the demo's parallelism
is over jobs (`workers`: default the process's intra-op thread count, ``torch.get_num_threads()``, which follows
``OMP_NUM_THREADS``), and each job runs with ``torch.set_num_threads(1)``.

Why every thread count is pinned. The float summation order of a matmul depends on the intra-op thread count, and at
the organisms' lr 1e-3 a 1e-7 difference grows into another trajectory (measured: bit-identical for two steps, 8 %
apart by step 20). Every job runs on `JOB_THREADS` = 1 thread (``--job-threads``) and the organism's pretraining on
`ORGANISM_THREADS` = 2 (its batch of 64 gains 1.5x from a second thread), whatever ``OMP_NUM_THREADS`` says: the
demo's numbers do not depend on it, on the number of workers, or on which worker ran a job when; a job's result is a
function of its config alone. What float order used to perturb is carried by the seeds instead:
the claims' interval rule (`mechopd.report.verdicts`) reads the spread over training seeds, a far larger perturbation.

Logs: with several workers each job's output (and a failing job's traceback) goes to ``<seed run>/logs/<job>.log``;
the worker prints a job's start, the parent its end and wall time. A job's error stops the demo with that error:
the parent names the job, terminates the running ones and re-raises (finished jobs keep their outputs; a training
killed mid-run resumes from its last checkpoint on the next `mechopd demo`).

Signals and a dead parent. SIGTERM (what ``timeout`` and job schedulers send) is handled as SIGINT in the parent
(`terminate_as_interrupt`): the running jobs are stopped and the demo exits. A worker stops by itself when its parent
dies, even by ``kill -9`` (`_watch_parent`: a parent-death signal on Linux, and a thread that polls the parent pid
every `PARENT_POLL_S` elsewhere or when the signal was missed): the running job unwinds (its run locks released, its
lock files removed), then the process exits; it is killed outright `STOP_GRACE_S` later if unwinding hangs. A stop
that lands while a run lock is being taken or released (`runlock.busy`) is delayed until that is done (at most
`STOP_DEFER_MAX_S`), so that it never leaves a lock file behind.
A job's error reaches the parent as a `MechopdError` (a full disk as `runcheck.disk_error`): one ``error:`` line.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from mechopd.core import runlock
from mechopd.core.errors import MechopdError, TrainingError
from mechopd.core.options import GE1, option
from mechopd.core.runcheck import disk_error
from mechopd.core.runlock import hold
from mechopd.core.threads import configure, usable_cores
from mechopd.pipeline.logline import say

JOB_THREADS = 1  # intra-op threads of every job (DemoConfig.job_threads; the robustness check sets 2)
ORGANISM_THREADS = 2  # the organism's pretraining (batch 64: threads pay there, 1.5x), pinned whatever OMP says
# Relative cost of a training run (measured wall time on the rules organism, 150 steps, OPD = 1): longest first.
EXPECTED_COST = {"nca_follow": 2.5, "ta_opd": 1.8, "nca_const": 1.5, "nca": 1.3, "opd": 1.0}
PARENT_POLL_S = 0.5  # a worker checks this often whether its parent is still alive
STOP_GRACE_S = 5.0  # a stopped worker's job gets this long to unwind (locks released) before os._exit
STOP_RETRY_S = 0.01  # a stop that lands inside a run lock's acquire or release is sent again this much later
STOP_DEFER_MAX_S = 2.0  # ... for at most this long (a lock waited for, e.g. an organism's): then it stops there


class Terminated(KeyboardInterrupt):
    """SIGTERM received: handled as SIGINT (Ctrl-C)."""


class WorkerStopped(BaseException):
    """Raised in a worker's job when the worker is told to stop (SIGTERM, or its parent died)."""


@dataclass(frozen=True)
class Job:
    """One unit of work: ``kind`` "train" (``method`` of seed run ``cfg``) or "finish" (the rest of that seed run)."""

    kind: str
    cfg: Any  # the seed run (`run.SeedRun`: out = the seed run's directory, methods(), job_threads)
    student: str
    fn: Callable[..., Any]  # train: fn(cfg, student, run, {method: overrides}); finish: fn(cfg, student=...)
    method: str = ""

    @property
    def name(self) -> str:
        return f"train-{self.method}" if self.kind == "train" else "finish"

    @property
    def log(self) -> Path:
        return Path(self.cfg.out) / "logs" / f"{self.name}.log"


@contextlib.contextmanager
def job_threads(n: int) -> Iterator[None]:
    """``torch.set_num_threads(n)`` for the block, the previous count restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class PoolOptions:
    """How a study's jobs run on worker processes: declared once here (`mechopd run`'s and `mechopd demo`'s flags,
    `DemoConfig`'s fields, `run.run_study`'s defaults)."""

    workers: int | None = option(
        None,
        help="worker processes, each job on its own threads "
        "(default: the intra-op thread count, `default_workers`; the numbers do not depend on it)",
        range=GE1,
        metavar="N",
    )
    job_threads: int = option(
        JOB_THREADS,
        help="intra-op threads per job (another count changes the float order, hence the numbers: a robustness check)",
        range=GE1,
        metavar="N",
    )


def default_workers(job_threads: int = JOB_THREADS) -> int:
    """The process's intra-op thread count (follows ``OMP_NUM_THREADS``) over the threads of one job, at least 1."""
    import torch

    return max(1, torch.get_num_threads() // max(1, job_threads))


def workers_why(workers: int, job_threads: int = JOB_THREADS, given: bool = False) -> str:
    """Why `workers` processes (the demo's and `mechopd run`'s start line says it): given by --workers, or
    `default_workers` and what its thread count follows (``OMP_NUM_THREADS`` when set, else torch's default, the
    cores), next to the cores this process may use."""
    if given:
        return f"--workers {workers}"
    omp = os.environ.get("OMP_NUM_THREADS")
    source = f"OMP_NUM_THREADS={omp}" if omp else "torch's default"
    return (
        f"default: {workers} = intra-op threads ({source}) / {job_threads} per job, {usable_cores()} core(s) usable; "
        "--workers N to choose"
    )


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """For the block, SIGTERM raises `Terminated` (a KeyboardInterrupt) in the main thread, as SIGINT does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        if not _deferred(signum, frame):
            raise Terminated(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def hold_demo_out(out: Any) -> Iterator[None]:
    """The demo's ``--out`` lock (`runlock.hold`) with SIGTERM handled as SIGINT, for the whole demo."""
    with terminate_as_interrupt(), hold(out, "demo"):
        yield


_IN_JOB = False  # a worker is inside `run_job` (stopping unwinds the job) or idle (stopping exits at once)


_DEFERRED_SINCE: float | None = None  # when the stop now being delayed first landed inside a lock's acquire/release


def _deferred(signum: int, frame: Any) -> bool:
    """True (and the signal sent again in `STOP_RETRY_S`) when ``frame`` is acquiring or releasing a run lock
    (`runlock.busy`): an exception raised in there could leave the lock file behind. Not past `STOP_DEFER_MAX_S`."""
    global _DEFERRED_SINCE

    if not runlock.busy(frame):
        _DEFERRED_SINCE = None
        return False
    _DEFERRED_SINCE = _DEFERRED_SINCE or time.monotonic()
    if time.monotonic() - _DEFERRED_SINCE > STOP_DEFER_MAX_S:  # waited long enough (a lock waited for): stop now
        _DEFERRED_SINCE = None
        return False
    again = threading.Timer(STOP_RETRY_S, os.kill, (os.getpid(), signum))
    again.daemon = True
    again.start()
    return True


def _stop_worker(signum: int, frame: Any) -> None:
    """A worker's SIGTERM handler: unwind the running job (its locks released), or exit when idle. A stop that lands
    while a run lock is being taken or released waits until that is done (`_deferred`)."""
    if not _IN_JOB:
        os._exit(128 + signum)
    if _deferred(signum, frame):
        return
    hard = threading.Timer(STOP_GRACE_S, os._exit, (128 + signum,))
    hard.daemon = True
    hard.start()
    raise WorkerStopped(f"signal {signum}")


def _watch_parent(parent: int) -> None:
    """Stop this worker (SIGTERM to itself) when `parent` is gone: PR_SET_PDEATHSIG where Linux has it, and a
    thread polling the parent pid (a reparented worker sees another ppid) as the fallback."""
    signal.signal(signal.SIGTERM, _stop_worker)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=poll, name="mechopd-parent-watch", daemon=True).start()


def _init_worker(argv: Sequence[str], threads: int, parent: int | None = None) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    if parent is not None:
        _watch_parent(parent)  # first: a parent killed while this worker starts is seen too
    torch.set_num_threads(threads)
    sys.argv = list(argv)  # the demo records its command line in demo.json
    hf_logging.get_logger("transformers")  # its handler binds the worker's real stderr now, not a job's log file


def _say(msg: str) -> None:
    say(msg)  # [demo ...] / [run ...] (`logline`)


def run_job(job: Job, redirect: bool = True) -> float:
    """Run one job (in a worker, or in-process) on `job.cfg.job_threads` threads; returns its wall time in s.

    In a worker (`redirect`): a stop (`WorkerStopped`) ends the process once the job unwound; any other error
    travels to the parent as a `MechopdError` (`_user_error`), its traceback in the job's log."""
    global _IN_JOB
    if not redirect:
        return _run_job(job, redirect)
    _IN_JOB = True
    try:
        return _run_job(job, redirect)
    except WorkerStopped:
        os._exit(128 + signal.SIGTERM)  # the job's finally blocks ran: its run locks are released
    except Exception as e:
        raise _user_error(e, job) from None
    finally:
        _IN_JOB = False


def _user_error(err: Exception, job: Job) -> Exception:
    """`err` as the parent should print it: a full disk (an OSError, or safetensors' / torch's own error types) as
    `runcheck.disk_error`, a MechopdError as is, anything else as is (a bug: the parent shows its traceback)."""
    if isinstance(err, MechopdError):
        return err
    full = disk_error(err)
    return full if full is not None else err


def _run_job(job: Job, redirect: bool) -> float:
    t0 = time.time()
    if redirect:
        job.log.parent.mkdir(parents=True, exist_ok=True)
        _say(f"{job.cfg.out}: {job.name} started (log {job.log})")
    with contextlib.ExitStack() as stack:
        if redirect:
            f = stack.enter_context(open(job.log, "a", encoding="utf-8"))
            stack.enter_context(contextlib.redirect_stdout(f))
            stack.enter_context(contextlib.redirect_stderr(f))
        stack.enter_context(job_threads(job.cfg.job_threads))
        try:
            if job.kind == "train":
                job.fn(job.cfg, Path(job.student), Path(job.cfg.out), {job.method: job.cfg.methods()[job.method]})
            else:
                job.fn(job.cfg, student=Path(job.student))
        except BaseException:
            if redirect:
                traceback.print_exc()  # into the job's log; the error itself travels to the parent
            raise
    return time.time() - t0


def finished(train_dir: Path) -> bool:
    """A training run's final checkpoint is complete (its config and its training record written last)."""
    final = Path(train_dir) / "final"
    return (final / "config.json").exists() and (final / "training.json").exists()


def training_jobs(seed_cfgs: Sequence[Any], student: Path, train: Callable[..., Any]) -> list[Job]:
    """The training runs not yet finished: seed by seed (so that a seed's finish job can start early), longest first
    within a seed."""
    jobs = []
    for cfg in seed_cfgs:
        todo = []
        for name in cfg.methods():
            if not finished(Path(cfg.out) / "train" / name):
                todo.append(Job("train", cfg, str(student), train, name))
        jobs += sorted(todo, key=lambda j: -EXPECTED_COST.get(j.method, 1.0))
    return jobs


def run_seed_runs(
    seed_cfgs: Sequence[Any],
    student: Path,
    workers: int,
    log: Any,
    train: Callable[..., Any],
    finish: Callable[..., Any],
) -> None:
    """Every seed run's trainings (`train`), then its finish job (`finish`), on `workers` processes (1: in this
    process, in order). At most `workers` jobs are in flight; a free worker takes a ready finish job before the next
    training. The functions travel to the workers by name (module-level ones: `run.train_runs`, `run.finish_seed`)."""
    queue = training_jobs(seed_cfgs, student, train)
    left = {cfg.out: sum(j.cfg.out == cfg.out for j in queue) for cfg in seed_cfgs}
    for cfg in seed_cfgs:
        done = [n for n in cfg.methods() if not any(j.cfg.out == cfg.out and j.method == n for j in queue)]
        if done:
            log(f"{cfg.out}: train {', '.join(done)}: done, skipped")
    ready = [Job("finish", cfg, str(student), finish) for cfg in seed_cfgs if left[cfg.out] == 0]
    if workers <= 1:
        for serial in queue + [Job("finish", cfg, str(student), finish) for cfg in seed_cfgs if left[cfg.out]] + ready:
            log(f"{serial.cfg.out}: {serial.name} ...")
            log(f"{serial.cfg.out}: {serial.name} done ({run_job(serial, redirect=False):.0f} s)")
        return

    configure()  # OMP_WAIT_POLICY=PASSIVE unless set: the workers inherit it (their torch loads after it)
    ctx = get_context("spawn")  # a fresh interpreter per worker: no forked torch / tokenizer thread state
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(list(sys.argv), seed_cfgs[0].job_threads, os.getpid()),
    ) as pool:
        running: dict[Future, Job] = {}
        job: Job | None = None
        try:
            while queue or ready or running:
                while len(running) < workers and (ready or queue):
                    job = ready.pop(0) if ready else queue.pop(0)
                    running[pool.submit(run_job, job)] = job
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    job = running.pop(fut)
                    log(f"{job.cfg.out}: {job.name} done ({fut.result():.0f} s)")  # re-raises the job's error
                    if job.kind == "train":
                        left[job.cfg.out] -= 1
                        if left[job.cfg.out] == 0:
                            ready.append(Job("finish", job.cfg, str(student), finish))
        except BaseException as e:
            if job is not None and not isinstance(e, KeyboardInterrupt):
                log(f"{job.cfg.out}: {job.name} failed (log {job.log}); stopping the other jobs (a rerun resumes)")
            for proc in list(getattr(pool, "_processes", {}).values()):  # running jobs stop now, not at their end
                proc.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            if isinstance(e, BrokenProcessPool) and job is not None:
                raise TrainingError(
                    f"a demo worker died while running {job.cfg.out}: {job.name} (killed by the "
                    "system, e.g. out of memory); rerun `mechopd demo` to resume, or pass --workers 1"
                ) from None
            raise


def seed_configs(cfg: Any) -> list[Any]:
    """The seed runs of a demo config: itself with one seed, ``OUT/seed-k`` (seed k, seeds 1) with several (each
    becomes a `run.SeedRun`: `demo.seed_run`)."""
    if cfg.seeds <= 1:
        return [cfg]
    return [
        replace(cfg, out=str(Path(cfg.out) / f"seed-{k}"), seed=k, seeds=1, full_stages=k == 0)
        for k in range(cfg.seeds)
    ]
