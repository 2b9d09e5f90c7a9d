"""Benchmark: prefix groups (generate/groups.py) on mechopd's own sample data, in ONE run.

Data: `mechopd/data/sample_qa.jsonl` with its shared context `sample_context.txt` (the jsonl task's sample: 2 of the 40
items carry their own context; ~365 context tokens, ~420-token context-view prompts with the word-level tokenizer
below), and the same items with those two per-item contexts removed ("one shared context"). Model: the organism's
shape (Qwen3, hidden 96, 3 layers, word-level tokenizer covering the task's words; bench/long_context.py's
`build_model`: random init, special tokens never sampled, so every response runs to --new-tokens).

  nca_mixed / nca_mixed_off   Trainer(method=nca, estimator=full).train_step() on the sample data, shared_prefix
                              auto (prefix groups) / off
  nca_one / nca_one_off       the same with one shared context
Variants run interleaved step by step (first --warmup dropped); ratios are paired (median over cycles of off / auto
in the same cycle, bootstrap 95% interval; bench/train_step.py's `_ratio_line`). Losses: step 1's loss of the shared
run against the unshared run's (same seed: same items, same rollouts; relative), and every step's (absolute).
Targets (issue #24): mixed >= 1.6x, one context >= 1.8x, losses equal (relative 1e-4).

    python bench/prefix_groups.py [--steps 12] [--warmup 2] [--batch 16] [--new-tokens 24] [--threads auto]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import long_context as lc  # noqa: E402  (build_model)
import torch  # noqa: E402
import train_step as ts  # noqa: E402  (_ratio_line, pick_threads, quiet, run_interleaved)

DATA = Path(__file__).resolve().parents[1] / "mechopd" / "data"
TARGETS = [
    ("mixed contexts: unshared / groups", "nca_mixed_off", "nca_mixed", 1.6),
    ("one context: unshared / shared", "nca_one_off", "nca_one", 1.8),
]


def task_options(root: Path) -> dict[str, dict]:
    """The sample data as shipped, and a copy whose items carry no context of their own."""
    one = root / "sample_qa_one_context.jsonl"
    rows = [json.loads(x) for x in (DATA / "sample_qa.jsonl").read_text().splitlines() if x.strip()]
    own = sum("context" in r for r in rows)
    one.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "context"}) + "\n" for r in rows))
    ctx = str(DATA / "sample_context.txt")
    print(f"sample data: {len(rows)} items, {own} with their own context")
    return {
        "mixed": {"path": str(DATA / "sample_qa.jsonl"), "context_file": ctx},
        "one": {"path": str(one), "context_file": ctx},
    }


def nca_step(path: Path, root: Path, name: str, opts: dict, mode: str, args, log: dict) -> Callable:
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import Trainer

    cfg = TrainConfig(
        student=str(path),
        task="jsonl",
        task_options=opts,
        method="nca",
        estimator="full",
        batch_size=args.batch,
        max_new_tokens=args.new_tokens,
        steps=10**6,
        lr=1e-5,
        seed=args.seed,
        shared_prefix=mode,
        eval_every=0,
        save_every=0,
        pool_size=31,
    )  # the 31 train items
    trainer = Trainer(cfg, out_dir=root / name, progress=False)
    log[name] = []

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        rec = trainer.train_step()
        dt = time.perf_counter() - t0
        log[name].append(rec)
        return dt, rec["response_len"]

    return step


def report(times: dict, log: dict, batch: int) -> bool:
    import statistics

    ok = True
    print(f"\n{'variant':>14} {'median ms':>10} {'shared tokens':>14} {'shared rows':>12}")
    for k, t in times.items():
        recs = log[k]
        print(
            f"{k:>14} {statistics.median(t) * 1e3:10.1f} {statistics.median(r['shared_prefix'] for r in recs):14.0f}"
            f" {statistics.fmean(r['prefix/shared_rows'] for r in recs):9.1f}/{batch}"
        )
    print(f"\n{'ratio':<38} {'paired':>7} {'95% CI':>13} {'overall':>8}  target")
    for label, num, den, bound in TARGETS:
        (paired, _, _), line = ts._ratio_line(label, times[num], times[den])
        ok &= paired >= bound
        print(line.format(f">= {bound}  {'PASS' if paired >= bound else 'FAIL'}"))
    for data in ("mixed", "one"):
        a, b = log[f"nca_{data}"], log[f"nca_{data}_off"]
        first = abs(a[0]["loss"] - b[0]["loss"]) / max(abs(b[0]["loss"]), 1e-12)  # step 1: identical inputs
        worst = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
        good = first <= 1e-4 and worst <= 1e-5
        ok &= good
        print(
            f"losses {data}: step 1 {a[0]['loss']:.6g} vs {b[0]['loss']:.6g} (relative {first:.1e}); max |loss "
            f"shared - unshared| over {len(a)} steps {worst:.1e}  (<= 1e-4 rel, 1e-5 abs {'PASS' if good else 'FAIL'})"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", default="auto")
    args = ap.parse_args(argv)
    ts.quiet()
    torch.set_num_threads(ts.pick_threads(args.threads))
    with tempfile.TemporaryDirectory(prefix="mechopd-bench-groups-") as tmp:
        root = Path(tmp)
        opts = task_options(root)
        path = lc.build_model(root / "model", args.hidden, args.seed, opts["mixed"])
        print(
            f"torch {torch.__version__}, threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}, hidden "
            f"{args.hidden}, batch {args.batch}, new tokens {args.new_tokens}; {args.steps} steps after "
            f"{args.warmup} warm-up"
        )
        log: dict[str, list] = {}
        variants = {
            f"nca_{d}{s}": nca_step(path, root, f"nca_{d}{s}", opts[d], m, args, log)
            for d in ("mixed", "one")
            for s, m in (("", "auto"), ("_off", "off"))
        }
        times, _ = ts.run_interleaved(variants, args.steps, args.warmup)
        ok = report(times, log, args.batch)
    print(f"overall: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
