"""Benchmark: a real-model decode step on 1 vs 2 intra-op threads, quiet and with one busy core, per OpenMP wait policy.

Why (issue 58): with OpenMP's default wait policy an idle worker thread spins; on a 2-core machine where anything else
runs, the spinning thread takes the core the other thread needs and a 2-thread step became 10-15x slower than a
1-thread one. `mechopd.core.threads.configure` (run by the CLI before torch loads, and by the worker pool for its
workers) sets ``OMP_WAIT_POLICY=PASSIVE`` unless the user set one.

Method. Each cell is a fresh subprocess (libgomp reads its policy once, at load) with ``OMP_WAIT_POLICY`` as named
(``unset``: OpenMP's default) and ``torch.set_num_threads(n)``; it loads the model (fp32), prefills --batch rows,
then times --steps lean decode steps (`generate/lean.py`, its projections laid out as in mechopd's rollouts:
`generate/layout.py`) --reps times and prints the
median per step. "busy" runs a Python spin loop on one core (a process started here, ended here) for the whole
cell. Cells run interleaved, --rounds times; the table gives per cell the median over rounds and the range, and
the ratio 2 threads / 1 thread of the same policy and condition, paired by round. Each 2-thread cell also times its
steps as mechopd's sampler runs them (`sampler.decode_threads`: one thread under PASSIVE), interleaved with the raw
2-thread steps in the same process: the "mechopd" columns.

    python bench/threads.py [--model model:smollm2-135m-instruct] [--batch 4] [--steps 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import contextlib, json, os, sys, time, statistics
import torch
from transformers import AutoModelForCausalLM
from mechopd.generate.lean import LeanDecoder, projections
from mechopd.generate.layout import laid_out
torch.set_num_threads(int(sys.argv[2]))
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
B, steps, reps = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
g = torch.Generator().manual_seed(0)
ids = torch.randint(100, 1000, (B, 48), generator=g)
mask = torch.ones_like(ids)
pos = torch.arange(48)[None].expand(B, -1)
from mechopd.generate.sampler import decode_threads
times = {"step_s": [], "rule_s": []}
with torch.inference_mode(), laid_out(projections(model)):  # the projections as the rollouts run them (generate/layout.py)
    for r in range(reps + 1):
        for key in ("step_s", "rule_s") if r % 2 else ("rule_s", "step_s"):
            dec = LeanDecoder(model)
            logits = dec.prefill(ids, mask, pos, steps)
            tok, p = logits.argmax(-1), torch.full((B, 1), 48)
            with decode_threads(ids.device) if key == "rule_s" else contextlib.nullcontext():
                t0 = time.perf_counter()
                for s in range(steps):
                    tok = dec.step(tok, p + s).argmax(-1)
                dt = time.perf_counter() - t0
            if r:
                times[key].append(dt / steps)
print(json.dumps({k: statistics.median(v) for k, v in times.items()}))
"""

SPIN = "while True: pass"


def cell(model: str, policy: str, threads: int, busy: bool, a: argparse.Namespace) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy != "unset":
        env["OMP_WAIT_POLICY"] = policy
    spinner = subprocess.Popen([sys.executable, "-c", SPIN]) if busy else None
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, model, str(threads), str(a.batch), str(a.steps), str(a.reps)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return {k: float(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="model:smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per repetition")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per cell (median), after one warm-up")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all cells")
    ap.add_argument("--policies", default="unset,PASSIVE")
    ap.add_argument("--conditions", default="quiet,busy")
    a = ap.parse_args(argv)
    model = a.model
    if model.startswith("model:"):
        from mechopd.models.fetch import resolve_fetched

        model = resolve_fetched(model)
    cells = [(p, n, c) for c in a.conditions.split(",") for p in a.policies.split(",") for n in (1, 2)]
    got: dict[tuple[str, int, str], list[dict[str, float]]] = {k: [] for k in cells}
    print(f"load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}, cores {os.cpu_count()}")
    t0 = time.time()
    for r in range(a.rounds):
        for k in cells:
            got[k].append(cell(model, k[0], k[1], k[2] == "busy", a))
        print(f"round {r + 1}: load {os.getloadavg()[0]:.2f}, {time.time() - t0:.0f} s", flush=True)
    print(
        f"\ndecode step, batch {a.batch}, ms (median over {a.rounds} rounds [min-max]); 2t/1t paired by round; "
        "'2 threads' as set, 'mechopd' its steps under `sampler.decode_threads` (one thread under PASSIVE)"
    )
    print(
        f"{'condition':<9} {'policy':<8} {'1 thread':>16} {'2 threads':>16} {'2t / 1t':>16} {'mechopd':>16} {'/ 1t':>16}"
    )

    def fmt(v: list[float]) -> str:
        return f"{statistics.median(v) * 1e3:.1f} [{min(v) * 1e3:.0f}-{max(v) * 1e3:.0f}]"

    def ratio(x: list[float], y: list[float]) -> str:
        r = [b / a for a, b in zip(x, y)]
        return f"{statistics.median(r):.2f} [{min(r):.2f}-{max(r):.2f}]"

    for c in a.conditions.split(","):
        for p in a.policies.split(","):
            one = [d["step_s"] for d in got[(p, 1, c)]]
            two, rule = [d["step_s"] for d in got[(p, 2, c)]], [d["rule_s"] for d in got[(p, 2, c)]]
            print(
                f"{c:<9} {p:<8} {fmt(one):>16} {fmt(two):>16} {ratio(one, two):>16} {fmt(rule):>16} {ratio(one, rule):>16}"
            )
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
