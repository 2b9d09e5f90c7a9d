"""Benchmark: peak memory and time of one optimizer step at a real vocabulary (151936 rows), and what it projects.

Model: a tiny Qwen2-architecture decoder built from a config (2 layers, hidden 64, 4 heads, 2 kv heads, intermediate
128) with a 151936-row tied head (Qwen2.5's vocabulary size), random weights, the rules organism's word-level
tokenizer plus filler words up to 151936 ids (the trainer scores the ids the tokenizer knows; the fillers are never
sampled: embedding column 0 is +2 for ordinary ids and -2 for special ids and the fillers, so every response runs to
the cap, as in bench/train_step.py). The teacher is
a second such model (another seed), so the step-1 loss and gradient are not zero. Work: `Trainer.train_step()` on the
rules task, batch B prompts x R new tokens, top-k 256 estimator, lr 1e-5, fp32, one thread.

Measurement: every grid point runs in a FRESH subprocess (``--worker``): after the Trainer is built the resident set
is read (/proc/self/statm), one step runs, and ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` gives the process's
peak. Printed: the process peak and the step's own peak above what was resident before it ("step"); ratios use the
process peak unless said otherwise. The fit is least squares of the one-shot step's own peak on B*R*V:
bytes per batch*response*vocab element. Sections:

  grid        batch x response for the one-shot step and for micro_batch_size=2, logit_chunk=16 (+ checkpointing)
  target      B 16 x R 64, NCA: the saving settings vs one-shot, peak ratio (<= 0.35) and the same step-1 loss
              (1e-4 relative) and gradient norm (1e-3 relative)
  time        median step time (steps 2..n) at V=151936 vs the same model at the organism's 171 ids
  profile     torch.profiler of one V=151936 step: where the time goes (mechopd.* labels from train/step.py)
  liger       the loss alone on N positions (hidden -> head -> reverse KL -> backward) against liger-kernel's
              chunked fused linear JSD (beta=1: reverse KL; pure PyTorch, compiled=False), when it imports
  project     the fit applied to every training/paper/*.yaml: projected peak per process on 80 GB and 141 GB

    python bench/memory.py [--sections grid,target,time,profile,liger,project] [--quick] [--threads 1]
    PYTHONPATH=/path/to/liger_site python bench/memory.py --sections liger   # liger-kernel installed --no-deps
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from projection import project_recipes  # noqa: E402  (bench/projection.py)

VOCAB = 151936
SAVING = {"micro_batch_size": 2, "logit_chunk": 16}
GiB = 2**30


def build(out: Path, vocab: int, seed: int) -> Path:
    """The bench model (module docstring) saved with its tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from mechopd.organisms.pretrain import organism_vocab
    from mechopd.organisms.tokenizer import build_tokenizer

    words = organism_vocab()
    n_base = len(build_tokenizer(words))
    tok = build_tokenizer(words + [f"w{i}" for i in range(max(0, vocab - n_base))])  # as many ids as head rows:
    assert len(tok) == vocab, (len(tok), vocab)  # the trainer scores the ids the tokenizer knows (known_vocab)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight  # [V, d], tied with lm_head
        emb[:, 0] = 2.0
        emb[tok.all_special_ids, 0] = -2.0
        emb[n_base:, 0] = -2.0  # the filler words are never sampled (every row is still scored)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def worker(spec: dict) -> dict:
    """One grid point in this fresh process: build the Trainer, run `steps` steps, report peaks and step-1 values."""
    torch.set_num_threads(spec["threads"])
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import Trainer

    cfg = {
        **dict(
            student=spec["student"],
            teacher=spec["teacher"],
            task="rules",
            task_options={"placement": "user"},
            method=spec["method"],
            estimator="topk",
            batch_size=spec["B"],
            max_new_tokens=spec["R"],
            steps=10**6,
            lr=1e-5,
            seed=0,
            pool_size=64,
        ),
        **spec.get("set", {}),
    }
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(TrainConfig(**cfg), out_dir=Path(tmp) / "run", progress=False)
        before = rss_now()
        recs = []
        profile = None
        for i in range(spec.get("steps", 1)):
            if spec.get("profile") and i == spec.get("steps", 1) - 1:
                profile = profiled(trainer)
                continue
            recs.append(trainer.train_step())
        peak = max_rss()
    first = recs[0] if recs else {}
    return {
        "peak": peak,
        "before": before,
        "step_peak": peak - before,
        "loss": first.get("loss"),
        "grad_norm": first.get("grad_norm"),
        "step_s": [r["step_s"] for r in recs],
        "rollout_s": [r["rollout_s"] for r in recs],
        "response_len": first.get("response_len"),
        "profile": profile,
    }


def profiled(trainer) -> dict:
    """One step under torch.profiler: CPU ms per mechopd.* label and the top aten ops by self time."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        rec = trainer.train_step()
    wall = time.perf_counter() - t0
    ev = prof.key_averages()
    labels = {e.key: e.cpu_time_total / 1e3 for e in ev if e.key.startswith("mechopd.")}
    ops = sorted(
        ((e.key, e.self_cpu_time_total / 1e3) for e in ev if e.key.startswith("aten::")), key=lambda kv: -kv[1]
    )[:12]
    return {"wall_ms": wall * 1e3, "rollout_ms": rec["rollout_s"] * 1e3, "labels": labels, "ops": ops}


def run_point(spec: dict) -> dict:
    """`worker(spec)` in a fresh subprocess (its ru_maxrss is this point's alone)."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(spec["threads"]),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    res = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, env=env, timeout=3600
    )
    if res.returncode != 0:
        raise SystemExit(f"worker failed for {spec}:\n{res.stderr[-3000:]}")
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def fit(points: list[tuple[int, int, int]]) -> tuple[float, float]:
    """Least squares ``step_peak = a + b * (B*R*V)``: returns (a bytes, b bytes per element)."""
    xs = [float(B * R * VOCAB) for B, R, _ in points]
    ys = [float(y) for _, _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def section_grid(args, base: dict) -> dict[str, float]:
    """The batch x response grid, one-shot vs saving settings; returns the fitted bytes/element per method."""
    Bs, Rs = (4, 16), (16, 64)
    if args.quick:
        Bs, Rs = (4, 8), (16, 32)
    variants = {"one-shot": {}, "mb2+chunk16": SAVING, "mb2+chunk16+ckpt": {**SAVING, "gradient_checkpointing": True}}
    per_elem = {}
    for method in ("opd", "nca"):
        print(f"\n[grid] method={method}, V={VOCAB} (GiB; step = peak above the resident set before the step)")
        print(f"  {'B':>3} {'R':>4} " + "".join(f"{v:>26}" for v in variants) + "   ratio saving/one-shot")
        one_shot = []
        for B in Bs:
            for R in Rs:
                got = {v: run_point({**base, "method": method, "B": B, "R": R, "set": s}) for v, s in variants.items()}
                one_shot.append((B, R, got["one-shot"]["step_peak"]))
                cells = "".join(
                    f"   peak {g['peak'] / GiB:6.2f} step {g['step_peak'] / GiB:6.2f}" for g in got.values()
                )
                ratio = " ".join(f"{got[v]['peak'] / got['one-shot']['peak']:.3f}" for v in list(variants)[1:])
                print(f"  {B:>3} {R:>4}{cells}   {ratio}", flush=True)
        a, b = fit(one_shot)
        per_elem[method] = b
        print(f"  fit (one-shot): step peak = {a / 2**20:.0f} MiB + {b:.1f} bytes x B*R*V")
    return per_elem


def section_target(args, base: dict) -> None:
    B, R = (16, 64) if not args.quick else (8, 32)
    ref = run_point({**base, "method": "nca", "B": B, "R": R, "set": {}})
    got = run_point({**base, "method": "nca", "B": B, "R": R, "set": SAVING})
    ratio = got["peak"] / ref["peak"]
    dl = abs(got["loss"] - ref["loss"]) / abs(ref["loss"])
    dg = abs(got["grad_norm"] - ref["grad_norm"]) / abs(ref["grad_norm"])
    ok = ratio <= 0.35 and dl <= 1e-4 and dg <= 1e-3
    print(f"\n[target] NCA B {B} x R {R}, V={VOCAB}: --set micro_batch_size=2 --set logit_chunk=16 vs one-shot")
    print(
        f"  peak {got['peak'] / GiB:.3f} GiB vs {ref['peak'] / GiB:.3f} GiB: ratio {ratio:.3f} (target <= 0.35); "
        f"step's own peak {got['step_peak'] / GiB:.3f} vs {ref['step_peak'] / GiB:.3f} GiB "
        f"({got['step_peak'] / ref['step_peak']:.3f})"
    )
    print(
        f"  step-1 loss {got['loss']:.8g} vs {ref['loss']:.8g} (rel {dl:.1e}, <= 1e-4); grad norm "
        f"{got['grad_norm']:.8g} vs {ref['grad_norm']:.8g} (rel {dg:.1e}, <= 1e-3)  {'PASS' if ok else 'FAIL'}"
    )
    print(
        f"  response length {got['response_len']:.1f} / {ref['response_len']:.1f}; step s {got['step_s'][0]:.2f} "
        f"vs {ref['step_s'][0]:.2f}"
    )
    return ok


def section_time(args, base: dict, small: dict) -> None:
    n = 3
    B, R = (4, 32) if args.quick else (8, 32)
    print(f"\n[time] median step s over steps 2..{n} (batch {B} x {R} new tokens; rollout share in brackets)")
    for method in ("opd", "nca"):
        for label, s in (("one-shot", {}), ("mb2+chunk16", SAVING)):
            big = run_point({**base, "method": method, "B": B, "R": R, "set": s, "steps": n})
            sm = run_point({**small, "method": method, "B": B, "R": R, "set": s, "steps": n})
            tb, ts = statistics.median(big["step_s"][1:]), statistics.median(sm["step_s"][1:])
            rb, rs = statistics.median(big["rollout_s"][1:]), statistics.median(sm["rollout_s"][1:])
            print(
                f"  {method} {label:>12}: V=151936 {tb:6.2f} s [{rb:5.2f}]   V=171 {ts:6.3f} s [{rs:5.3f}]   "
                f"ratio {tb / ts:6.1f}x",
                flush=True,
            )


def section_profile(args, base: dict) -> None:
    B, R = (4, 32) if args.quick else (8, 64)
    for method, s in (("nca", {}), ("nca", SAVING), ("opd", {"estimator": "sampled"})):
        got = run_point({**base, "method": method, "B": B, "R": R, "set": s, "steps": 2, "profile": True})
        p = got["profile"]
        print(
            f"\n[profile] {method} {s or 'one-shot'} B {B} x R {R}, V={VOCAB}: step {p['wall_ms']:.0f} ms, rollout "
            f"{p['rollout_ms']:.0f} ms (CPU ms per label, inclusive; labels nest)"
        )
        for k, v in sorted(p["labels"].items(), key=lambda kv: -kv[1]):
            print(f"  {k:<34} {v:9.1f}  {100 * v / p['wall_ms']:5.1f} %")
        print("  top aten ops by self time: " + ", ".join(f"{k[6:]} {v:.0f}" for k, v in p["ops"][:8]))


def section_liger(args) -> None:
    from liger_bench import liger_vs_mechopd  # bench/liger_bench.py

    liger_vs_mechopd(n=512 if args.quick else 1024, vocab=VOCAB, threads=args.threads)


def parse_per_element(text: str | None) -> dict[str, float | None]:
    if not text:
        return {"opd": None, "nca": None}
    return {k: float(v) for k, v in (kv.split("=") for kv in text.split(","))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sections", default="grid,target,time,profile,liger,project")
    p.add_argument("--quick", action="store_true", help="smaller grid and steps (a smoke run)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--per-element", default=None, help="project from a previous grid's fit: opd=23.9,nca=27.7")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    sections = args.sections.split(",")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    print(f"bench/memory.py: torch {torch.__version__}, threads {args.threads}, load {os.getloadavg()[0]:.2f}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if sections == ["project"]:
            project_recipes(ROOT / "training" / "paper", parse_per_element(args.per_element))
            return 0
        base = {
            "student": str(build(root / "s", VOCAB, 0)),
            "teacher": str(build(root / "t", VOCAB, 1)),
            "threads": args.threads,
        }
        per_elem = {"opd": None, "nca": None}
        if args.per_element:
            per_elem = parse_per_element(args.per_element)
            print(f"bytes per element from the command line (a previous grid's fit): {per_elem}")
        if "grid" in sections:
            per_elem = section_grid(args, base)
        if "target" in sections:
            ok = section_target(args, base) and ok
        if "time" in sections:
            from mechopd.organisms.pretrain import organism_vocab
            from mechopd.organisms.tokenizer import build_tokenizer

            n = len(build_tokenizer(organism_vocab()))
            small = {
                **base,
                "student": str(build(root / "s_small", n, 0)),
                "teacher": str(build(root / "t_small", n, 1)),
            }
            section_time(args, base, small)
        if "profile" in sections:
            section_profile(args, base)
    if "liger" in sections:
        section_liger(args)
    if "project" in sections:
        project_recipes(ROOT / "training" / "paper", per_elem)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
