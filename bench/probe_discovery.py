"""CLI start-up with the probes found by discovery (each probe registers at the end of its own module) against a
reference tree (e.g. main, where `probes/builtin.py` listed them without importing the probe modules).

    python bench/probe_discovery.py --ref /work/main [--repeat 7]

Runs ``mechopd --help`` and ``mechopd probe similarity --help`` in fresh interpreters, alternating this tree and the
reference (PYTHONPATH), after one untimed start of each that writes its bytecode, and prints the minimum wall and CPU (user + system) time of each and the ratio this /
reference (below 1: faster). The minimum is the least noisy statistic on a shared machine; CPU time does not count
the waits for a busy core.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
COMMANDS = {"mechopd --help": ["--help"], "mechopd probe similarity --help": ["probe", "similarity", "--help"]}


def once(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the child) of one start."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # both trees start from bytecode
    env.update(PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import sys; from mechopd.cli import main; sys.exit(main())", *args],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t0, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", required=True, help="the reference tree (its parent dir of mechopd/), e.g. /work/main")
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()
    for name, args in COMMANDS.items():
        times: dict[str, list[tuple[float, float]]] = {"this": [], "ref": []}
        once(HERE, args), once(Path(a.ref), args)  # not timed: writes each tree's bytecode (no compile in a timed run)
        for _ in range(a.repeat):
            times["this"].append(once(HERE, args))
            times["ref"].append(once(Path(a.ref), args))
        for i, what in enumerate(("wall", "cpu")):
            this, ref = (min(t[i] for t in times[k]) for k in ("this", "ref"))
            print(f"{name:34s} {what:4s} this {this:6.2f} s   ref {ref:6.2f} s   ratio {this / ref:.3f}")


if __name__ == "__main__":
    main()
