"""Pretrain a model organism from scratch on CPU: a tiny Qwen3 (or Llama) decoder + the word-level tokenizer.

The corpus comes from the task (`Task.pretrain_corpus`, part of the task protocol): (context or None, prompt,
response) triples on train items, rendered through the SAME two-view renderer as training and evaluation (chat
template, context placement), loss on the response tokens and the end-of-turn token only. Deterministic for a seed
(torch + Python RNGs seeded, single-threaded data order). A finished organism is cached: asking again for the same
(task, config) in the same directory reuses it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mechopd.config.sections import RunOptions
from mechopd.core.errors import ConfigError, TrainingError
from mechopd.core.options import GE1, GT0, SEED_RANGE, Facts, Range, check_fields, check_value, field_facts, option
from mechopd.core.runlock import hold
from mechopd.core.views import RenderSpec, render_prompt_ids_batch
from mechopd.models import atomic_save
from mechopd.organisms.tokenizer import EOS, build_tokenizer
from mechopd.tasks.base import Task, get_task

ORGANISM_TASKS = ("rules", "frozenlake", "sokoban")
MARKER = "organism.json"
# Per task: bump when that task's pretraining corpus changes meaning (the organism cache key includes it, so only that
# task's cached organisms are retrained). Games 2: read-out line + worked replies; 3: multi-box Sokoban read-out.
CORPUS_VERSION: dict[str, int] = {"rules": 1, "frozenlake": 3, "sokoban": 3}


ARCHS = ("qwen3", "llama")  # the decoder architectures an organism is built as (`model_config`)


@dataclass
class OrganismConfig:
    """A model organism: architecture size and pretraining schedule (defaults: the organisms of docs/organisms.md).
    Every field is an `option` (help, range, choices declared once): `mechopd pretrain`'s flags, docs/config.md's
    organism table and the checks in ``__post_init__`` read them."""

    task: str = option(RunOptions.task, help="organism task", choices=ORGANISM_TASKS, metavar="TASK")
    arch: str = option("qwen3", help="decoder architecture", choices=ARCHS, metavar="ARCH")
    hidden_size: int = option(96, help="hidden size of the decoder", range=GE1)
    num_layers: int = option(
        3,
        help="decoder layers (e.g. 8 for layer studies; cached as runs/organisms/<task>-L<n>)",
        range=Range(1, 48),
        flag="--layers",
        metavar="INT",
    )
    num_heads: int = option(
        4,
        help="attention heads (head_dim = hidden_size / num_heads; 3 heads of 96 give 32, a size vLLM's CPU attention accepts)",
        range=GE1,
        metavar="INT",
    )
    num_kv_heads: int = option(2, help="key/value heads (must divide --num-heads)", range=GE1, metavar="INT")
    intermediate_size: int = option(192, help="MLP intermediate size", range=GE1)
    max_position_embeddings: int = option(512, help="longest sequence the organism takes, in tokens", range=GE1)
    steps: int = option(
        600,
        help="pretraining steps (a task's measured schedule may set its own: TASK_DEFAULTS)",
        range=GE1,
        metavar="INT",
    )
    batch_size: int = option(64, help="corpus samples per pretraining step", range=GE1)
    lr: float = option(3e-3, help="peak learning rate (AdamW; warm-up, then cosine to 0)", range=GT0)
    warmup: int = option(50, help="warm-up steps of the learning rate", range=GE1)
    corpus_size: int = option(40000, help="pretraining corpus samples (the task's `pretrain_corpus`)", range=GE1)
    seed: int = option(
        0,
        help="seed of the initialisation, the corpus, the batches and the held-out check",
        range=SEED_RANGE,
        metavar="INT",
    )
    task_options: dict[str, Any] = option(default_factory=dict, help="the task's options (`get_task(task, **...)`)")

    def __post_init__(self) -> None:
        check_fields(self)  # every range and choice, one line naming the field (checked before the divisions below)
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ConfigError("organism: hidden_size must divide by num_heads and num_heads by num_kv_heads")

    def key(self) -> str:
        """Cache key: the config plus the organism vocabulary and corpus format (a changed task text retrains)."""
        blob = json.dumps([dataclasses.asdict(self), organism_vocab(), CORPUS_VERSION[self.task]], sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


def organism_vocab() -> list[str]:
    """One vocabulary for every organism, so organisms of different tasks/sizes share a tokenizer."""
    words: set[str] = set()
    for name in ORGANISM_TASKS:
        words |= set(get_task(name).vocab())
    return sorted(words)


def model_config(cfg: OrganismConfig, vocab_size: int, tokenizer: Any):
    from transformers import LlamaConfig, Qwen3Config  # ~1 s (torch.distributed.tensor): not at every verb's start

    common = dict(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if cfg.arch == "qwen3":
        return Qwen3Config(head_dim=cfg.hidden_size // cfg.num_heads, **common)
    return LlamaConfig(head_dim=cfg.hidden_size // cfg.num_heads, **common)


def _encode_corpus(task: Task, tokenizer: Any, n: int, seed: int) -> list[tuple[list[int], int]]:
    """Each sample -> (ids, number of prompt ids). Prompt ids are rendered once per distinct (context, prompt); the
    prompts and the responses are each tokenized in one batched call (the ids of per-text calls, ~5x faster)."""
    spec = RenderSpec(placement=task.placement)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    samples = list(task.pretrain_corpus(n, seed))
    keys = list(dict.fromkeys((ctx, prompt) for ctx, prompt, _ in samples))
    prompt_ids = dict(zip(keys, render_prompt_ids_batch(tokenizer, [(p, c) for c, p in keys], spec)))
    responses = tokenizer([resp for _, _, resp in samples], add_special_tokens=False)["input_ids"] if samples else []
    out = []
    for (ctx, prompt, _), r in zip(samples, responses):
        p = prompt_ids[(ctx, prompt)]
        out.append((p + list(r) + [eos], len(p)))
    return out


def _batch(samples: list[tuple[list[int], int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    L = max(len(s) for s, _ in samples)
    ids = torch.full((len(samples), L), pad, dtype=torch.long)
    labels = torch.full((len(samples), L), -100, dtype=torch.long)
    mask = torch.zeros((len(samples), L), dtype=torch.long)
    for i, (s, p) in enumerate(samples):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, p : len(s)] = torch.tensor(s[p:])
        mask[i, : len(s)] = 1
    return ids, mask, labels


def pretrain(cfg: OrganismConfig, out_dir: str | Path, *, progress: bool = True) -> Path:
    """Pretrain (or reuse) the organism at `out_dir`; returns the checkpoint directory."""
    out = Path(out_dir)
    with hold(out.parent, "pretrain", wait=True):  # a shared cache: a second pretrain waits, then reuses it
        return _pretrain(cfg, out, progress)


def _pretrain(cfg: OrganismConfig, out: Path, progress: bool) -> Path:

    marker = out / MARKER
    if marker.exists():
        meta = read_marker(marker)
        if meta.get("key") == cfg.key():
            return out  # cached
        raise TrainingError(
            f"{out} holds a different organism (key {meta.get('key')} != {cfg.key()}); "
            "choose another --out or delete it"
        )
    if out.exists() and any(out.iterdir()):
        raise TrainingError(f"{out} exists and is not an organism directory; choose another --out")

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    task = get_task(cfg.task, **cfg.task_options)
    tokenizer = build_tokenizer(organism_vocab())
    mcfg = model_config(cfg, len(tokenizer), tokenizer)
    from transformers import AutoModelForCausalLM  # as model_config's

    model = AutoModelForCausalLM.from_config(mcfg)
    corpus = _encode_corpus(task, tokenizer, cfg.corpus_size, cfg.seed)
    longest = max(len(s) for s, _ in corpus)
    if longest > cfg.max_position_embeddings:
        raise ConfigError(
            f"organism: a corpus sample has {longest} tokens > max_position_embeddings "
            f"{cfg.max_position_embeddings}; raise max_position_embeddings"
        )
    losses, seconds = _fit(cfg, model, corpus, tokenizer.pad_token_id, progress)
    model.eval()
    meta = {
        "key": cfg.key(),
        "config": dataclasses.asdict(cfg),
        "final_loss": sum(losses[-50:]) / len(losses[-50:]),
        "seconds": seconds,
        "threads": torch.get_num_threads(),
    }  # float order: provenance
    atomic_save(model, tokenizer, out, extra={MARKER: json.dumps(meta, indent=2)})
    return out


def _fit(
    cfg: OrganismConfig, model: Any, corpus: list[tuple[list[int], int]], pad: int, progress: bool
) -> tuple[list[float], float]:
    """The pretraining loop (AdamW, warm-up then cosine, seeded epochs over the corpus): (per-step losses, seconds)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / cfg.steps))
    )
    rng = random.Random(cfg.seed)
    order: list[int] = []
    model.train()
    t0 = time.time()
    losses = []
    bar = tqdm(range(cfg.steps), desc=f"pretrain {cfg.task}", disable=not progress)
    for step in bar:
        if len(order) < cfg.batch_size:
            fresh = list(range(len(corpus)))
            rng.shuffle(fresh)
            order += fresh
        idx, order = order[: cfg.batch_size], order[cfg.batch_size :]
        ids, mask, labels = _batch([corpus[i] for i in idx], pad)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        if not torch.isfinite(loss):
            raise TrainingError(f"organism pretraining loss became {loss.item()} at step {step}; lower --lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
    return losses, round(time.time() - t0, 1)


# Per-task organism defaults: sizes and schedules chosen to reach the accuracy targets of docs/organisms.md on 2 CPU
# cores (what they reach: docs/organisms.md; why frozenlake's is longer: docs/results.md).
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "rules": {},  # 600 steps; 900 converge further (loss 1.4e-4) but distil worse: OPD stops at Acc_x 0.72 (results.md)
    "frozenlake": {"steps": 900},  # longer than the others, for a margin over the with-context target
    "sokoban": {},
}


def read_marker(marker: Path) -> dict[str, Any]:
    """organism.json as a mapping; a garbled one is one `TrainingError` (delete the organism to pretrain it again)."""
    try:
        meta = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        meta = None
    if not isinstance(meta, dict):
        raise TrainingError(
            f"{marker} is not an organism record (garbled or edited); delete {marker.parent} to "
            "pretrain it again, or restore the file"
        )
    return meta


def default_config(
    task: str,
    *,
    seed: int = OrganismConfig.seed,
    arch: str = OrganismConfig.arch,
    steps: int | None = None,
    layers: int | None = None,
) -> OrganismConfig:
    """The organism for `task` with its defaults (`TASK_DEFAULTS`); `steps` overrides the schedule length, `layers` the depth
    (e.g. 8 for the "which layers, which modules" probes; the default organisms keep 3 layers and their cache keys).
    Every value is checked by `OrganismConfig`'s declarations (the task first: its defaults are looked up by it)."""
    check_value(organism_facts()["task"], task)
    kw = dict(TASK_DEFAULTS[task], task=task, seed=seed, arch=arch)
    if steps is not None:
        kw["steps"] = steps
    if layers is not None:
        kw["num_layers"] = layers
    return OrganismConfig(**kw)


def pretrain_organism(task: str, path: Path, *, progress: bool = True) -> Path:
    """``organism:<task>`` at `path`: its default organism (`default_config`, seed 0) pretrained unless cached there
    (`pretrain`). The ``make`` a command passes to `models.spec.resolve_spec` when it may pretrain."""
    return pretrain(default_config(task, seed=0), path, progress=progress)


def organism_facts() -> dict[str, Facts]:
    """`OrganismConfig`'s declared fields by name (`mechopd pretrain`'s flags, the docs table)."""
    return {f.name: f for f in field_facts(OrganismConfig)}


def organism_dir_name(task: str, layers: int | None = None) -> str:
    """``<task>`` for the default organism, ``<task>-L<layers>`` for another depth (its own cache directory)."""
    return task if layers in (None, OrganismConfig.num_layers) else f"{task}-L{layers}"


# `mechopd demo --fast` (the test suite): a smaller, quicker organism; not expected to reach the accuracy targets.
FAST_ORGANISM: dict[str, Any] = dict(
    hidden_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=96,
    steps=150,
    batch_size=32,
    corpus_size=4000,
)
