"""The loss alone at a real vocabulary: mechopd's chunked scoring against liger-kernel's chunked fused linear JSD.

N positions, hidden 64, V rows, float32, one thread. Work: student hidden [N, d] and head [V, d] with grad, teacher
hidden and head without; loss = token mean of the reverse KL KL(q || f) over the full vocabulary; backward into the
hidden states and the student head. Variants, each in a fresh subprocess (peak = ru_maxrss above the resident set
after the inputs exist, in units of one float32 [N, V] tensor):

  mechopd-one-shot   head -> `scorer.to_logp` -> `divergences.reverse_kl_full` on all N positions, one backward
  mechopd-chunked    the same per chunk of 128 positions with a backward per chunk (`train/step.py`'s scheme)
  mechopd-fused      `objectives.head.fused_head_loss` (chunks of 128; the gradient computed in the forward pass, no
                     [chunk, V] tensor kept for backward)
  matmul-floor       the bare LM-head matmul forward + backward per chunk of 128 (student head only): the floor
  liger              `liger_kernel.chunked_loss.LigerFusedLinearJSDLoss(weight_hard_loss=0, weight_soft_loss=1,
                     beta=1 (reverse KL), compiled=False, chunk_size=128)` (pure PyTorch on CPU; liger-kernel 0.8.5
                     installed with ``pip install --no-deps --target DIR`` and put on PYTHONPATH)

    python bench/liger_bench.py [--n 1024] [--vocab 151936] [--rounds 5] [--no-memory]

Then (``--rounds``) the time ratios again, the variants interleaved round by round in one process (the paired ratios
do not move with the machine's load as sequential subprocesses do).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

CHUNK, D, REPEATS = 128, 64, 3


def _inputs(n: int, vocab: int):
    g = torch.Generator().manual_seed(0)
    hs = (torch.randn(n, D, generator=g)).requires_grad_()
    w = (torch.randn(vocab, D, generator=g) * 0.3).requires_grad_()
    ht, wt = torch.randn(n, D, generator=g), torch.randn(vocab, D, generator=g) * 0.3
    return hs, w, ht, wt


def _mechopd(hs, w, ht, wt, chunk: int) -> float:
    from mechopd.generate.scorer import to_logp
    from mechopd.objectives.divergences import reverse_kl_full

    n, total = hs.shape[0], 0.0
    for i in range(0, n, chunk):
        s = to_logp((hs[i : i + chunk] @ w.T)[None], 1.0)
        with torch.no_grad():
            t = to_logp((ht[i : i + chunk] @ wt.T)[None], 1.0)
        loss = reverse_kl_full(s, t).sum() / n
        loss.backward()
        total += float(loss.detach())
    return total


def _fused(hs, w, ht, wt) -> float:
    from mechopd.objectives.head import fused_head_loss

    n = hs.shape[0]
    loss = fused_head_loss(hs, w, ht, wt, torch.full((n,), 1.0 / n), chunk=CHUNK)[0]
    loss.backward()
    return float(loss)


def _floor(hs, w, ht, wt) -> float:
    n, total = hs.shape[0], 0.0
    for i in range(0, n, CHUNK):
        z = hs[i : i + CHUNK] @ w.T  # [chunk, V]
        z.sum().backward()
        total += float(z.detach()[:, 0].sum())
    return total


def _liger(hs, w, ht, wt) -> float:
    from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

    fn = LigerFusedLinearJSDLoss(
        weight_hard_loss=0.0, weight_soft_loss=1.0, beta=1.0, temperature=1.0, compiled=False, chunk_size=CHUNK
    )
    loss = fn(hs, w, ht, wt, torch.zeros(hs.shape[0], dtype=torch.long))
    loss.backward()
    return float(loss)


def variant(name: str, n: int, vocab: int) -> dict:
    torch.set_num_threads(1)
    hs, w, ht, wt = _inputs(n, vocab)
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    times, value = [], None
    for _ in range(REPEATS):
        hs.grad = w.grad = None
        t0 = time.perf_counter()
        fn = {"liger": _liger, "mechopd-fused": _fused, "matmul-floor": _floor}.get(name)
        value = fn(hs, w, ht, wt) if fn else _mechopd(hs, w, ht, wt, n if name.endswith("shot") else CHUNK)
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "peak": peak - before,
        "s": statistics.median(times),
        "loss": value,
        "grad": float(hs.grad.norm()) if hs.grad is not None else None,
    }


def liger_vs_mechopd(n: int, vocab: int, threads: int = 1) -> None:
    print(
        f"\n[liger] the loss alone: N={n} positions, V={vocab}, d={D}; peak in float32 [N, V] units "
        f"({4 * n * vocab / 2**20:.0f} MiB)"
    )
    try:
        import liger_kernel  # noqa: F401

        names = ["mechopd-one-shot", "mechopd-chunked", "mechopd-fused", "matmul-floor", "liger"]
    except ImportError:
        print(
            "  liger-kernel does not import here (pip install --no-deps liger-kernel into a --target dir and put it "
            "on PYTHONPATH); mechopd only"
        )
        names = ["mechopd-one-shot", "mechopd-chunked", "mechopd-fused", "matmul-floor"]
    res = {}
    for name in names:
        out = subprocess.run(
            [sys.executable, __file__, "--variant", name, "--n", str(n), "--vocab", str(vocab)],
            capture_output=True,
            text=True,
            env=dict(os.environ, OMP_NUM_THREADS=str(threads)),
        )
        if out.returncode != 0:
            print(f"  {name}: failed: {out.stderr.strip().splitlines()[-1]}")
            continue
        res[name] = json.loads(out.stdout.strip().splitlines()[-1])
    unit = 4 * n * vocab
    for name, r in res.items():
        print(
            f"  {name:<18} peak {r['peak'] / unit:5.2f} x   time {r['s'] * 1e3:8.1f} ms   loss {r['loss']:.6f}   "
            f"|grad h| {r['grad']:.6f}"
        )
    for name in ("mechopd-chunked", "mechopd-fused"):
        if "liger" in res and name in res:
            a, b = res[name], res["liger"]
            print(
                f"  {name} / liger: memory {a['peak'] / b['peak']:.2f}, time {a['s'] / b['s']:.2f} "
                "(goal for the fused head: memory <= 1.0, time <= 0.8)"
            )
    for name in ("mechopd-fused", "liger"):
        if "matmul-floor" in res and name in res:
            print(f"  {name} / matmul floor: time {res[name]['s'] / res['matmul-floor']['s']:.2f}")


def interleaved(n: int, vocab: int, rounds: int) -> None:
    """Time ratios robust to a drifting machine load: every variant once per round, in ONE process (threads 1), the
    rounds interleaved; medians and per-round paired ratios (memory: the subprocess runs above)."""
    torch.set_num_threads(1)
    names = ["mechopd-chunked", "mechopd-fused", "matmul-floor", "liger"]
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        names.remove("liger")
    hs, w, ht, wt = _inputs(n, vocab)
    fns = {
        "liger": _liger,
        "mechopd-fused": _fused,
        "matmul-floor": _floor,
        "mechopd-chunked": lambda *a: _mechopd(*a, CHUNK),
    }
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds + 1):  # round 0 warms up and is dropped
        for name in names:
            hs.grad = w.grad = None
            t0 = time.perf_counter()
            fns[name](hs, w, ht, wt)
            if r:
                times[name].append(time.perf_counter() - t0)
    print(f"\n[interleaved] {rounds} rounds in one process, threads 1, load average {os.getloadavg()[0]:.1f}")
    for name in names:
        print(f"  {name:<18} median {statistics.median(times[name]) * 1e3:8.1f} ms")
    for a, b in (
        ("mechopd-fused", "liger"),
        ("mechopd-chunked", "liger"),
        ("mechopd-fused", "matmul-floor"),
        ("liger", "matmul-floor"),
        ("mechopd-fused", "mechopd-chunked"),
    ):
        if a in times and b in times:
            paired = sorted(x / y for x, y in zip(times[a], times[b]))
            print(
                f"  {a} / {b}: median of paired ratios {statistics.median(paired):.3f} "
                f"[{paired[0]:.3f}, {paired[-1]:.3f}]"
            )


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--variant", default=None)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (0: skip)")
    p.add_argument("--no-memory", action="store_true", help="skip the per-variant subprocess (memory) runs")
    a = p.parse_args()
    if a.no_memory:
        interleaved(a.n, a.vocab, a.rounds)
    elif a.variant:
        print(json.dumps(variant(a.variant, a.n, a.vocab)))
    else:
        liger_vs_mechopd(a.n, a.vocab)
        if a.rounds:
            interleaved(a.n, a.vocab, a.rounds)
