"""How the default rules study was chosen (#33): train demo-method variants × seeds on the rules organism and print
each run's held-out Acc_x / Acc_xc / Harm at every evaluation (the trajectory) and at the last step.

Each run is `mechopd.train.trainer.train` with the demo's recipe fields (100 steps × 32 prompts, linear decay, eval
every 25 steps on 200 items) plus the variant's; jobs run on worker processes, one pinned thread each, as the demo's.
The organism must exist (`mechopd pretrain --task rules`, or any `mechopd demo` run). The tables of docs/results.md,
"Choosing the default study", were made with it, e.g.:

    python bench/study_sweep.py --rule reverse --lr 2e-3 --seeds 0,1,2,3,4 --methods opd,nca_s30,ta_opd_k2
    python bench/study_sweep.py --rule shift:1 --lr 1e-3 --seeds 0,1,2 --methods opd,nca_gate
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

VARIANTS = {  # the demo's runs and the alternatives that were measured
    "opd": {"method": "opd", "selector": "full"},
    "nca_gate": {"method": "nca", "selector": "full", "beta": 0.5, "nca_gate": 0.1, "nca_gate_window": 5},
    "nca_s30": {"method": "nca", "selector": "full", "beta": 0.5, "nca_start": 30},
    "nca_s40": {"method": "nca", "selector": "full", "beta": 0.5, "nca_start": 40},
    "nca_const": {"method": "nca", "selector": "full", "beta": 0.5, "nca_start": 0},
    "ta_opd": {"method": "opd", "selector": "ta_opd", "budget": 0.10, "min_one_per_response": False, "k": 16},
    "ta_opd_k4": {"method": "opd", "selector": "ta_opd", "budget": 0.10, "min_one_per_response": False, "k": 4},
    "ta_opd_k2": {"method": "opd", "selector": "ta_opd", "budget": 0.10, "min_one_per_response": False, "k": 2},
}


def job(args: tuple[str, dict, str]) -> str:
    name, cfg, out = args
    import torch

    torch.set_num_threads(1)
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import train

    if not Path(out, "final", "training.json").exists():
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            train(TrainConfig(**cfg), out)
    return name


def trajectory(out: str) -> tuple[str, tuple]:
    lines = [json.loads(x) for x in Path(out, "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [(r["step"], r["eval/acc_x"], r["eval/acc_xc"], r.get("eval/harm")) for r in lines if "eval/acc_x" in r]
    cell = " | ".join(f"{s}: {a:.2f}/{c:.2f}/{'n/a' if h is None else f'{h:.2f}'}" for s, a, c, h in evals)
    return cell, evals[-1][1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rule", default="reverse")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--methods", default="opd,nca_s30")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--organism", default="runs/organisms/rules")
    p.add_argument("--out", default="runs/study_sweep")
    p.add_argument(
        "--set", action="append", default=[], help='KEY=JSON_VALUE added to every run, e.g. lr_schedule="constant"'
    )
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    extra = {k: json.loads(v) for k, v in (s.split("=", 1) for s in a.set)}
    jobs = []
    for seed in (int(s) for s in a.seeds.split(",")):
        for m in a.methods.split(","):
            cfg = {
                "task": "rules",
                "task_options": {"rule": a.rule},
                "student": a.organism,
                "steps": a.steps,
                "batch_size": 32,
                "lr": a.lr,
                "lr_schedule": "linear",
                "estimator": "full",
                "seed": seed,
                "eval_every": 25,
                "eval_n": 200,
                "save_every": a.steps,
                **VARIANTS[m],
                **extra,
            }
            out = str(Path(a.out) / f"{a.rule.replace(':', '_')}-lr{a.lr:g}" / f"s{seed}" / m)
            jobs.append((f"{m} seed {seed}", cfg, out))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with ProcessPoolExecutor(a.workers, mp_context=get_context("spawn")) as pool:
        list(pool.map(job, jobs))
    print(f"rule {a.rule}, lr {a.lr:g}, {a.steps} steps; per evaluation step: Acc_x / Acc_xc / Harm")
    for name, _, out in jobs:
        cell, (acc_x, acc_xc, harm) = trajectory(out)
        print(f"{name:18s} final {acc_x:.2f}/{acc_xc:.2f}/{'n/a' if harm is None else f'{harm:.2f}'}   ({cell})")


if __name__ == "__main__":
    main()
