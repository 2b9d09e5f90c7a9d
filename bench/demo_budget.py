"""The default demo's time budget and thread-count identity (#20): `mechopd demo` from an empty directory.

Runs ``mechopd demo`` (the default: rules, 3 seeds, organism pretraining included) in a fresh temporary directory as a
newcomer would, prints its wall time against the 5-minute budget (ratio and PASS/FAIL) and the stage times from its
log. With ``--threads 1`` it runs a second demo under ``OMP_NUM_THREADS=1`` (one worker) in another empty directory and
checks that both wrote the same numbers: the organism's weights, every final checkpoint, every metrics.jsonl (wall-time
fields aside), every evaluation report, and the claims table's verdicts.

Another float order (#33: "a verdict must survive another float order"): ``--isa avx2`` runs the second demo with
PyTorch, MKL and oneDNN held to AVX2 kernels (``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``,
``ONEDNN_MAX_CPU_ISA``), as on a CPU without AVX-512: other summation orders, so other per-seed numbers (organism
included); ``--job-threads N`` passes ``mechopd demo --workers 1 --job-threads N``. Either prints how many files got
other numbers (0 means the check could not perturb anything here: said, not passed) and which verdicts differ (PASS:
none).

Before and after a change (#43: "the demo's files are identical before and after, timings aside"): ``--against REV``
runs the second demo on the code of git revision REV (a detached worktree of this repository, on PYTHONPATH) and
compares the same numbers plus every probe table (``*.csv``) and figure (``*.png``) byte for byte, and the verdicts
(PASS: nothing differs).

    python bench/demo_budget.py [--threads 1 | --isa avx2 | --job-threads 2 | --against REV] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S = 300.0
TIMED = ("_s", "tokens_per_s")


ISA_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def run_demo(where: Path, env: dict[str, str], args: tuple[str, ...] = ()) -> tuple[float, str]:
    where.mkdir(parents=True)
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "mechopd.cli", "demo", *args], cwd=where, env=env, capture_output=True, text=True
    )
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"mechopd demo failed in {where} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, proc.stdout


def _digest(p: Path) -> str:
    return hashlib.sha1(p.read_bytes()).hexdigest()


def _timed(key: str) -> bool:
    """A wall-clock field of metrics.jsonl: ``*_s``, ``tokens_per_s``, and the per-stage profile's ``time/STAGE`` and
    ``tokens_per_s/STAGE`` (`train/profile.py`)."""
    return key.endswith(TIMED) or key.startswith(("time/", "tokens_per_s/"))


def _metrics(p: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not _timed(k)} for line in p.open()]


def same_numbers(a: Path, b: Path) -> list[str]:
    """What differs between two demo directories' numbers (empty: nothing)."""
    diffs = []
    for f in sorted(a.rglob("*.safetensors")):
        if _digest(f) != _digest(b / f.relative_to(a)):
            diffs.append(str(f.relative_to(a)))
    for f in sorted(a.rglob("metrics.jsonl")):
        if _metrics(f) != _metrics(b / f.relative_to(a)):
            diffs.append(str(f.relative_to(a)))
    for f in sorted(a.glob("runs/demo/seed-*/eval/*.json")):
        x, y = (json.loads(p.read_text()) for p in (f, b / f.relative_to(a)))
        if x.get("summary") != y.get("summary") or x.get("other_contexts") != y.get("other_contexts"):
            diffs.append(str(f.relative_to(a)))
    return diffs


def verdicts(root: Path) -> list[tuple[str, str]]:
    from mechopd.report.claims import evaluate_claims

    return [(c.claim, c.verdict) for c in evaluate_claims(sorted((root / "runs" / "demo").glob("seed-*")))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="also run under OMP_NUM_THREADS=N and compare")
    p.add_argument("--isa", choices=sorted(ISA_ENV), default=None, help="also run on these CPU kernels and compare")
    p.add_argument("--job-threads", type=int, default=None, help="also run --workers 1 --job-threads N and compare")
    p.add_argument("--against", default=None, help="also run the demo of git revision REV and compare every file")
    p.add_argument("--keep", default=None, help="run in this (new) directory and keep it")
    a = p.parse_args()
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="mechopd-demo-"))
    try:
        env = dict(os.environ)
        wall, log = run_demo(root / "default", env)
        print(
            f"mechopd demo from an empty directory: {wall:.0f} s; budget {BUDGET_S:.0f} s; ratio "
            f"{wall / BUDGET_S:.2f}: {'PASS' if wall <= BUDGET_S else 'FAIL'}"
        )
        for line in log.splitlines():
            if re.search(r"organism:|seed runs on|finish done|report:", line):
                print("  " + line)
        if a.isa or a.job_threads:
            return other_float_order(root, env, a, wall)
        if a.against:
            return against_revision(root, env, a.against, wall)
        if a.threads is None:
            return 0 if wall <= BUDGET_S else 1
        wall2, _ = run_demo(root / f"omp{a.threads}", {**env, "OMP_NUM_THREADS": str(a.threads)})
        diffs = same_numbers(root / "default", root / f"omp{a.threads}")
        v1, v2 = verdicts(root / "default"), verdicts(root / f"omp{a.threads}")
        flips = [c for (c, x), (_, y) in zip(v1, v2) if x != y]
        print(
            f"OMP_NUM_THREADS={a.threads}: {wall2:.0f} s; files with other numbers: {len(diffs)} "
            f"{diffs[:5]}; verdicts that differ: {len(flips)} of {len(v1)} {flips}"
        )
        return 0 if wall <= BUDGET_S and not diffs and not flips else 1
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


def against_revision(root: Path, env: dict[str, str], rev: str, wall: float) -> int:
    """The second demo on revision ``rev``'s code; PASS when no number, table, figure or verdict differs."""
    repo = Path(__file__).resolve().parents[1]
    tree = root / f"src-{rev}"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(tree), rev], check=True)
    try:
        wall2, _ = run_demo(root / f"rev-{rev}", {**env, "PYTHONPATH": str(tree)})
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], check=False)
    a, b = root / "default", root / f"rev-{rev}"
    diffs = same_numbers(a, b)
    for pattern in ("runs/demo/**/*.csv", "runs/demo/**/*.png"):
        diffs += [str(f.relative_to(a)) for f in sorted(a.glob(pattern)) if _digest(f) != _digest(b / f.relative_to(a))]
    v1, v2 = verdicts(a), verdicts(b)
    flips = [f"{c}: {y} -> {x}" for (c, x), (_, y) in zip(v1, v2) if x != y]
    print(
        f"revision {rev}: {wall2:.0f} s; files that differ (timings aside): {len(diffs)} {diffs[:5]}; verdicts "
        f"that differ: {len(flips)} of {len(v1)} {flips}: {'PASS' if not diffs and not flips else 'FAIL'}"
    )
    return 0 if not diffs and not flips else 1


def other_float_order(root: Path, env: dict[str, str], a: argparse.Namespace, wall: float) -> int:
    """The second demo on another float order; PASS when no verdict differs (and the numbers did change)."""
    name = f"isa-{a.isa}" if a.isa else f"job-threads-{a.job_threads}"
    extra = ("--workers", "1", "--job-threads", str(a.job_threads)) if a.job_threads else ()
    wall2, _ = run_demo(root / name, {**env, **ISA_ENV.get(a.isa or "", {})}, extra)
    diffs = same_numbers(root / "default", root / name)
    v1, v2 = verdicts(root / "default"), verdicts(root / name)
    flips = [f"{c}: {x} -> {y}" for (c, x), (_, y) in zip(v1, v2) if x != y]
    decided = sum(v in ("holds", "does not hold") for _, v in v1)
    print(
        f"{name}: {wall2:.0f} s; files with other numbers: {len(diffs)} (the float order "
        f"{'changed' if diffs else 'did NOT change here: the check says nothing'}); verdicts that differ: "
        f"{len(flips)} of {len(v1)} {flips}; decided {decided} of {len(v1)}: "
        f"{'PASS' if diffs and not flips else 'FAIL' if flips else 'NOT MEASURED'}"
    )
    return 0 if wall <= BUDGET_S and diffs and not flips else 1


if __name__ == "__main__":
    raise SystemExit(main())
