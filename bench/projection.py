"""Projected peak GPU memory per process of the paper recipes (training/paper/*.yaml), from bench/memory.py's fit.

No checkpoint is downloadable here, so the architectures are their published configs (ARCHS). Per process, with
``P`` student and ``P_t`` teacher parameters (bf16), rows ``n`` = batch_size / processes x samples per item, prompt
length ``L`` (ASSUMED per task, PROMPT below), response length ``R`` = max_new_tokens, hidden ``h``, ``layers``:

  states      8 P + 2 P_t bytes: student bf16 weights, gradients and two AdamW moments (2 bytes each), the frozen
              teacher's bf16 weights (self-distillation still loads a second copy as the teacher)
  rollout     KV cache of n rows x (L + R) positions (2 x layers x kv_heads x head_dim x 2 bytes per position) plus the
              sampler's float32 [n, V] logits (3 live copies)
  loss        b x m x c x V bytes: b = the fitted bytes per batch*response*vocab element of the one-shot step
              (measured, float32 log-probs as mechopd computes them at any model dtype), m = micro_batch_size or n,
              c = logit_chunk or R (an upper bound per element for the chunked path)
  activations the student's trunk(s) with grad for m rows over (L + R) positions per view with grad (2 views for NCA,
              DualOPD, SymKL): 34 h bytes per position and layer (Korthikanti et al. 2022, 16-bit, attention
              through SDPA so no L^2 term), or with gradient_checkpointing 2 h per position and layer plus one
              layer's 34 h; plus the kept teacher/student final hidden states, 4 h bytes x n x R each
  peak        states + max(rollout, loss + activations); fits a GPU when <= 90 % of its memory (10 % margin for the
              allocator's fragmentation and the CUDA context)
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

GiB = 2**30
PROCESSES = 8  # training/launch/multi_gpu.yaml and fsdp.yaml: num_processes 8
GPUS = {"80 GB": 80e9, "141 GB": 141e9}
MARGIN = 0.90
ARCHS = {  # published configs: params, hidden, layers, kv heads, head dim, vocab
    "Qwen/Qwen3-4B": dict(params=4.02e9, hidden=2560, layers=36, kv=8, head_dim=128, vocab=151936),
    "Qwen/Qwen3-1.7B": dict(params=2.03e9, hidden=2048, layers=28, kv=8, head_dim=128, vocab=151936),
    "meta-llama/Llama-3.2-3B-Instruct": dict(params=3.21e9, hidden=3072, layers=28, kv=8, head_dim=128, vocab=128256),
}
PROMPT = {"sokoban": 400, "jsonl": 700}  # ASSUMED prompt tokens of the context view (board + rules; context file)
TWO_VIEWS = {"nca", "dual_opd", "sym_kl"}


def recipe_peak(cfg: dict, per_elem: dict[str, float], saving: bool = True) -> dict[str, float]:
    """The terms of the module docstring for one recipe dict (``saving=False``: the one-shot step)."""
    s = ARCHS[cfg["student"]]
    t = ARCHS[cfg.get("teacher") or cfg["student"]]
    V = min(s["vocab"], t["vocab"])
    opts = cfg.get("task_options", {})
    samples = int(opts.get("step_budget", 1)) if cfg["task"] in ("sokoban", "frozenlake") else 1
    n = math.ceil(cfg["batch_size"] / PROCESSES) * samples
    R = int(cfg.get("max_new_tokens") or opts.get("max_new_tokens") or 512)
    L = PROMPT[cfg["task"]]
    m = (cfg.get("micro_batch_size") or n) if saving else n
    c = (cfg.get("logit_chunk") or R) if saving else R
    ckpt = bool(cfg.get("gradient_checkpointing")) and saving
    b = per_elem["nca" if cfg["method"] in TWO_VIEWS else "opd"]
    views = 2 if cfg["method"] in TWO_VIEWS else 1
    h, layers = s["hidden"], s["layers"]
    per_pos = (2 * h * layers + 34 * h) if ckpt else 34 * h * layers
    out = {
        "states": 8 * s["params"] + 2 * t["params"],
        "rollout": n * (L + R) * 2 * t["layers"] * t["kv"] * t["head_dim"] * 2 + 3 * 4 * n * V,
        "loss": b * min(m, n) * min(c, R) * V,
        "activations": views * min(m, n) * (L + R) * per_pos + 2 * 4 * n * R * h,
    }
    out["peak"] = out["states"] + max(out["rollout"], out["loss"] + out["activations"])
    return out


def project_recipes(folder: Path, per_elem: dict[str, float | None]) -> None:
    """Print every recipe's projected peak per process, one-shot and as shipped, against both GPU sizes."""
    if any(v is None for v in per_elem.values()):
        print("\n[project] needs the grid's fit (run with the grid section); not projected")
        return
    print(
        f"\n[project] per process, {PROCESSES} processes, bytes/element opd {per_elem['opd']:.1f}, nca "
        f"{per_elem['nca']:.1f} (the grid fit of bench/memory.py); GiB; fits = peak <= {MARGIN:.0%} of the GPU"
    )
    print(
        f"  {'recipe':<34} {'settings':<34} {'states':>7} {'rollout':>8} {'loss':>8} {'activ':>8} {'peak':>8}  "
        + "  ".join(GPUS)
    )
    for path in sorted(folder.glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        for saving in (False, True):
            p = recipe_peak(cfg, per_elem, saving)
            label = (
                "one-shot"
                if not saving
                else (
                    f"as shipped: mb={cfg.get('micro_batch_size')} chunk="
                    f"{cfg.get('logit_chunk')} ckpt={bool(cfg.get('gradient_checkpointing'))}"
                )
            )
            fits = "  ".join(f"{'fits' if p['peak'] <= MARGIN * g else 'NO':>6}" for g in GPUS.values())
            print(
                f"  {path.stem:<34} {label:<34} "
                + " ".join(
                    f"{p[k] / GiB:{8 if k != 'states' else 7}.1f}"
                    for k in ("states", "rollout", "loss", "activations", "peak")
                )
                + f"  {fits}"
            )
