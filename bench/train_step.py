"""Benchmark: one optimizer step of OPD / NCA / TA-OPD (`Trainer.train_step`) against two references, in ONE run.

Variants, all on the rules organism's architecture (Qwen3, hidden 96, 3 layers, 4 heads, 2 kv heads, intermediate 192,
the word-level organism tokenizer), same prompts, same batch B and the same 24 new tokens per response:

  bare     a minimal loop written here: KV-cache decode of the student through ``model(...)`` on the no-context view
           (mechopd's own rollouts use `generate/lean.py`), frozen-teacher
           forward on the context view (no grad), student forward + backward, full-vocab reverse KL KL(q_x || f),
           grad clip 1.0, AdamW step (torch.optim.AdamW, the optimizer mechopd uses).
  opd      Trainer(method="opd", selector="full", estimator="full").train_step()
  nca      Trainer(method="nca", ...)        (one extra student forward/backward on the context view)
  ta_opd   Trainer(method="opd", selector="ta_opd", budget 0.10, K 16)
  lora_nca / ema_nca / live_nca   NCA with lora_rank=8 / teacher_mode=ema / teacher_mode=live (opt-in via --variants)
  trl      trl.experimental.sdft.SDFTTrainer (TRL 1.16; `pip install -e .[bench]`) configured to the same work:
           frozen base teacher, context before the prompt in the user turn, full-vocab reverse KL
           (distillation_mode="full_logits", distillation_alpha=1), one generation per prompt, per-device batch B,
           gradient accumulation 1, max_completion_length 24, fp32, no activation checkpointing, AdamW (non-fused,
           as mechopd), constant lr, grad clip 1.0, logging/saving/eval/reporting off.

After the ratios, every mechopd variant's stage table (`train.profile`): median seconds, share of the step and
tokens/s of rollout, teacher, student_fwd, loss, student_bwd and optimizer.

Targets (issue 31; a verdict reads the WHOLE 95 % interval: PASS when it clears the bound, FAIL when it lies on the
wrong side, UNDECIDED when it straddles, and only all-PASS is an overall PASS): opd <= 1.15 x bare; ta_opd <= 1.05 x
opd; nca / opd <= 1.05 x the floor bare_nca / bare (per cycle: (nca / opd) / (bare_nca / bare)); opd steps/s >= 1.3 x
trl.

Method. The model is random-init (timings do not depend on the weights) with one edit so that no response ever ends
early: embedding column 0 (tied with the LM head) is +2 for ordinary tokens and -2 for the special tokens, so the
final-norm'd hidden state (dominated by that column) scores every special token (stop, pad) ~40 logits below the
rest; every response is exactly --new-tokens long (the mean length of each variant is printed and checked).
Context placement is "user" (c + "\\n\\n" + x in the user turn) for every variant so that mechopd's context view and
TRL's `teacher_prompt_template="{privileged_context}\\n\\n{prompt}"` are the same token ids (checked at start-up).
Variants run interleaved STEP BY STEP (trl bare opd nca ta_opd bare_nca, trl opd nca ta_opd bare_nca bare, ...: the
order after TRL rotates by one each cycle, so no variant always follows the same one): TRL's `train()` runs once and
the other variants' steps run inside its `on_step_end` callback, so every step of every variant sees the same machine
load within about one cycle. The first --warmup steps of each variant are dropped. The verdict uses the paired
ratio: the median over cycles of (step time of A / step time of B in the same cycle), with a bootstrap 95% interval;
the ratio of overall medians is printed next to it. TA-OPD / OPD sits near 1.03 on this machine: at 200 steps its
interval is about +-0.02 wide and may straddle 1.05; --steps 600 (+-0.013) decides it (docs/scaling.md). mechopd
and bare steps are timed around the call; a TRL step is timed from the callback's exit to the next callback's entry
(data fetch, generation, loss, backward, clip, optimizer, scheduler and the Trainer's own bookkeeping: one full loop
iteration, nothing of the other variants).
bare_nca (the bare loop plus NCA's extra student forward/backward on the context view and the anchor KL) is printed as
the floor for the NCA target: what "one extra forward" costs on this model with no library around it.

    python bench/train_step.py [--steps 200] [--warmup 10] [--batch 32] [--new-tokens 24] [--threads auto] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from bare_loop import BareLoop  # noqa: E402  (bench/bare_loop.py; also used by long_context.py)
from trl_runner import TRLRunner  # noqa: E402,F401  (bench/trl_runner.py; also used by long_context.py)

INFO = [  # ratios printed without a verdict: what the targets are up against
    ("NCA / OPD", "nca", "opd"),
    ("NCA floor: bare_nca / bare", "bare_nca", "bare"),
    ("NCA / bare_nca", "nca", "bare_nca"),
    ("TA-OPD / bare", "ta_opd", "bare"),
]
TARGETS = [  # (label, numerator(s), denominator(s), bound, "<=" | ">="); a tuple: the product of those step times
    ("OPD / bare loop", "opd", "bare", 1.15, "<="),
    ("(NCA / OPD) / (bare_nca / bare)", ("nca", "bare"), ("opd", "bare_nca"), 1.05, "<="),
    ("TA-OPD / OPD", "ta_opd", "opd", 1.05, "<="),
    ("TRL / OPD (= OPD steps/s over TRL's)", "trl", "opd", 1.30, ">="),
]


def quiet() -> None:
    """No weight-loading progress bars or deprecation chatter from inside transformers / TRL in the bench output."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)


def pick_threads(arg: str) -> int:
    """--threads auto: 2 only when the machine is otherwise idle (1-min load < 0.5), else 1 (no OpenMP spin fights)."""
    if arg != "auto":
        return int(arg)
    return 2 if os.getloadavg()[0] < 0.5 else 1


def build_organism(out: Path, seed: int = 0) -> Path:
    """Random-init rules organism (model_config + build_tokenizer) whose special tokens are never sampled."""
    from transformers import AutoModelForCausalLM

    from mechopd.organisms.pretrain import OrganismConfig, model_config, organism_vocab
    from mechopd.organisms.tokenizer import build_tokenizer

    tok = build_tokenizer(organism_vocab())
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config(OrganismConfig(), len(tok), tok))
    with torch.no_grad():
        emb = model.get_input_embeddings().weight  # [V, d], tied with lm_head
        emb[:, 0] = 2.0
        emb[tok.all_special_ids, 0] = -2.0
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Variants: each is a callable `step() -> (seconds, mean response length)` or the TRL runner
# ---------------------------------------------------------------------------------------------------------------------


def make_trainer_step(path: Path, out_root: Path, name: str, args, **config: Any) -> Callable:
    """`Trainer.train_step()` timed, on the bench's work (rules, user placement; `config` overrides any field, e.g.
    method/selector here, task/task_options/shared_prefix in bench/long_context.py)."""
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import Trainer

    base = dict(
        student=str(path),
        task="rules",
        task_options={"placement": "user"},
        estimator="full",
        batch_size=args.batch,
        max_new_tokens=args.new_tokens,
        steps=10**6,
        lr=1e-5,
        seed=args.seed,
        pool_size=args.pool,
        no_context_system=args.no_context_system,
    )
    trainer = Trainer(TrainConfig(**{**base, **config}), out_dir=out_root / name, progress=False)

    records: list[dict] = []

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        rec = trainer.train_step()
        records.append(rec)
        return time.perf_counter() - t0, rec["response_len"]

    step.trainer = trainer  # type: ignore[attr-defined]
    step.records = records  # type: ignore[attr-defined]
    return step


def stage_table(variants: dict[str, Any], warmup: int) -> None:
    """Per mechopd variant: median seconds, share of the step and tokens/s of each stage (`train.profile`; tokens =
    the step's response tokens), over the measured steps."""
    from mechopd.train.profile import STAGES

    rows = {k: v.records[warmup:] for k, v in variants.items() if getattr(v, "records", None)}
    if not rows:
        return
    print("\nthroughput per stage (median over steps; tokens/s = response tokens / the stage's seconds)")
    print(f"{'variant':>8} " + " ".join(f"{s:>19}" for s in STAGES))
    for k, recs in rows.items():
        cells = []
        for s in STAGES:
            sec = statistics.median(r[f"time/{s}"] for r in recs)
            share = statistics.median(r[f"time/{s}"] / r["step_s"] for r in recs)
            tps = statistics.median(r[f"tokens_per_s/{s}"] or 0.0 for r in recs)
            cells.append(f"{sec * 1e3:6.1f}ms {share:4.0%} {tps:6.0f}/s".rjust(19))
        print(f"{k:>8} " + " ".join(cells))


def run_interleaved(variants: dict[str, Any], steps: int, warmup: int) -> tuple[dict, dict]:
    """Step by step: trl, then the other variants in an order rotated by one each cycle (trl, bare, opd, nca, ...,
    trl, opd, nca, ..., bare, ...), so that no variant always runs after the same one (the step before leaves the
    caches and the allocator in its own state); the first `warmup` steps of each variant are dropped.

    Returns times[name] (seconds per measured step, in order) and lens[name] (mean response length per step).
    """
    times: dict[str, list[float]] = {k: [] for k in variants}
    lens: dict[str, list[float]] = {k: [] for k in variants}
    local = [k for k, v in variants.items() if not isinstance(v, TRLRunner)]

    def cycle(j: int) -> None:
        for name in local[j % len(local) :] + local[: j % len(local)]:  # rotated: no variant always follows another
            t, n = variants[name]()
            if j >= warmup:
                times[name].append(t)
                lens[name].append(n)
        if j >= warmup and (j + 1 - warmup) % 20 == 0:
            print(
                f"  step {j + 1 - warmup}/{steps}: "
                + "  ".join(f"{k} {statistics.median(times[k][-20:]) * 1e3:.0f}ms" for k in local if times[k]),
                flush=True,
            )

    trl = next((v for v in variants.values() if isinstance(v, TRLRunner)), None)
    if trl is None:
        for j in range(warmup + steps):
            cycle(j)
    else:
        ts, ls = trl.run(warmup + steps, cycle)
        times["trl"], lens["trl"] = ts[warmup:], ls[warmup:]
        n = min(len(v) for v in times.values())
        times = {k: v[:n] for k, v in times.items()}
        lens = {k: v[:n] for k, v in lens.items()}
    return times, lens


def report(times: dict, lens: dict) -> bool:
    print(f"\n{'variant':>8} {'median ms':>10} {'p10 ms':>8} {'p90 ms':>8} {'steps/s':>8} {'resp len':>9}  (steps)")
    for k, ts in times.items():
        flat = sorted(ts)
        med = statistics.median(flat)
        p10, p90 = flat[len(flat) // 10], flat[(9 * len(flat)) // 10]
        print(
            f"{k:>8} {med * 1e3:10.1f} {p10 * 1e3:8.1f} {p90 * 1e3:8.1f} {1 / med:8.2f} "
            f"{statistics.fmean(lens[k]):9.2f}  ({len(flat)})"
        )
    all_lens = {round(statistics.fmean(v), 6) for v in lens.values()}
    same_len = len(all_lens) == 1
    print(f"mean response length equal across variants: {same_len} {sorted(all_lens)}")
    ok = same_len
    print(f"\n{'ratio':<38} {'paired':>7} {'95% CI':>13} {'overall':>8}  target     verdict")
    for label, num, den, bound, op in TARGETS:
        nums, dens = (num,) if isinstance(num, str) else num, (den,) if isinstance(den, str) else den
        if all(k in times for k in (*nums, *dens)):
            (paired, lo, hi), line = _ratio_line(label, _product(times, nums), _product(times, dens))
            verdict = _verdict(lo, hi, bound, op)
            ok &= verdict == "PASS"
            print(line.format(f"{op} {bound:<6}  {verdict}"))
    for label, num, den in INFO:
        if num in times and den in times:
            print(_ratio_line(label, times[num], times[den])[1].format("(info)"))
    return ok


def _product(times: dict, keys: tuple[str, ...]) -> list[float]:
    """Per cycle, the product of the step times of ``keys`` (a ratio of products is a paired double ratio)."""
    return [math.prod(ts) for ts in zip(*(times[k] for k in keys))]


def _verdict(lo: float, hi: float, bound: float, op: str) -> str:
    """The whole interval decides: PASS clears the bound, FAIL lies on the wrong side, else UNDECIDED."""
    good, bad = (hi <= bound, lo > bound) if op == "<=" else (lo >= bound, hi < bound)
    return "PASS" if good else "FAIL" if bad else "UNDECIDED (the 95 % interval straddles the bound)"


def _ratio_line(label: str, num: list[float], den: list[float]) -> tuple[tuple[float, float, float], str]:
    """Paired ratio = median over steps of num[i] / den[i] (same interleaved cycle), its bootstrap 95% interval, and
    the ratio of overall medians; returns ((paired, lo, hi), a line with one {} slot for the verdict)."""
    per_step = [a / b for a, b in zip(num, den)]
    paired = statistics.median(per_step)
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(per_step, k=len(per_step))) for _ in range(1000))
    lo, hi = boots[25], boots[974]
    overall = statistics.median(num) / statistics.median(den)
    line = f"{label:<38} {paired:7.3f} {f'[{lo:.3f}, {hi:.3f}]':>13} {overall:8.3f}  {{}}"
    return (paired, lo, hi), line


def _model_dir(ref: str) -> str:
    """A checkpoint dir, or ``model:NAME`` resolved (and fetched on first use) by mechopd's model resolver."""
    if ref.startswith("model:"):
        from mechopd.models.fetch import resolve_fetched

        return resolve_fetched(ref)
    return ref


def head_memory(vocab: int, rows: int, resp: int) -> None:
    """The loss head's peak memory at vocabulary `vocab` (bench/loss_head.py's subprocess measurement, NCA top-k)."""
    import loss_head  # bench/loss_head.py

    a = argparse.Namespace(vocab=vocab, rows=rows, resp=resp, hidden=64, chunk=64)
    print(f"\nloss head, V = {vocab}, N = {rows} x {resp} positions, nca:topk (peak in float32 [N, V] units):")
    loss_head.memory(a, "nca:topk")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="measured steps per variant")
    ap.add_argument("--warmup", type=int, default=10, help="steps per variant run first and dropped")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--pool", type=int, default=2048, help="training prompts cycled through")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", default="auto", help="torch threads: an integer or auto (2 if idle, else 1)")
    ap.add_argument("--variants", default="bare,opd,nca,ta_opd,trl,bare_nca")
    ap.add_argument("--quick", action="store_true", help="--steps 40 --warmup 5")
    ap.add_argument(
        "--model",
        default=None,
        help="a real checkpoint dir (or model:NAME) instead of the random organism, e.g. model:smollm2-135m-instruct "
        "with --batch 4 --steps 5 --warmup 1 (bench/real_model.py: stop ids' head rows zeroed in a copy)",
    )
    ap.add_argument(
        "--head-vocabs",
        default="",
        help="comma-separated vocabularies (e.g. 49152,262144): after the steps, the loss head's peak memory per "
        "variant at each (bench/loss_head.py, --batch rows x --new-tokens positions)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.no_context_system = None
    quiet()
    if args.quick:
        args.steps, args.warmup = 40, 5
    threads = pick_threads(args.threads)
    torch.set_num_threads(threads)
    load = os.getloadavg()
    print(
        f"torch {torch.__version__}, threads {threads}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"batch {args.batch}, new tokens {args.new_tokens}, {args.steps} steps/variant after {args.warmup} warm-up"
    )
    names = args.variants.split(",")
    with tempfile.TemporaryDirectory(prefix="mechopd-bench-train-") as tmp:
        root = Path(tmp)
        if args.model:
            from real_model import prepare_real  # bench/real_model.py

            path, args.no_context_system = prepare_real(_model_dir(args.model), root / "real")
        else:
            path = build_organism(root / "organism", args.seed)
        v: dict[str, Any] = {}
        builders = {
            "bare": lambda: BareLoop(path, args.batch, args.new_tokens, 1e-5, args.seed, args.pool).step,
            "bare_nca": lambda: BareLoop(path, args.batch, args.new_tokens, 1e-5, args.seed, args.pool, nca=True).step,
            "opd": lambda: make_trainer_step(path, root, "opd", args, method="opd", selector="full"),
            "nca": lambda: make_trainer_step(path, root, "nca", args, method="nca", selector="full"),
            "ta_opd": lambda: make_trainer_step(path, root, "ta_opd", args, method="opd", selector="ta_opd"),
            "lora_nca": lambda: make_trainer_step(path, root, "lora_nca", args, method="nca", lora_rank=8),
            "ema_nca": lambda: make_trainer_step(path, root, "ema_nca", args, method="nca", teacher_mode="ema"),
            "live_nca": lambda: make_trainer_step(path, root, "live_nca", args, method="nca", teacher_mode="live"),
            "trl": lambda: TRLRunner(path, root, args),
        }
        for n in names:
            v[n] = builders[n]()
        if torch.get_num_threads() != threads:
            print(f"warning: something changed torch threads to {torch.get_num_threads()}; resetting to {threads}")
            torch.set_num_threads(threads)
        times, lens = run_interleaved(v, args.steps, args.warmup)
        if "trl" in v:
            print(v["trl"].settings())
        ok = report(times, lens)
        stage_table(v, args.warmup)
        for f in v.values():  # release mechopd's run-dir locks (Trainer.close) before the temp dir goes
            if hasattr(f, "records"):  # a `make_trainer_step` variant (TRL's runner has a .trainer too)
                f.trainer.close()
    for vocab in filter(None, args.head_vocabs.split(",")):
        head_memory(int(vocab), args.batch, args.new_tokens)
    load = os.getloadavg()
    print(f"\nload average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; overall: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
