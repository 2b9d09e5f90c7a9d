"""Stand-in jobs for the demo pool's signal tests (`test_hostile_signals.py`): importable by the spawn workers.

`run(out, mode)` is the parent: it holds ``out`` as the demo does (`demo_pool.hold_demo_out`) and runs two training
jobs and a finish job on two workers. A training job holds its own run lock (as the trainer does), writes
``<out>/started-<method>`` and then sleeps (``mode`` "sleep"), or fails (``mode`` "enospc": an ENOSPC OSError;
"safetensors": safetensors' own error type for a full disk).
"""

from __future__ import annotations

import errno
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Cfg:
    out: str
    mode: str = "sleep"
    job_threads: int = 1

    def methods(self) -> dict[str, dict]:
        return {"opd": {}, "nca": {}}


def train(cfg: Cfg, student: Path, run: Path, methods: dict) -> None:
    from mechopd.core.runlock import hold

    name = next(iter(methods))
    with hold(run / "train" / name, "train"):
        (run / f"started-{name}").write_text("1")
        if cfg.mode == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device", str(run / "train" / name / "model.safetensors"))
        if cfg.mode == "safetensors":
            from safetensors import SafetensorError

            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        for _ in range(600):
            time.sleep(0.1)
        (run / "train" / name / "final").mkdir()


def finish(cfg: Cfg, student: Path | None = None) -> None:
    (Path(cfg.out) / "finished").write_text("1")


def run(out: str, mode: str) -> None:
    from mechopd.pipeline.pool import hold_demo_out, run_seed_runs

    with hold_demo_out(out):
        run_seed_runs([Cfg(out, mode)], Path(out), 2, lambda m: print(m, flush=True), train, finish)


if __name__ == "__main__":
    from mechopd.core.errors import MechopdError

    try:
        run(sys.argv[1], sys.argv[2])
    except KeyboardInterrupt:  # as `mechopd.cli.main`; any other error than these two: a traceback
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except MechopdError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
