"""Benchmark: organism pretraining step time at depth L (default 8) against the default 3-layer organism, in ONE run.

Both organisms are built exactly as `mechopd pretrain --task T [--layers L]` builds them (`default_config`, the shared
organism tokenizer, the task's pretraining corpus through the two-view renderer, AdamW and grad clip 1.0 as in
`organisms/pretrain.py`), and run the SAME batches. Steps run interleaved (3-layer, L-layer, 3-layer, ...), so both
see the same machine load within one cycle; the first --warmup cycles are dropped. Printed: the median step time of
each, the paired ratio (median over cycles of t_L / t_3, with a bootstrap 95 % interval), and the estimated
pretraining time of the deep organism = ratio x the default organism's measured time (README's organism table), since
the two share every other setting (steps, batch, corpus). No target: this measures what a deeper organism costs.

    python bench/organism_depth.py [--task rules] [--layers 8] [--cycles 40] [--warmup 5] [--reference-s 52]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import torch

from mechopd.organisms.pretrain import _batch, _encode_corpus, default_config, model_config, organism_vocab
from mechopd.organisms.tokenizer import build_tokenizer
from mechopd.tasks.base import get_task


def build(cfg, tokenizer):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(model_config(cfg, len(tokenizer), tokenizer)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    return model, opt


def step(model, opt, ids, mask, labels) -> float:
    t0 = time.perf_counter()
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="rules")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--cycles", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--reference-s",
        type=float,
        default=52.0,
        help="the default organism's measured pretraining time (s) for the estimate (rules: 52 s)",
    )
    a = p.parse_args()
    torch.set_num_threads(1)
    shallow, deep = default_config(a.task), default_config(a.task, layers=a.layers)
    tokenizer = build_tokenizer(organism_vocab())
    corpus = _encode_corpus(get_task(a.task), tokenizer, shallow.batch_size * (a.cycles + a.warmup), shallow.seed)
    random.Random(0).shuffle(corpus)
    models = {"L3": build(shallow, tokenizer), f"L{a.layers}": build(deep, tokenizer)}
    times: dict[str, list[float]] = {k: [] for k in models}
    for c in range(a.cycles + a.warmup):
        batch = _batch(corpus[c * shallow.batch_size : (c + 1) * shallow.batch_size], tokenizer.pad_token_id)
        for name, (model, opt) in models.items():
            t = step(model, opt, *batch)
            if c >= a.warmup:
                times[name].append(t)
    t3, td = np.array(times["L3"]), np.array(times[f"L{a.layers}"])
    ratios = td / t3
    rng = np.random.default_rng(0)
    boot = [np.median(rng.choice(ratios, ratios.size)) for _ in range(2000)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    r = float(np.median(ratios))
    print(f"task {a.task}, batch {shallow.batch_size}, {a.cycles} interleaved cycles ({a.warmup} warm-up dropped)")
    print(f"  L3           median step {1e3 * statistics.median(t3):8.1f} ms")
    print(f"  L{a.layers:<2}          median step {1e3 * statistics.median(td):8.1f} ms")
    print(f"  ratio L{a.layers}/L3   {r:.2f} [{lo:.2f}, {hi:.2f}] (paired median, bootstrap 95 %)")
    print(
        f"  estimated L{a.layers} pretraining: {r * a.reference_s:.0f} s of training "
        f"({shallow.steps} steps; the 3-layer organism: {a.reference_s:.0f} s)"
    )


if __name__ == "__main__":
    main()
