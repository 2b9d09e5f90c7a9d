"""Benchmark: both-view evaluation (`mechopd.evaluation.evaluate.evaluate_model` on the rules task) against a bare batched
`generate` loop over the same prompts, measured interleaved in ONE run.

  evaluate   evaluate_model(model, tok, rules, EvalConfig(n=N)): greedy, both views of N held-out items in batched
             generation calls of 256 prompts, scoring, parsing, and the paired bootstrap summary (n_boot 1000).
  generate   the bare loop: render the same 2N prompt texts (chat template; same order as evaluate_model: item by
             item, no-context then context view), tokenize them in one batched call, ``model.generate`` (greedy, KV
             cache, same max_new_tokens and stop id) in chunks of 256 left-padded prompts, ``batch_decode`` the
             new tokens. No scoring.

Target: evaluate's time <= 1.2 x generate's (PASS/FAIL printed), i.e. items/s >= generate's / 1.2.

The model is the random-init rules organism of `bench/train_step.py` (special tokens never generated), so every
response runs to the task's max_new_tokens in both variants (mean generated lengths are printed and checked).
Rounds alternate (evaluate, generate, evaluate, ...); round 0 is warm-up and dropped. The verdict is the median of the
per-round ratios; the ratio of overall medians is printed next to it. The evaluate variant also reports where its
time goes (generation via `sample_rows`, scoring + summary) from timers wrapped around those functions.

    python bench/eval.py [--n 200] [--rounds 20] [--threads auto] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import build_organism, pick_threads, quiet  # noqa: E402

TARGET = 1.2
PHASES: dict[str, float] = collections.defaultdict(float)


def _timed(fn: Any, label: str) -> Any:
    @functools.wraps(fn)
    def inner(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            PHASES[label] += time.perf_counter() - t0

    return inner


def instrument() -> None:
    """Accumulate evaluate_model's generation and summary time in PHASES (wrappers cost microseconds)."""
    import mechopd.evaluation.evaluate as ev

    ev.sample_rows = _timed(ev.sample_rows, "sample")
    ev.summarize = _timed(ev.summarize, "summarize")
    ev.render_prompt_ids = _timed(ev.render_prompt_ids, "render")
    ev._check_vocab = _timed(ev._check_vocab, "check_vocab")


def run_evaluate(model: Any, tok: Any, task: Any, n: int) -> tuple[float, float]:
    """Seconds and mean generated tokens per response (both views)."""
    from mechopd.evaluation.evaluate import EvalConfig, evaluate_model

    t0 = time.perf_counter()
    rep = evaluate_model(model, tok, task, EvalConfig(n=n))
    dt = time.perf_counter() - t0
    lens = [r[k] for r in rep["records"] for k in ("len_x", "len_xc")]
    return dt, statistics.fmean(lens)


class GenerateLoop:
    """The bare reference: chat template -> batched tokenize -> generate in chunks -> batch_decode."""

    def __init__(self, model: Any, tok: Any, task: Any, n: int, batch: int = 256):
        from mechopd.evaluation.evaluate import EvalConfig
        from mechopd.generate.settings import stop_ids

        self.model, self.tok, self.batch = model, tok, batch
        items = task.examples("test", n, EvalConfig(n=n).seed)
        self.messages = []
        for ex in items:  # same order as evaluate_model: (item, no-context), (item, context)
            self.messages.append([{"role": "user", "content": ex.prompt}])
            self.messages.append([{"role": "system", "content": ex.context}, {"role": "user", "content": ex.prompt}])
        self.max_new = task.max_new_tokens
        self.stop = stop_ids(tok, model)

    @torch.inference_mode()
    def __call__(self) -> tuple[float, float]:
        t0 = time.perf_counter()
        texts = [self.tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in self.messages]
        ids = self.tok(texts, add_special_tokens=False)["input_ids"]
        self.model.eval()
        n_new, decoded = 0, []
        for s in range(0, len(ids), self.batch):
            enc = self.tok.pad(
                {"input_ids": ids[s : s + self.batch]}, padding=True, padding_side="left", return_tensors="pt"
            )
            out = self.model.generate(
                **enc,
                max_new_tokens=self.max_new,
                do_sample=False,
                eos_token_id=self.stop,
                pad_token_id=self.tok.pad_token_id,
            )
            new = out[:, enc["input_ids"].shape[1] :]
            n_new += int((~torch.isin(new, torch.tensor(self.stop + [self.tok.pad_token_id]))).sum())
            decoded += self.tok.batch_decode(new, skip_special_tokens=True)
        return time.perf_counter() - t0, n_new / len(ids)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="held-out items (2n prompts: both views)")
    ap.add_argument("--rounds", type=int, default=20, help="measured rounds (after one warm-up round)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", default="auto", help="torch threads: an integer or auto (2 if idle, else 1)")
    ap.add_argument("--quick", action="store_true", help="--n 100 --rounds 6")
    args = ap.parse_args(argv)
    quiet()
    if args.quick:
        args.n, args.rounds = 100, 6
    threads = pick_threads(args.threads)
    torch.set_num_threads(threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mechopd.tasks.base import get_task

    load = os.getloadavg()
    print(
        f"torch {torch.__version__}, threads {threads}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"n {args.n} items ({2 * args.n} prompts), {args.rounds} rounds"
    )
    with tempfile.TemporaryDirectory(prefix="mechopd-bench-eval-") as tmp:
        path = build_organism(Path(tmp) / "organism", args.seed)
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    task = get_task("rules")
    instrument()
    task.examples = _timed(task.examples, "examples")  # type: ignore[method-assign]
    bare = GenerateLoop(model, tok, task, args.n)
    times: dict[str, list[float]] = {"evaluate": [], "generate": []}
    lens: dict[str, list[float]] = {"evaluate": [], "generate": []}
    phases: dict[str, list[float]] = collections.defaultdict(list)
    for r in range(args.rounds + 1):
        PHASES.clear()
        if r % 2:  # alternate which variant goes first (cancels order effects)
            tg, lg = bare()
            te, le = run_evaluate(model, tok, task, args.n)
        else:
            te, le = run_evaluate(model, tok, task, args.n)
            tg, lg = bare()
        if r == 0:
            continue
        for k, v in (("evaluate", (te, le)), ("generate", (tg, lg))):
            times[k].append(v[0])
            lens[k].append(v[1])
        for k, v in PHASES.items():
            phases[k].append(v)
        print(f"  round {r}/{args.rounds}: evaluate {te:.2f}s  generate {tg:.2f}s  ratio {te / tg:.3f}", flush=True)
    return report(args.n, times, lens, phases)


def report(n: int, times: dict, lens: dict, phases: dict) -> int:
    print(f"\n{'variant':>9} {'median s':>9} {'items/s':>8} {'gen len':>8}")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"{k:>9} {med:9.3f} {n / med:8.1f} {statistics.fmean(lens[k]):8.2f}")
    same = len({round(statistics.fmean(v), 6) for v in lens.values()}) == 1
    print(f"mean generated length equal: {same}")
    ev = statistics.median(times["evaluate"])
    for k, v in phases.items():
        print(f"  evaluate: {k:<11} {statistics.median(v):7.3f} s ({statistics.median(v) / ev:5.1%})")
    other = ev - sum(statistics.median(v) for v in phases.values())
    print(f"  evaluate: {'other':<11} {other:7.3f} s ({other / ev:5.1%})  decode + score + records")
    per_round = [a / b for a, b in zip(times["evaluate"], times["generate"])]
    paired = statistics.median(per_round)
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(per_round, k=len(per_round))) for _ in range(1000))
    lo, hi = boots[25], boots[974]
    overall = ev / statistics.median(times["generate"])
    good = paired <= TARGET and same
    unsure = " (CI straddles the bound)" if lo <= TARGET <= hi else ""
    print(
        f"\nevaluate / generate time: paired {paired:.3f} [95% CI {lo:.3f}, {hi:.3f}], overall {overall:.3f} "
        f"(per-round {min(per_round):.3f}..{max(per_round):.3f}); target <= {TARGET}: "
        f"{'PASS' if good else 'FAIL'}{unsure}"
    )
    load = os.getloadavg()
    print(f"load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
