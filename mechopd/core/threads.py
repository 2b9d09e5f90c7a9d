"""How a mechopd process's OpenMP threads wait: chosen before torch loads (`configure`; issue 58).

OpenMP's default wait policy lets a thread that waits at a barrier spin for a while before it sleeps. On a shared
2-core machine, a spinning thread takes the core that the other thread (or another process) needs, and a 2-thread
step becomes slower than a 1-thread one: measured 10-15x slower (a SmolLM2 decode step at load 6-7, 2.2-2.8 s on
2 threads against 0.17-0.21 s on 1). With ``OMP_WAIT_POLICY=PASSIVE`` a waiting thread sleeps at once; it changes
no number (only how a thread waits), and `bench/threads.py` measures both policies, quiet and with a busy core.

libgomp reads the variable once, when torch loads, so `configure` must run before ``import torch``: the CLI calls it
first thing (`mechopd.cli`), and the worker pool (`mechopd.pipeline.pool`) calls it before it spawns its workers,
which inherit the environment. A value the user set is kept as is (``OMP_WAIT_POLICY=ACTIVE`` still spins).

This module imports nothing but the standard library.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

POLICY_ENV = "OMP_WAIT_POLICY"
POLICY = "PASSIVE"  # a waiting OpenMP thread sleeps at once instead of spinning on a core another needs
_SET_LATE: list[bool] = []  # `configure` set the policy after this process had loaded torch (libgomp never saw it)


def configure(environ: MutableMapping[str, str] | None = None) -> str:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in `environ` (default ``os.environ``) unless it is set; returns a line saying
    which policy holds and why. Effective for this process only when torch is not imported yet (the line says so);
    always for the processes started from it."""
    env = os.environ if environ is None else environ
    if env.get(POLICY_ENV):
        return f"OpenMP wait policy {env[POLICY_ENV]} (set by {POLICY_ENV})"
    env[POLICY_ENV] = POLICY
    late = environ is None and "torch" in sys.modules
    if late:
        _SET_LATE.append(True)
    return f"OpenMP wait policy {POLICY} (default: idle threads sleep{'; from the next process on' if late else ''})"


def passive() -> bool:
    """Whether this process's OpenMP threads sleep when they wait: ``OMP_WAIT_POLICY=PASSIVE`` read when torch loaded
    (a value `configure` set after that holds from the next process on, not here)."""
    return os.environ.get(POLICY_ENV, "").upper() == POLICY and not _SET_LATE


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows: no affinity call
        return max(1, os.cpu_count() or 1)
