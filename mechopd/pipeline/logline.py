"""The pipeline's log lines, ``[<who> HH:MM:SS] message``: ``demo`` under `mechopd demo`, ``run`` under `mechopd run`
(`as_run` sets it for the study, in this process and the workers it starts, which inherit the environment)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

ENV = "MECHOPD_LOG_PREFIX"


def say(msg: str) -> None:
    print(f"[{os.environ.get(ENV) or 'demo'} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@contextlib.contextmanager
def as_run(who: str = "run") -> Iterator[None]:
    """Within the block, the pipeline's lines begin ``[who ...]`` (restored after)."""
    old = os.environ.get(ENV)
    os.environ[ENV] = who
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old
