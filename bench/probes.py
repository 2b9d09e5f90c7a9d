"""Benchmark: the two-view cosine probe against the same computation through TransformerLens, nnsight and bare HF.

For each model size (``SIZES``: "organism", hidden 64 x 2 layers, where per-call overhead matters on a CPU; "small",
hidden 256 x 4 layers, where the matmuls dominate) it builds a Qwen3 from a config with the rules organism's word-level
tokenizer, saves it like a trainer checkpoint, and renders N rules items with random response ids (lengths 16..48) in
both views. Every method computes the per-site per-token-mean two-view cosine over the same pre-built batches
(rendering excluded), feeding the same accumulator:

  mechopd    mechopd.probes.view_cosine.two_view_cosine (default: one forward per view): hooks gather the response
             columns, no lm_head, stops early
  tl         TransformerBridge (compatibility names, no processing): run_with_cache(names_filter=sites), its
             most economical caching call (the bridge forces eager attention)
  nnsight    TransformersModel.trace() saving the sites' module outputs
  hf         model.model(**view, output_hidden_states=True, use_cache=False): the bare decoder, no lm_head. HF's
             hidden_states hold n+1 of the n+2 sites (no entry for the last decoder layer's output), so this
             reference does slightly LESS work than the others

Timing: `--repeats` rounds, the order of the methods rotated every round, median per method; ratios against
mechopd's median: tl/mechopd (target >= 3), nnsight/mechopd (target >= 1.5), mechopd/hf (target <= 1.2). All four
run the same forward arithmetic, so the ratios measure per-call overhead: they shrink toward 1 as the matmuls grow.

Memory (on the last size): the probe over N and over 10 N items, each in a fresh subprocess, batches built lazily.
Reported: the process's peak RSS (VmHWM: interpreter, torch, model, data) and the peak's growth over the RSS just
before the probe. Target: peak at 10 N within 1.1x of the peak at N. Three runs: mechopd; the bare-HF loop as a
control; mechopd with glibc's mmap threshold pinned (MALLOC_MMAP_THRESHOLD_=131072). glibc raises its mmap threshold
each time a large block is freed, after which tensors of varying shapes are carved from a fragmenting heap and RSS
creeps for a few dozen batches before it plateaus; pinning the threshold shows what the program itself holds.

Threads default to 1 (a shared CPU: two threads contending with other work make small matmuls erratic).

    python bench/probes.py [--n 64] [--batch-size 16] [--repeats 5] [--threads 1] [--sizes organism,small]
                           [--skip-memory] [--skip-timing]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

TARGETS = {"tl/mechopd": (">=", 3.0), "nnsight/mechopd": (">=", 1.5), "mechopd/hf": ("<=", 1.2)}


SIZES = {  # name: (hidden, layers, heads, kv heads, head_dim, intermediate)
    "organism": (64, 2, 4, 2, 16, 128),  # the notebook's organism: per-call overhead dominates on a CPU
    "small": (256, 4, 8, 4, 32, 768),  # matmuls dominate on a CPU
}


def build_checkpoint(out_dir: Path, size: str = "small") -> Path:
    from transformers import AutoModelForCausalLM, Qwen3Config

    from mechopd.models import atomic_save
    from mechopd.organisms.tokenizer import build_tokenizer
    from mechopd.tasks.base import get_task

    hidden, layers, heads, kv, head_dim, inter = SIZES[size]
    tok = build_tokenizer(get_task("rules").vocab())
    cfg = Qwen3Config(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        vocab_size=len(tok),
        max_position_embeddings=1024,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(0)
    return atomic_save(AutoModelForCausalLM.from_config(cfg), tok, out_dir / size)


def make_items(ckpt: Path, n: int, batch_size: int):
    """N rules items with random response ids (no specials), lengths 16..48: a re-iterable `ProbeItems`."""
    from mechopd.models import load_tokenizer
    from mechopd.probes.items import make_batches
    from mechopd.tasks.base import get_task

    tok = load_tokenizer(ckpt)
    rng = random.Random(0)
    words = [i for t, i in tok.get_vocab().items() if t not in tok.all_special_tokens]
    responses = [[rng.choice(words) for _ in range(rng.randint(16, 48))] for _ in range(n)]
    return make_batches(tok, get_task("rules"), n, 0, batch_size, responses)


def hf_cosine(model, batches):
    """The reference: bare decoder forward with output_hidden_states, the probe's columns (the predicting positions,
    the stop token apart) gathered afterwards."""
    from mechopd.probes.interop import predict_stop
    from mechopd.probes.view_cosine import CosineAccumulator, SimilarityResult

    n = len(model.model.layers)
    sites = ["embed"] + [f"layers.{i}.resid_post" for i in range(n - 1)] + ["final_norm"]  # what HF returns
    acc = CosineAccumulator(sites, n)
    for batch in batches:
        hs = {}
        with torch.inference_mode():
            for which in ("x", "c"):
                out = model.model(**batch.view(which), output_hidden_states=True, use_cache=False)
                hs[which] = [predict_stop(batch, h, which) for h in out.hidden_states]  # [B, R + 1, d] each
        for s, hx, hc in zip(sites, hs["x"], hs["c"]):
            acc.add(s, hx, hc, batch.response_mask)
    return SimilarityResult(acc.site_rows("hf"), [])


def timing(ckpt: Path, n: int, batch_size: int, repeats: int) -> dict:
    from mechopd.models import load_model
    from mechopd.probes.interop import to_nnsight, to_transformer_lens, two_view_cosine_nnsight, two_view_cosine_tl
    from mechopd.probes.view_cosine import two_view_cosine

    batches = list(make_items(ckpt, n, batch_size))  # rendered once, shared by every method
    model, bridge, lm = load_model(ckpt), to_transformer_lens(ckpt), to_nnsight(ckpt)
    methods = {
        "mechopd": lambda: two_view_cosine(model, batches),
        "tl": lambda: two_view_cosine_tl(bridge, batches),
        "nnsight": lambda: two_view_cosine_nnsight(lm, batches),
        "hf": lambda: hf_cosine(model, batches),
    }
    rows = {k: f() for k, f in methods.items()}  # warm-up, and the values to cross-check
    times: dict[str, list[float]] = {k: [] for k in methods}
    order = list(methods)
    for r in range(repeats):
        for k in order[r % len(order) :] + order[: r % len(order)]:
            t0 = time.perf_counter()
            methods[k]()
            times[k].append(time.perf_counter() - t0)
    ref = {row["site"]: row["cos_mean"] for row in rows["mechopd"].rows}
    agree = {k: max(abs(row["cos_mean"] - ref[row["site"]]) for row in res.rows) for k, res in rows.items()}
    return {"median_s": {k: statistics.median(v) for k, v in times.items()}, "max_abs_diff_vs_mechopd": agree}


def memory_child(ckpt: Path, n: int, batch_size: int, method: str) -> None:
    """Run one probe over n items (batches built lazily); print the RSS before it and the peak RSS (VmHWM), MiB."""
    from mechopd.models import load_model
    from mechopd.probes.view_cosine import two_view_cosine

    model, items = load_model(ckpt), make_items(ckpt, n, batch_size)
    run = (lambda b: two_view_cosine(model, b)) if method == "mechopd" else (lambda b: hf_cosine(model, b))
    run(make_items(ckpt, batch_size, batch_size))  # warm-up: one batch
    before = _status_mib("VmRSS")
    res = run(items)
    print(
        json.dumps(
            {
                "method": method,
                "n": n,
                "tokens": res.rows[0]["n_tokens"],
                "rss_before_mib": before,
                "peak_mib": _status_mib("VmHWM"),
            }
        )
    )


def _status_mib(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


MEMORY_RUNS = (  # (label, method, extra environment)
    ("mechopd", "mechopd", {}),
    ("hf (control)", "hf", {}),
    ("mechopd, mmap threshold pinned", "mechopd", {"MALLOC_MMAP_THRESHOLD_": "131072"}),
)


def memory(ckpt: Path, n: int, batch_size: int, threads: int) -> list[tuple[str, dict, dict]]:
    """Each (label, N) and (label, 10 N) in a fresh process: [(label, result at N, result at 10 N)]."""
    out = []
    for label, method, extra in MEMORY_RUNS:
        got = []
        for k in (n, 10 * n):
            cmd = [
                sys.executable,
                __file__,
                "--memory-child",
                str(k),
                "--method",
                method,
                "--ckpt",
                str(ckpt),
                "--batch-size",
                str(batch_size),
                "--threads",
                str(threads),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **extra})
            if proc.returncode != 0:
                raise RuntimeError(f"memory child {label} n={k} failed:\n{proc.stderr[-3000:]}")
            got.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        out.append((label, *got))
    return out


def report_timing(size: str, t: dict) -> None:
    med = t["median_s"]
    print(f"[{size}] median seconds per full probe:", {k: round(v, 4) for k, v in med.items()})
    print(f"[{size}] max |cos_mean - mechopd|:", {k: f"{v:.1e}" for k, v in t["max_abs_diff_vs_mechopd"].items()})
    ratios = {
        "tl/mechopd": med["tl"] / med["mechopd"],
        "nnsight/mechopd": med["nnsight"] / med["mechopd"],
        "mechopd/hf": med["mechopd"] / med["hf"],
    }
    print(f"  [{size}] floor of the nnsight target: nnsight/hf {med['nnsight'] / med['hf']:.2f}")
    for name, value in ratios.items():
        op, target = TARGETS[name]
        ok = value >= target if op == ">=" else value <= target
        print(f"  [{size}] {name:>16} = {value:6.2f}   target {op} {target}   {'met' if ok else 'MISSED'}")


def report_memory(mem: list[tuple[str, dict, dict]]) -> None:
    for label, a, b in mem:
        ratio = b["peak_mib"] / a["peak_mib"]
        grow_a, grow_b = a["peak_mib"] - a["rss_before_mib"], b["peak_mib"] - b["rss_before_mib"]
        print(
            f"memory [{label}]: N={a['n']} ({a['tokens']} tokens) peak {a['peak_mib']:.0f} MiB (+{grow_a:.1f} over "
            f"the RSS before the probe); 10N={b['n']} ({b['tokens']} tokens) peak {b['peak_mib']:.0f} MiB "
            f"(+{grow_b:.1f})   peak(10N)/peak(N) = {ratio:.3f}  target <= 1.1  "
            f"{'met' if ratio <= 1.1 else 'MISSED'}"
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sizes", default="organism,small", help=f"comma-separated, of {', '.join(SIZES)}")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--method", default="mechopd", help=argparse.SUPPRESS)
    p.add_argument("--ckpt", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_child is not None:
        memory_child(args.ckpt, args.memory_child, args.batch_size, args.method)
        return
    sizes = args.sizes.split(",")
    with tempfile.TemporaryDirectory(prefix="mechopd-bench-probes-") as tmp:
        results = {}
        for size in sizes:
            ckpt = build_checkpoint(Path(tmp), size)
            if not args.skip_timing:
                results[size] = timing(ckpt, args.n, args.batch_size, args.repeats)
        mem = None if args.skip_memory else memory(ckpt, args.n, args.batch_size, args.threads)
    print(f"N={args.n} items, batch {args.batch_size}, {args.repeats} rounds, {args.threads} thread(s); sizes {SIZES}")
    for size, t in results.items():
        report_timing(size, t)
    if mem:
        print(f"memory on the {sizes[-1]!r} model:")
        report_memory(mem)


if __name__ == "__main__":
    main()
