"""The training step's scoring with ``loss_head: fused`` against the logits path, at a real vocabulary, in ONE run.

Model: a random Qwen3 (2 layers, hidden --hidden, V = --vocab rows, tied head), student = teacher architecture (a
second seed), a two-view batch of --rows rows x --resp response tokens (N = rows x resp positions). The timed call
is `train.step.StepScorer.step` (teacher trunk, student trunk(s), the loss with its gradient, the trunk backward: all
of a step but the rollout and the optimizer), per method (opd, nca) and estimator. Variants:

  logits          `StepScorer`, logit_chunk unset (the trainer's default: [rows, R, V] logits per micro-batch)
  logits-chunked  `StepScorer`, logit_chunk = --chunk / --rows response positions per row, i.e. --chunk positions
                  per chunk as the fused head's (head -> log-softmax -> loss -> backward per chunk)
  fused           `train.headstep.FusedStepScorer` (`objectives.head`, chunks of --chunk positions)

Peak memory: each variant in a fresh subprocess (the peak resident set, VmHWM, reset once model and batch exist,
over the resident set then), in units of one float32 [N, V] tensor. Time: the variants interleaved round by round in one process (one thread), the
median of the paired per-round ratios (robust to the machine's load drifting). Loss and |grad| are printed per
variant (they must agree).

    python bench/loss_head.py [--vocab 151936] [--rows 4] [--resp 64] [--hidden 64] [--chunk 64] [--rounds 5]
                              [--cases opd:topk,nca:topk,opd:full,nca:sampled] [--no-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

VARIANTS = ("logits", "logits-chunked", "fused")


def _model(vocab: int, hidden: int, seed: int):
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


def setup(a, case: str, variant: str):
    """(scorer, batch) for one method:estimator case and variant (same models and batch for every variant)."""
    from mechopd.core.views import assemble_two_views
    from mechopd.objectives.losses import TermOptions, method_terms
    from mechopd.objectives.select import make_selector
    from mechopd.train.headstep import FusedStepScorer
    from mechopd.train.step import StepOptions, StepScorer

    method, estimator = case.split(":")
    student, teacher = _model(a.vocab, a.hidden, 0), _model(a.vocab, a.hidden, 1).requires_grad_(False)
    rng = random.Random(0)
    px = [[rng.randrange(3, a.vocab) for _ in range(16)] for _ in range(a.rows)]
    pc = [[rng.randrange(3, a.vocab) for _ in range(48)] + x for x in px]
    resp = [[rng.randrange(3, a.vocab) for _ in range(a.resp)] for _ in range(a.rows)]
    batch = assemble_two_views(px, pc, resp, 0)
    terms = method_terms(method, 0.5, estimator=estimator, topk=256)
    chunk = None if variant == "logits" else max(1, a.chunk // a.rows)  # logits: positions per ROW; fused: in all
    opts = StepOptions(temperature=1.0, vocab=a.vocab, budget=0.1, seed=0, logit_chunk=chunk, shared_prefix="off")
    args = (student, teacher, terms, make_selector("full"), [p for p in student.parameters()], opts)
    if variant == "fused":
        return FusedStepScorer(*args, options=TermOptions(estimator, 256)), batch
    return StepScorer(*args), batch


def one_step(scorer, batch) -> tuple[float, float, float]:
    scorer.student.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    res = scorer.step(batch, 0)
    dt = time.perf_counter() - t0
    grad = sum(float(p.grad.double().pow(2).sum()) for p in scorer.student.parameters() if p.grad is not None)
    return dt, float(res.loss), grad**0.5


def variant(a, case: str, name: str) -> dict:
    torch.set_num_threads(1)
    scorer, batch = setup(a, case, name)
    with open("/proc/self/clear_refs", "w") as f:  # reset the peak resident set (VmHWM): the setup's peak is not ours
        f.write("5")
    before = _status("VmRSS")
    dt, loss, grad = min(one_step(scorer, batch) for _ in range(2))
    return {"peak": _status("VmHWM") - before, "s": dt, "loss": loss, "grad": grad}


def _status(key: str) -> int:
    """Bytes of /proc/self/status's ``key`` (VmRSS: resident now; VmHWM: its peak since the last reset)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def memory(a, case: str) -> dict:
    res, unit = {}, 4 * a.rows * a.resp * a.vocab
    for name in VARIANTS:
        out = subprocess.run(
            [sys.executable, __file__, "--variant", name, "--cases", case, *_flags(a)],
            capture_output=True,
            text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
        if out.returncode != 0:
            print(f"  {name}: failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        res[name] = json.loads(out.stdout.strip().splitlines()[-1])
    for name, r in res.items():
        print(
            f"  {name:<15} peak {r['peak'] / unit:5.2f} x   one step {r['s'] * 1e3:8.1f} ms   loss {r['loss']:.6f}   "
            f"|grad| {r['grad']:.6f}"
        )
    for ref in ("logits", "logits-chunked"):
        if "fused" in res and ref in res:
            print(f"  fused / {ref}: peak memory {res['fused']['peak'] / res[ref]['peak']:.2f}")
    return res


def _flags(a) -> list[str]:
    return [
        "--vocab",
        str(a.vocab),
        "--rows",
        str(a.rows),
        "--resp",
        str(a.resp),
        "--hidden",
        str(a.hidden),
        "--chunk",
        str(a.chunk),
    ]


def interleaved(a, case: str) -> None:
    torch.set_num_threads(1)
    built = {name: setup(a, case, name) for name in VARIANTS}
    times: dict[str, list[float]] = {k: [] for k in VARIANTS}
    for r in range(a.rounds + 1):  # round 0 warms up and is dropped
        for name in VARIANTS:
            dt = one_step(*built[name])[0]
            if r:
                times[name].append(dt)
    print(f"  time, {a.rounds} interleaved rounds (threads 1, load average {os.getloadavg()[0]:.1f}):")
    for name in VARIANTS:
        print(f"    {name:<15} median {statistics.median(times[name]) * 1e3:8.1f} ms")
    for ref in ("logits", "logits-chunked"):
        paired = sorted(x / y for x, y in zip(times["fused"], times[ref]))
        print(
            f"    fused / {ref}: median of paired ratios {statistics.median(paired):.3f} "
            f"[{paired[0]:.3f}, {paired[-1]:.3f}]"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--resp", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cases", default="opd:topk,nca:topk,opd:full,nca:sampled")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.variant:
        print(json.dumps(variant(a, a.cases, a.variant)))
        return
    for case in a.cases.split(","):
        print(
            f"\n[{case}] V={a.vocab}, N={a.rows}x{a.resp}={a.rows * a.resp} positions, hidden {a.hidden}, chunk "
            f"{a.chunk}; peak in float32 [N, V] units ({4 * a.rows * a.resp * a.vocab / 2**20:.0f} MiB)"
        )
        if not a.no_memory:
            memory(a, case)
        if a.rounds:
            interleaved(a, case)


if __name__ == "__main__":
    main()
