"""Benchmark: the causal probes (lens, patching, attention) against a bare HF forward of the same work, and their memory
as the number of items grows.

Model: a Qwen3 built from a config (``--hidden`` 256, ``--layers`` 4, 8/4 heads, head_dim 32, intermediate 3x hidden)
with the rules organism's word-level tokenizer, random weights; N rules items rendered in both views with random
response ids (lengths 16..48). Every method runs on the same pre-built batches (rendering excluded).

  lens       mechopd.probes.lens.lens  vs  HF: model(**view, output_hidden_states=True) per view, each hidden state
             (embed, layers 0..L-2, final norm; HF has no separate entry for the last layer, so the reference decodes
             one site fewer) at the scored columns through norm + lm_head, log_softmax, KL(p_c || p_x)
  patching   mechopd.probes.patching.patching (resid at every site, attn and mlp of every layer, both directions)
             vs  HF: the same NUMBER of plain forwards (2 clean + one per patch) with full logits and the KL at the
             scored columns, no hook: the floor of the work, so the ratio is the capture/edit overhead
  attention  mechopd.probes.attention.attention  vs  HF: an eager forward with output_attentions=True on the context
             view, the weights at the scored rows summed over the context columns (every layer's [B, H, L, L] held)

Timing: ``--repeats`` rounds, methods interleaved, median; printed ratio mechopd/hf (target <= 1.2 for lens and
attention; patching's reference is a floor). Memory: each probe over N and 10 N items in a fresh subprocess (batches
built lazily), the process's peak RSS (VmHWM); target 10N/N <= 1.1.

    python bench/causal_probes.py [--n 32] [--batch-size 8] [--repeats 3] [--hidden 256] [--layers 4]
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
import time

import torch

PROBES = ("lens", "patching", "attention")


def build(hidden: int, layers: int):
    from transformers import AutoModelForCausalLM, Qwen3Config

    from mechopd.organisms.tokenizer import build_tokenizer
    from mechopd.tasks.base import get_task

    tok = build_tokenizer(get_task("rules").vocab())
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval(), tok


def items(tok, n: int, batch_size: int, seed: int = 0):
    """(batches as a lazy generator factory, context spans) of n rules items with random responses."""
    from mechopd.core.views import RenderSpec, build_two_view_batch
    from mechopd.probes.attention import context_span
    from mechopd.tasks.base import get_task

    spec, rng = RenderSpec("system"), random.Random(seed)
    exs = get_task("rules").examples("test", n, seed)
    resp = [[rng.randrange(5, len(tok)) for _ in range(rng.randint(16, 48))] for _ in exs]
    spans = [context_span(tok, e.prompt, e.context, spec) for e in exs]

    def batches():
        for i in range(0, n, batch_size):
            chunk = exs[i : i + batch_size]
            yield build_two_view_batch(
                tok, [e.prompt for e in chunk], [e.context for e in chunk], resp[i : i + batch_size], spec
            )

    return batches, spans


def ours(name: str, model, batches, spans) -> float:
    from mechopd.probes.attention import attention
    from mechopd.probes.lens import lens
    from mechopd.probes.patching import patching

    if name == "lens":
        return lens(model, batches, temperature=1.0).rows[-1]["kl_c_x"]
    if name == "patching":
        return patching(model, batches, temperature=1.0).rows[-1]["recovered"]
    return attention(model, batches, spans)[0][0]["context_share"]


def _kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = torch.log_softmax(a.double(), -1), torch.log_softmax(b.double(), -1)
    return (a.exp() * (a - b)).sum(-1)


def hf(name: str, model, batches, spans) -> float:
    """The bare-HF reference of each probe (module docstring)."""
    from mechopd.probes.patch_views import plan

    total = 0.0
    with torch.inference_mode():
        for b in batches:
            m = b.response_mask
            if name == "lens":
                hs = {v: model(**b.view(v), output_hidden_states=True, use_cache=False).hidden_states for v in "xc"}
                for hx, hc in zip(hs["x"], hs["c"]):
                    lx = model.lm_head(model.model.norm(b.response_logits(hx, "x")))
                    lc = model.lm_head(model.model.norm(b.response_logits(hc, "c")))
                    total += float(_kl(lc, lx)[m].sum())
            elif name == "patching":
                lx = b.response_logits(model(**b.view("x"), use_cache=False).logits, "x")
                lc = b.response_logits(model(**b.view("c"), use_cache=False).logits, "c")
                for p in plan(model, None, ("resid", "attn", "mlp")):
                    view = "x" if p.direction == "c_to_x" else "c"
                    lp = b.response_logits(model(**b.view(view), use_cache=False).logits, view)
                    total += float((_kl(lc, lp) if view == "x" else _kl(lp, lx))[m].sum())
            else:
                att = model(**b.view("c"), output_attentions=True, use_cache=False).attentions
                P = int(b.cols_c[0, 0])
                lens_ = b.attention_mask_c[:, :P].sum(1)
                for w in att:  # [B, H, L, L]
                    q = b.response_logits(w.permute(0, 2, 1, 3), "c")  # [B, R, H, L]
                    for i, (s, e) in enumerate(spans[: b.batch_size]):
                        a0 = P - int(lens_[i])
                        total += float(q[i, :, :, a0 + s : a0 + e].sum(-1)[m[i]].sum())
    return total


def timing(args) -> None:
    model, tok = build(args.hidden, args.layers)
    make, spans = items(tok, args.n, args.batch_size)
    pre = list(make())
    for name in PROBES:
        times: dict[str, list[float]] = {"mechopd": [], "hf": []}
        if name == "attention":
            model.set_attn_implementation("eager")
        for r in range(args.repeats):
            for method in ["mechopd", "hf"] if r % 2 == 0 else ["hf", "mechopd"]:
                fn = ours if method == "mechopd" else hf
                t0 = time.perf_counter()
                fn(name, model, pre, spans)
                times[method].append(time.perf_counter() - t0)
        model.set_attn_implementation("sdpa")
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{name:>10}: mechopd {med['mechopd']:.3f} s, hf {med['hf']:.3f} s, mechopd/hf "
            f"{med['mechopd'] / med['hf']:.2f}"
        )


def child(args) -> None:
    """One probe over --n items (lazy batches) in this process; prints the peak RSS in MB as JSON."""
    model, tok = build(args.hidden, args.layers)
    make, spans = items(tok, args.n, args.batch_size)
    ours(args.child, model, make(), spans)
    peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
    print(json.dumps({"peak_mb": peak / 1024}))


def memory(args) -> None:
    for name in PROBES:
        peaks = []
        for n in (args.n, 10 * args.n):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                name,
                "--n",
                str(n),
                "--batch-size",
                str(args.batch_size),
                "--hidden",
                str(args.hidden),
                "--layers",
                str(args.layers),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ})
            peaks.append(json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"])
        print(
            f"{name:>10}: peak RSS {peaks[0]:.0f} MB at N={args.n}, {peaks[1]:.0f} MB at 10N; 10N/N "
            f"{peaks[1] / peaks[0]:.3f} ({'met' if peaks[1] / peaks[0] <= 1.1 else 'NOT met'}: <= 1.1)"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--child", choices=PROBES, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        return child(args)
    if not args.skip_timing:
        timing(args)
    if not args.skip_memory:
        memory(args)


if __name__ == "__main__":
    main()
