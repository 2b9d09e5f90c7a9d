"""`TrainConfig`'s sections other than the loss terms' and selector's (those are `mechopd.config.terms`): run,
rollout, optim, log, render, scale, LoRA, teacher. Each field declared once with `mechopd.core.options.option` (its
default, help, range and choices); `mechopd.config.TrainConfig` inherits them all, flat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mechopd.core.options import GE0, GE1, GT0, SEED_RANGE, TEMPERATURE_RANGE, UNIT, option

SHARDINGS = ("none", "fsdp")  # train.sharding implements them
TEACHER_MODES = ("frozen", "live", "ema")  # `train.teachers`
LOSS_HEADS = ("auto", "fused", "logits")  # `train.headstep`
FUSED_TERMS = frozenset(
    {"opd", "nca"}
)  # the terms the fused head computes (`objectives.head`); others: the logits path
LR_SCHEDULES = ("constant", "linear", "cosine")  # `train.lr.lr_multiplier`
DECODERS = ("auto", "lean", "hf", "vllm")  # engine names (rollout_engine, eval's engine): lean where it can run else
#                                          hf (`generate.lean`), ``model(...)`` per step, vLLM (extra)
PREFIX_MODES = ("auto", "off")  # `generate.prefix`
VLLM_OPTIONS = (
    "gpu_memory_utilization",
    "enforce_eager",
    "max_model_len",
    "max_num_seqs",
    "kv_cache_memory_bytes",
)  # rollout_engine=vllm's vllm_options: `generate.vllm_engine.VllmEngine`'s keywords
ROLLOUT_DTYPES = ("same", "bfloat16")  # `train.rollcopy`: the student itself, or its bfloat16 copy, samples
ADAMW_IMPLS = ("default", "fused")  # `train.parts`: torch.optim.AdamW as torch picks it, or fused=True


@dataclass
class RunOptions:
    """Task, models and method."""

    task: str = option("rules", short=True, help="task: a registered name (--help lists each task's options)")
    task_options: dict[str, Any] = option(
        default_factory=dict, help="keywords of the task's factory (--option KEY=VALUE or --set task_options.KEY=VALUE)"
    )
    student: str = option(
        "organism:rules",
        short=True,
        help="student checkpoint dir, hub id, organism:<task> (pretrain / reuse the embedded organism) or model:NAME "
        "(a fetched pretrained model: mechopd fetch)",
    )
    teacher: str | None = option(
        None,
        short=True,
        help="teacher checkpoint (dir, hub id or model:NAME); null = the frozen initial student (self-distillation), "
        "else cross-model",
    )
    method: str = option(
        "opd",
        short=True,
        registry="method",
        help="a registered "
        "loss-term set (a method named after a selector = opd + that selector); the follow term goes with any "
        "method: --set follow_weight=1",
    )


@dataclass
class RolloutOptions:
    """Rollouts: how responses are sampled and how many."""

    temperature: float | None = option(
        None, range=TEMPERATURE_RANGE, help="sampling temperature; null = the task's (1.0 QA, 0.7 games)"
    )
    max_new_tokens: int | None = option(None, range=GE1, help="response length cap; null = the task's")
    batch_size: int = option(
        128, range=GE1, short=True, help="prompts (games) per optimizer step, global across processes"
    )
    pool_size: int = option(
        2048,
        range=GE1,
        help="training items the run cycles through in seeded epochs "
        "(independent of steps: a resumed run sees the same data)",
    )
    rollout_engine: str = option(
        "auto",
        choices=DECODERS,
        help="auto (lean where it can run, else hf) | lean (`generate.lean`: Llama / Qwen2 / Qwen3) | hf "
        "(model(...) per decode step, any causal LM) | vllm (colocated vLLM, extra mechopd[vllm])",
    )
    vllm_options: dict[str, Any] = option(default_factory=dict, help=f"VllmEngine keywords: {', '.join(VLLM_OPTIONS)}")
    shared_prefix: str = option(
        "auto",
        choices=PREFIX_MODES,
        onoff=True,
        help="auto: a context-view prefix common to every row is "
        "computed once per batch (exact); off: every row in full",
    )
    rollout_dtype: str = option(
        "same",
        choices=ROLLOUT_DTYPES,
        help="same: the student samples its own rollouts (on-policy) | bfloat16: a bfloat16 copy of the student, "
        "refreshed after every optimizer step, samples them (faster decoding, but OFF-policy by the cast: "
        "docs/real_models.md; labelled 'bf16 rollouts'); the loss, the teacher and evaluation stay in dtype; "
        "needs dtype: float32 and the built-in decoder",
    )


@dataclass
class OptimOptions:
    """The optimizer (AdamW) and its schedule."""

    lr: float = option(5e-6, range=GT0, short=True, help="AdamW learning rate")
    steps: int = option(100, range=GE1, short=True, help="optimizer steps")
    warmup: int = option(0, range=GE0, help="linear warm-up steps")
    lr_schedule: str = option(
        "constant",
        choices=LR_SCHEDULES,
        help="constant (the papers') | linear | cosine (decay to 0 at the last step, `train.lr`)",
    )
    weight_decay: float = option(0.0, range=GE0, help="AdamW weight decay")
    grad_clip: float = option(1.0, range=GT0, help="gradient-norm clip")
    adamw: str = option(
        "default",
        choices=ADAMW_IMPLS,
        help="default: torch's AdamW as torch picks it (CPU: one tensor at a time; every earlier run's updates, "
        "bit for bit) | fused: one kernel per tensor (`fused=True`), 2-3x faster on SmolLM2-135M on CPU, each "
        "update within one float32 ulp of default's (not bit-equal: a long run's trajectory drifts)",
    )
    seed: int = option(0, range=SEED_RANGE, short=True, help="seed of data order, rollouts and selection")


@dataclass
class LogOptions:
    """What is evaluated, saved and logged."""

    eval_every: int = option(0, range=GE0, short=True, help="evaluate both views every N steps (0 = never)")
    eval_n: int = option(200, range=GE0, help="held-out items per periodic evaluation (0 = off)")
    save_every: int = option(0, range=GE0, help="checkpoint every N steps (0 = only the final one)")
    keep_checkpoints: bool = option(
        True,
        help="keep the checkpoints once final/ is written (false: they only serve a resume and are removed then; "
        "either way only the latest holds the optimizer state)",
    )
    log_tensorboard: bool = option(False, help="RUN/tensorboard (extra mechopd[tensorboard])")
    log_wandb: bool = option(
        False, help="W&B under RUN/wandb, offline unless WANDB_MODE says otherwise (extra mechopd[wandb])"
    )
    wandb_project: str = option("mechopd", help="W&B project")
    grad_stats_every: int = option(
        0, range=GE0, help="every N steps: per-term gradient norms, cosines, dominance (0 = off; needs sharding: none)"
    )


@dataclass
class RenderOptions:
    """How the two views are rendered (`views.RenderSpec`)."""

    no_context_system: str | None = option(None, help="system message of the no-context view (null = none)")
    chat_template_kwargs: dict[str, Any] = option(
        default_factory=dict, help="chat-template variables (--set chat_template_kwargs.KEY=VALUE)"
    )


@dataclass
class ScaleOptions:
    """Hardware, processes and memory (docs/scaling.md)."""

    dtype: str = option(
        "float32",
        choices=("float32", "bfloat16", "float16"),
        help="weights' dtype; bfloat16 / float16 also run the forwards under autocast (losses in float32)",
    )
    device: str = option("auto", help="auto | cpu | cuda | ...")
    organism_dir: str = option("runs/organisms", help="where organisms are pretrained / reused")
    sharding: str = option(
        "none",
        choices=SHARDINGS,
        help="none: full replicas, gradients all-reduced; fsdp: FSDP2 per decoder layer (same update)",
    )
    micro_batch_size: int | None = option(
        None,
        range=GE1,
        help="rows per forward/backward inside one step (gradients accumulated; null = all of this process's rows)",
    )
    logit_chunk: int | None = option(
        None,
        range=GE1,
        help="response positions per LM-head / loss chunk (null = the whole response; needs sharding: none)",
    )
    gradient_checkpointing: bool = option(False, help="recompute the student's decoder layers in backward")
    loss_head: str = option(
        "auto",
        choices=LOSS_HEADS,
        help="fused: losses and their gradients from hidden states "
        "chunk by chunk, no logits kept (`objectives.head`); auto = fused for the opd and nca terms at vocab "
        ">= 8192 (`train.headstep`); logits: the LM head's logits path",
    )


@dataclass
class LoraOptions:
    """LoRA (`mechopd.models.lora`): ΔW = (α / r) B A on lora_targets, the base weights frozen."""

    lora_rank: int = option(0, range=GE0, help="0 = off (every weight trains); r > 0: a peft adapter of rank r")
    lora_alpha: float = option(16.0, range=GT0, help="α of ΔW = (α / r) B A")
    lora_dropout: float = option(0.0, range=GE0, help="adapter input dropout, < 1")
    lora_targets: list[str] | None = option(None, help="module names; null = q/k/v/o/gate/up/down_proj")

    @property
    def uses_lora(self) -> bool:
        """A peft adapter trains (``lora_rank`` > 0), not every weight."""
        return self.lora_rank > 0


@dataclass
class TeacherOptions:
    """The teacher's weights (`train.teachers`)."""

    teacher_mode: str = option(
        "frozen",
        choices=TEACHER_MODES,
        help="frozen: the initial student or the "
        "cross-model teacher; live: the current student, no grad; ema: θ_T ← d·θ_T + (1−d)·θ",
    )
    ema_decay: float = option(0.99, range=UNIT, help="d of the EMA teacher")
