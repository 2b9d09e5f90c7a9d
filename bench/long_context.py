"""Benchmark: the shared context prefix (generate/prefix.py) on a long-context JSONL task, in ONE run.

Task: the `jsonl` task with a shared context file of ~512 tokens (organism words), ~32-token questions (the free-form
layout: stem + the task's answer instruction), 24 new tokens, batch 32. Model: the organism's shape (Qwen3, hidden 96,
3 layers, 4/2 heads, intermediate 192, word-level tokenizer; positions 1024 so the context fits) and a wider one
(--hidden 256, intermediate 512), random init with bench/train_step.py's edit (special tokens never sampled: every
response runs to 24 tokens). Variants, interleaved step by step, first --warmup dropped, paired ratios (median over
cycles of A/B in the same cycle) with bootstrap 95% intervals (bench/train_step.py's `_ratio_line`):

  opd / opd_off      Trainer(method=opd, selector=full, estimator=full).train_step(), shared_prefix auto / off
  nca / nca_off      the same with method=nca (the student's context view: forward + backward)
  bare / bare_nca    bench/train_step.py's minimal loop (no sharing) on the same prompts: the floors
  trl                TRL SDFTTrainer as configured in bench/train_step.py, on the same items (--variants to drop it)
  eval / eval_off    the with-context view of evaluation: `generate.sampler.sample` of the 32 context-view prompts,
                     greedy, 24 tokens, shared_prefix auto / off
  cview              one student context-view forward + backward (shared): NCA / OPD cannot be below
                     1 + cview / opd (printed as the shared path's floor)
  sim / sim_hf       the similarity probe's two-view capture (`probes.capture.run_views`, every site) vs an unshared
                     HF forward of both views with ``output_hidden_states=True``
Peak memory of an OPD step (auto vs off): each in a fresh subprocess, the highest RSS sampled every ~1 ms during 3
steps minus the RSS just before them (after one warm-up step; CPU: large tensors are mmap'ed and returned on free).

    python bench/long_context.py [--steps 30] [--warmup 3] [--hidden 96] [--variants ...] [--threads auto]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import torch  # noqa: E402
import train_step as ts  # noqa: E402  (bench/train_step.py: BareLoop, TRLRunner, pick_threads, _ratio_line, quiet)

TARGETS = [  # (label, numerator, denominator, bound, op, floor numerator, floor denominator)
    ("TRL / OPD (OPD steps/s over TRL's)", "trl", "opd", 3.0, ">=", "trl", "bare"),
    ("NCA / OPD", "nca", "opd", 1.20, "<=", "bare_nca", "bare"),
    ("eval unshared / shared", "eval_off", "eval", 2.0, ">=", None, None),
    ("similarity HF unshared / shared", "sim_hf", "sim", 1.5, ">=", None, None),
]
INFO = [
    ("student context view fwd+bwd / OPD", "cview", "opd"),
    ("OPD / OPD unshared", "opd", "opd_off"),
    ("NCA / NCA unshared", "nca", "nca_off"),
    ("OPD / bare", "opd", "bare"),
    ("NCA unshared / OPD unshared", "nca_off", "opd_off"),
]


def write_task(root: Path, n: int, seed: int, context_words: int = 512, stem_words: int = 8) -> dict[str, str]:
    """A JSONL file of free-form items and a shared context file, from the organism's own words."""
    from mechopd.organisms.pretrain import organism_vocab

    rng = random.Random(seed)
    words = [w for w in organism_vocab() if w.isalpha()]
    (root / "context.txt").write_text(" ".join(rng.choice(words) for _ in range(context_words)))
    with open(root / "items.jsonl", "w") as f:
        for i in range(n):
            stem = " ".join(rng.choice(words) for _ in range(stem_words))
            f.write(json.dumps({"prompt": f"{stem} {i}", "answer": rng.choice(words)}) + "\n")
    return {"path": str(root / "items.jsonl"), "context_file": str(root / "context.txt"), "test_fraction": 0.02}


def build_model(out: Path, hidden: int, seed: int, opts: dict) -> Path:
    """The organism-shaped model; its word-level vocabulary also covers the JSONL task's own words (the answer
    template), which the trainer checks (`checks.check_task_vocab`)."""
    from transformers import AutoModelForCausalLM

    from mechopd.organisms.pretrain import OrganismConfig, model_config, organism_vocab
    from mechopd.organisms.tokenizer import build_tokenizer
    from mechopd.tasks.base import get_task

    words = organism_vocab()
    tok = build_tokenizer(words + [w for w in get_task("jsonl", **opts).vocab() if w not in set(words)])
    cfg = OrganismConfig(hidden_size=hidden, intermediate_size=2 * hidden, max_position_embeddings=1024)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(model_config(cfg, len(tok), tok))
    with torch.no_grad():  # bench/train_step.py's edit: special tokens ~40 logits down, responses run to the cap
        emb = model.get_input_embeddings().weight
        emb[:, 0] = 2.0
        emb[tok.all_special_ids, 0] = -2.0
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def trainer_step(path: Path, root: Path, name: str, method: str, mode: str, opts: dict, args) -> Callable:
    """bench/train_step.py's timed `Trainer.train_step()` on the long-context JSONL task."""
    return ts.make_trainer_step(
        path, root, name, args, task="jsonl", task_options=opts, method=method, selector="full", shared_prefix=mode
    )


def _items(opts: dict, args) -> list:
    from mechopd.tasks.base import get_task

    return get_task("jsonl", **opts).examples("train", args.pool, args.seed)


def bare_loop(path: Path, opts: dict, args, nca: bool) -> Callable:
    loop = ts.BareLoop(path, args.batch, args.new_tokens, 1e-5, args.seed, 8, nca=nca)
    items = _items(opts, args)
    loop.px = loop._encode([ex.prompt for ex in items])
    loop.pc = loop._encode([ex.context + "\n\n" + ex.prompt for ex in items])  # "user" placement, as TRL's
    return loop.step


def trl_runner(path: Path, root: Path, opts: dict, args) -> Any:
    """bench/train_step.py's TRLRunner on the long task; prompts not truncated (TRL's default max_prompt_length
    is 512 tokens, shorter than the context view: TRL would drop the context's start)."""
    import functools

    import trl.experimental.sdft as sdft

    import mechopd.tasks.base as base

    real, config = base.get_task, sdft.SDFTConfig
    base.get_task = lambda name, **kw: real("jsonl", **opts)  # TRLRunner reads its items through get_task
    sdft.SDFTConfig = functools.partial(config, max_prompt_length=None)
    try:
        return ts.TRLRunner(path, root, args)
    finally:
        base.get_task, sdft.SDFTConfig = real, config


def eval_step(path: Path, opts: dict, args, mode: str) -> Callable:
    from mechopd.core.views import RenderSpec, render_prompt_ids
    from mechopd.generate.sampler import sample
    from mechopd.generate.settings import SamplingSettings
    from mechopd.models import load_model, load_tokenizer

    model, tok = load_model(path), load_tokenizer(path)
    items = _items(opts, args)[: args.batch]
    ids = [render_prompt_ids(tok, ex.prompt, ex.context, RenderSpec("system")) for ex in items]
    settings = SamplingSettings.for_model(tok, model, max_new_tokens=args.new_tokens, greedy=True, shared_prefix=mode)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        gen = sample(model, ids, settings)
        return time.perf_counter() - t0, sum(map(len, gen.responses)) / len(ids)

    return step


def sim_step(path: Path, opts: dict, args, hf: bool) -> Callable:
    from mechopd.core.views import RenderSpec, build_two_view_batch
    from mechopd.models import load_model, load_tokenizer
    from mechopd.probes.capture import all_sites, run_views

    model, tok = load_model(path), load_tokenizer(path)
    items = _items(opts, args)[: args.batch]
    resp = [tok(ex.answer, add_special_tokens=False)["input_ids"] * args.new_tokens for ex in items]
    batch = build_two_view_batch(
        tok,
        [e.prompt for e in items],
        [e.context for e in items],
        [r[: args.new_tokens] for r in resp],
        RenderSpec("system"),
    )
    sites = all_sites(model)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        if hf:
            with torch.inference_mode():
                hx = model.model(**batch.view("x"), output_hidden_states=True, use_cache=False).hidden_states
                hc = model.model(**batch.view("c"), output_hidden_states=True, use_cache=False).hidden_states
                [(batch.response_hidden(a, "x"), batch.response_hidden(b, "c")) for a, b in zip(hx, hc)]
        else:
            run_views(model, batch, sites, lambda s, a, b: None)
        return time.perf_counter() - t0, float(args.new_tokens)

    return step


def _rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure_peak(step: Callable, n: int = 3) -> float:
    """MiB: the highest RSS sampled (every ~1 ms, a thread) during `n` steps minus the RSS just before them.
    Large tensors are mmap'ed and returned on free, so RSS follows a step's live tensors."""
    import threading

    step()  # warm-up: lazily built state is in the baseline
    base, peak, done = _rss_mib(), [0.0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib())
            time.sleep(0.001)

    thread = threading.Thread(target=poll)
    thread.start()
    for _ in range(n):
        step()
    done.set()
    thread.join()
    return peak[0] - base


def cview_step(path: Path, opts: dict, args) -> Callable:
    """The floor of NCA's extra work: ONE student context-view forward + backward through the shared path."""
    from mechopd.core.views import RenderSpec, build_two_view_batch
    from mechopd.generate.scorer import score_views
    from mechopd.models import load_model, load_tokenizer

    model, tok = load_model(path).train(), load_tokenizer(path)
    items = _items(opts, args)[: args.batch]
    resp = [
        (tok(ex.answer, add_special_tokens=False)["input_ids"] * args.new_tokens)[: args.new_tokens] for ex in items
    ]
    batch = build_two_view_batch(tok, [e.prompt for e in items], [e.context for e in items], resp, RenderSpec("system"))

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        lp = score_views(model, batch, ("c",), temperature=1.0)["c"]
        model.zero_grad(set_to_none=True)
        lp.exp().mul(lp).sum().backward()
        return time.perf_counter() - t0, float(args.new_tokens)

    return step


def peak_memory(path: Path, opts: dict, args, mode: str) -> float:
    """`measure_peak` of an OPD step (shared_prefix `mode`), in a fresh process."""
    code = (
        f"import sys, torch; sys.path.insert(0, {str(Path(__file__).parent)!r}); torch.set_num_threads(1)\n"
        "import long_context as lc, argparse, pathlib\n"
        f"a = argparse.Namespace(**{vars(args)!r})\n"
        f"st = lc.trainer_step(pathlib.Path({str(path)!r}), pathlib.Path({tempfile.mkdtemp()!r}), 'm', 'opd', "
        f"{mode!r}, {opts!r}, a)\n"
        "print(lc.measure_peak(st))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def report(times: dict, lens: dict) -> bool:
    import statistics

    print(f"\n{'variant':>9} {'median ms':>10} {'resp len':>9}  (steps)")
    for k, t in times.items():
        print(f"{k:>9} {statistics.median(t) * 1e3:10.1f} {statistics.fmean(lens[k]):9.2f}  ({len(t)})")
    print(f"\n{'ratio':<38} {'paired':>7} {'95% CI':>13} {'overall':>8}  target / bare floor")
    ok = len({round(statistics.fmean(v), 6) for v in lens.values()}) == 1  # same response length everywhere
    for label, num, den, bound, op, fn, fd in TARGETS:
        if num in times and den in times:
            (paired, _, _), line = ts._ratio_line(label, times[num], times[den])
            good = paired >= bound if op == ">=" else paired <= bound
            ok &= good
            floor = ""
            if fn in times and fd in times:
                floor = f"; floor {fn}/{fd} = {ts._ratio_line('', times[fn], times[fd])[0][0]:.3f}"
            print(line.format(f"{op} {bound}  {'PASS' if good else 'FAIL'}{floor}"))
    for label, num, den in INFO:
        if num in times and den in times:
            print(ts._ratio_line(label, times[num], times[den])[1].format("(info)"))
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--pool", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--threads", default="auto")
    ap.add_argument("--variants", default="opd,opd_off,nca,nca_off,bare,bare_nca,trl,eval,eval_off,sim,sim_hf,cview")
    ap.add_argument("--memory", action="store_true", help="also measure the peak memory of an OPD step")
    args = ap.parse_args(argv)
    ts.quiet()
    torch.set_num_threads(ts.pick_threads(args.threads))
    with tempfile.TemporaryDirectory(prefix="mechopd-bench-long-") as tmp:
        root = Path(tmp)
        opts = write_task(root, args.pool + 32, args.seed)
        path = build_model(root / "model", args.hidden, args.seed, opts)
        ex = _items(opts, args)[0]
        from mechopd.core.views import RenderSpec, render_prompt_ids
        from mechopd.models import load_tokenizer

        tok = load_tokenizer(path)
        lc_ = len(render_prompt_ids(tok, ex.prompt, ex.context, RenderSpec("system")))
        lx = len(render_prompt_ids(tok, ex.prompt, None, RenderSpec("system")))
        print(
            f"torch {torch.__version__}, threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}, hidden "
            f"{args.hidden}, batch {args.batch}, new tokens {args.new_tokens}; context-view prompt {lc_} tokens, "
            f"no-context prompt {lx} tokens; {args.steps} steps after {args.warmup} warm-up"
        )
        build = {
            "opd": lambda: trainer_step(path, root, "opd", "opd", "auto", opts, args),
            "opd_off": lambda: trainer_step(path, root, "opd_off", "opd", "off", opts, args),
            "nca": lambda: trainer_step(path, root, "nca", "nca", "auto", opts, args),
            "nca_off": lambda: trainer_step(path, root, "nca_off", "nca", "off", opts, args),
            "bare": lambda: bare_loop(path, opts, args, nca=False),
            "bare_nca": lambda: bare_loop(path, opts, args, nca=True),
            "trl": lambda: trl_runner(path, root, opts, args),
            "eval": lambda: eval_step(path, opts, args, "auto"),
            "eval_off": lambda: eval_step(path, opts, args, "off"),
            "sim": lambda: sim_step(path, opts, args, hf=False),
            "sim_hf": lambda: sim_step(path, opts, args, hf=True),
            "cview": lambda: cview_step(path, opts, args),
        }
        variants = {n: build[n]() for n in args.variants.split(",")}
        times, lens = ts.run_interleaved(variants, args.steps, args.warmup)
        ok = report(times, lens)
        if args.memory:
            on, off = peak_memory(path, opts, args, "auto"), peak_memory(path, opts, args, "off")
            ratio = on / off if off > 0 else float("nan")
            print(
                f"peak memory of an OPD step: shared {on:.1f} MiB, unshared {off:.1f} MiB, ratio {ratio:.3f} "
                f"(target <= 0.6 {'PASS' if ratio <= 0.6 else 'FAIL'})"
            )
            ok &= ratio <= 0.6
    print(f"overall: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
