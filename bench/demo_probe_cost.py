"""What running weightpatch and localization on every seed (not seed 0 only) costs the demo (#28).

The claims ``qk_causal_rule`` / ``qk_causal_harm`` and the report's localization curve are statistics over seeds, so
The demo's first-seed-only probes (`first_seed_only`, mechopd/data/studies/rules.yaml) no longer hold these two:
seeds k >= 1 run them too. This script runs
``mechopd demo --fast --seeds S --workers 1`` (one worker: the wall time is the sum of the jobs) in a fresh temporary
directory, reruns the two probes on every seed k >= 1 with the demo's own options (`ProbeSpec.demo`, in process as the demo
calls them, timed one by one), and prints

    extra   = Σ_{k >= 1} (t_weightpatch(k) + t_localization(k))      the probe seconds the change adds
    share   = extra / wall                                           of the whole demo (organism included)
    ratio   = wall / (wall − extra)                                  the demo with the two probes vs without

``--fast`` is the test-suite demo (a tiny organism, a few steps): its shares are those of a short demo; the default
demo's probe/training split is in the same direction but not the same size (measure it with ``--full``).

    python bench/demo_probe_cost.py [--seeds 2] [--full] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBES = ("weightpatch", "localization")


def _run(args: list[str], cwd: Path) -> float:
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "mechopd.cli", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"mechopd {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return time.time() - t0


def time_probe(name: str, run: Path) -> float:
    """Seconds of one probe on a seed run, in process, with the demo's options (the registry's ``demo``; roles are
    the run's names) and the run's own setup, as the demo calls it (`ProbeSpec.__call__`)."""
    from mechopd.probes.registry import demo_options, probes
    from mechopd.probes.setup import ProbeSetup
    from mechopd.runset import RunSet

    spec = next(s for s in probes() if s.name == name)
    opts = demo_options(spec, RunSet.load(run))
    if opts is None:
        raise SystemExit(f"probe {name}: its demo roles name no run of {run}")
    setup = ProbeSetup.from_run(run)
    t0 = time.time()
    spec(setup, run / "probes", **opts)
    return time.time() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=2, help="training seeds (>= 2: the change concerns seeds k >= 1)")
    p.add_argument("--full", action="store_true", help="the default demo instead of --fast (minutes to hours)")
    p.add_argument("--keep", default=None, help="run in this (new) directory and keep it")
    a = p.parse_args()
    if a.seeds < 2:
        p.error("--seeds must be >= 2: seed 0 always ran the two probes")
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="mechopd-probe-cost-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        demo = [
            "demo",
            "--out",
            "runs/demo",
            "--seeds",
            str(a.seeds),
            "--workers",
            "1",
            *([] if a.full else ["--fast"]),
        ]
        wall = _run(demo, root)
        extra = 0.0
        for k in range(1, a.seeds):
            run = root / "runs" / "demo" / f"seed-{k}"
            for name in PROBES:
                t = time_probe(name, run)
                extra += t
                print(f"  seed-{k} {name}: {t:.1f} s (rerun in process, the demo's options)")
        print(
            f"mechopd demo {'' if a.full else '--fast '}--seeds {a.seeds} --workers 1: {wall:.1f} s; the two probes "
            f"on seeds >= 1: {extra:.1f} s; share of the demo {extra / wall:.3f}; demo with / without them "
            f"{wall / max(wall - extra, 1e-9):.3f}"
        )
        return 0
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
