"""What a `Trainer` builds once, in order, and then only reads: the task and its training pool, the rendered prompts,
the models, the method's objective (loss terms, anchor gate, token selector), the optimizer and its schedule, the
rollout engine and sampling settings, and the step's scorers. `build_parts` returns them as one `TrainerParts`;
`open_log` opens the metrics log last (after the resumed state is known). Nothing here runs a step.

The build order is the run's: the global RNGs are seeded (``torch.manual_seed(seed)``, ``random.seed(seed)``)
after the inputs are checked and before the models are built, and the optimizer is made over the trainable
parameters in ``named_parameters`` order, so a run and its resume draw the same numbers.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from mechopd.config import TrainConfig, adopt_pins
from mechopd.core.checks import check_task_vocab, resolve_device
from mechopd.core.errors import ConfigError
from mechopd.core.model_checks import read_config
from mechopd.evaluation.pinning import train_render
from mechopd.generate.prefix import PrefixStore
from mechopd.generate.settings import SamplingSettings, known_vocab, task_default
from mechopd.models import check_same_tokenizer, load_tokenizer
from mechopd.objectives.follow import check_follow_contexts
from mechopd.objectives.losses import LossTerm, config_terms
from mechopd.objectives.schedule import AccuracyGate, AnchorGate, BetaSchedule, Gate
from mechopd.objectives.select import config_selector
from mechopd.tasks.base import get_task
from mechopd.train import dist, otherbatch, rollcopy, rundir, teachers
from mechopd.train.engine import resolve_student, resolve_teacher, rollout_engine
from mechopd.train.headstep import make_scorer
from mechopd.train.lr import lr_multiplier
from mechopd.train.reporting import Logger, config_block, config_line
from mechopd.train.sharding import make_sharding
from mechopd.train.step import StepOptions, StepScorer, enable_checkpointing

Say = Callable[[str | None], None]  # prints a line on rank 0 (None / "": nothing)


@dataclass(frozen=True)
class Objective:
    """The method: its loss terms (the anchor's weight on a `BetaSchedule`), the anchor gate when a term is
    scheduled (None for OPD: nothing to gate) and the token selector."""

    terms: list[LossTerm]
    gate: Gate | None
    selector: Any

    @property
    def main_terms(self) -> list[LossTerm]:
        return [t for t in self.terms if t.batch == "main"]

    @property
    def other_terms(self) -> list[LossTerm]:
        """Terms scored on a rollout under another context c′ (`otherbatch`; the follow term)."""
        return [t for t in self.terms if t.batch == "other"]


@dataclass(frozen=True)
class TrainerParts:
    """Everything the loop reads and never rebinds (objects such as the optimizer, the gate and the prompt cache
    change inside; the step and data position are the `Trainer`'s own)."""

    cfg: TrainConfig  # resolved: absolute paths, a resumed run's pinned render
    task: Any
    device: torch.device
    tokenizer: Any
    pool: list  # the training items, in their fixed order (epochs shuffle indices into it)
    spec: Any  # the pinned render (`evaluation.pinning.train_render`)
    prompt_cache: dict[tuple, list[int]]  # (prompt, context or None) -> ids (`Trainer._render`)
    resume_from: Path | None  # the checkpoint being resumed
    shard: Any  # `sharding.Replicated` / `FSDP`: how the layout sums gradients, generates and saves
    models: teachers.Models  # student, teacher (teacher_mode / LoRA)
    vocab: int  # ids the student, the teacher and the tokenizer all know
    objective: Objective
    param_names: list[str]
    params: list[torch.nn.Parameter]  # the trainable ones, in `named_parameters` order
    trainable_share: float
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    engine: Any  # the vLLM rollout engine, or None
    rollout_copy: rollcopy.RolloutCopy | None  # rollout_dtype: bfloat16: the student's copy the rollouts sample from
    sampling: SamplingSettings  # the rollout's
    teacher_store: PrefixStore | None  # the frozen teacher's context block, reused step after step
    agree: Callable | None  # several processes: prefix groups agreed across them (`generate/groups.py`)
    scoring: StepScorer  # the main batch's forwards/backwards (`train.step`, `train.headstep`)
    other: otherbatch.OtherBatch | None  # the follow term's rollout and scorer under c′ (None without it)
    max_len: int | None


class _Inputs(NamedTuple):
    """What `build_parts` checks before any model loads (`_inputs`)."""

    cfg: TrainConfig
    task: Any
    device: torch.device
    student_path: str
    teacher_path: str
    tokenizer: Any
    pool: list
    spec: Any
    prompt_cache: dict[tuple, list[int]]
    resume_from: Path | None


def build_parts(
    cfg: TrainConfig, run_dir: rundir.RunDir, resume: bool, progress: bool, rank: int, world: int, say: Say
) -> TrainerParts:
    """Check the inputs (`_inputs`: cheap ones before touching the run directory), then seed the global RNGs and
    build, in this order: models, objective, optimizer and schedule, rollout engine and sampling, scorers."""
    inp = _inputs(cfg, run_dir, resume, progress, rank, say)
    cfg, task, device, tokenizer = inp.cfg, inp.task, inp.device, inp.tokenizer
    dtype = getattr(torch, cfg.dtype)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    shard = make_sharding(cfg.sharding, device)
    models = teachers.build(cfg, inp.student_path, inp.teacher_path, inp.resume_from, dtype, shard, device)
    student, teacher = models.student, models.teacher  # teacher_mode / LoRA: train.teachers
    vocab = known_vocab(tokenizer, student, teacher)  # ids past the tokenizer / a head: out
    objective = build_objective(cfg, task, inp.pool)
    named = [(n, p) for n, p in student.named_parameters() if p.requires_grad]
    param_names, params = [models.param_name(n) for n, _ in named], [p for _, p in named]
    trainable_share, line = models.share_line()
    say(line)
    fused = True if cfg.adamw == "fused" else None  # None: torch's own choice (CPU: per tensor; CUDA: foreach)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(s, cfg.steps, cfg.warmup, cfg.lr_schedule))
    engine = rollout_engine(cfg, student, shard, inp.student_path, device, world)
    copied = rollcopy.make(cfg.rollout_dtype, student)  # None: the student samples its own rollouts
    roller = rollcopy.sampler(student, copied)
    # the rollout's, from its section: only ids the teacher can score are drawn
    sampling = SamplingSettings.from_section(cfg, task, tokenizer, student, others=(teacher,), engine=engine)
    # the frozen teacher's context block, reused step after step (FSDP: every process must run the same forwards)
    teacher_store = PrefixStore() if cfg.sharding == "none" and models.frozen_teacher else None
    agree = dist.agree_prefix if dist.active() else None  # one process: prefix groups (generate/groups.py)
    max_len = getattr(student.config, "max_position_embeddings", None)
    if cfg.gradient_checkpointing:
        enable_checkpointing(student)
    opts = step_options(cfg, sampling.temperature, vocab, dtype)  # scored at the rollout's temperature
    scoring = make_scorer(cfg, student, teacher, objective.main_terms, objective.selector, params, opts, teacher_store)
    say(scoring.head_line)  # which head `loss_head` resolved to (train.headstep), and why
    other = None
    if objective.other_terms:  # the follow term's batch under c′: its own scorer, the main one's stage clock
        other_scoring = otherbatch.scorer(student, teacher, objective.other_terms, objective.selector, params, opts)
        other_scoring.clock = scoring.clock  # seconds per stage (train.profile), shared by both scorers
        other = otherbatch.OtherBatch(
            cfg, task, roller, sampling, agree, other_scoring, tokenizer.pad_token_id, max_len, device
        )
    check_split_head(cfg.logit_chunk, scoring)
    return TrainerParts(
        cfg=cfg,
        task=task,
        device=device,
        tokenizer=tokenizer,
        pool=inp.pool,
        spec=inp.spec,
        prompt_cache=inp.prompt_cache,
        resume_from=inp.resume_from,
        shard=shard,
        models=models,
        vocab=vocab,
        objective=objective,
        param_names=param_names,
        params=params,
        trainable_share=trainable_share,
        opt=opt,
        sched=sched,
        engine=engine,
        rollout_copy=copied,
        sampling=sampling,
        teacher_store=teacher_store,
        agree=agree,
        scoring=scoring,
        other=other,
        max_len=max_len,
    )


def check_split_head(logit_chunk: int | None, scoring: StepScorer) -> None:
    """``logit_chunk`` needs an LM head that runs apart from its trunk (a plain linear head over the base model)."""
    if logit_chunk is not None and not all(scoring.split.values()):
        raise ConfigError(
            f"logit_chunk={logit_chunk}: this model's LM head cannot run apart from its trunk "
            "(not a plain linear head over the base model); set logit_chunk=null"
        )


def _inputs(cfg: TrainConfig, run_dir: rundir.RunDir, resume: bool, progress: bool, rank: int, say: Say) -> _Inputs:
    """The resolved config, the task, its training pool and the pinned render, the student's and teacher's
    directories and the checkpoint to resume: all checked before any model loads."""
    cfg, path_note = rundir.record_paths(cfg, run_dir, resume)  # absolute; a resume reads the run's
    task = get_task(cfg.task, **cfg.task_options)  # validate cheap inputs before touching --out
    adopt_pins(cfg, run_dir.config, resume)  # a resumed run keeps its pinned render
    resume, note = rundir.prepare(run_dir, cfg, resume, rank == 0)
    say(path_note)
    dist.barrier()
    device = resolve_device(cfg.device)  # a named device this machine lacks fails before any loading
    student_path = resolve_student(
        cfg, device, progress=progress, main=rank == 0, barrier=dist.barrier
    )  # organism:<task> pretrained on demand (vLLM, CPU: hd32)
    tokenizer = load_tokenizer(student_path)
    check_task_vocab(tokenizer, task)  # as evaluation does: no training on <unk> soup
    rundir.check_items(task, cfg)  # pool_size / eval_n within the task's item space, before any model
    pool = task.examples("train", cfg.pool_size, cfg.seed)
    max_new = task_default(cfg, task, "max_new_tokens")  # the rollout's response cap (SamplingSettings')
    prompt_cache: dict[tuple, list[int]] = {}
    spec, pinned = train_render(
        tokenizer, task, pool, cfg, max_new, read_config(student_path), prompt_cache
    )  # pinned and length-checked before any load; the pool's prompts rendered once, here
    say("\n".join(t for t in (note, pinned) if t))
    teacher_path = resolve_teacher(cfg, student_path, main=rank == 0, barrier=dist.barrier)
    if cfg.teacher:
        check_same_tokenizer(tokenizer, load_tokenizer(teacher_path))
    resume_from = rundir.latest_checkpoint(run_dir.root) if resume else None
    return _Inputs(cfg, task, device, student_path, teacher_path, tokenizer, pool, spec, prompt_cache, resume_from)


def build_objective(cfg: TrainConfig, task: Any, pool: list) -> Objective:
    """The method's loss terms (with the anchor schedule and its gate) and the token selector."""
    gate: Gate | None = None
    if cfg.nca_gate is not None:
        gate = AnchorGate(cfg.nca_gate, cfg.nca_gate_window)
    elif cfg.nca_gate_acc is not None:
        if task.is_game:
            raise ConfigError(f"nca_gate_acc scores single replies; task {task.name!r} is a game: use nca_gate (KL)")
        gate = AccuracyGate(cfg.nca_gate_acc, cfg.nca_gate_window)
    # the method's terms, then the added ones (follow_weight > 0: the follow term, on its own rollout under c′)
    terms = config_terms(cfg, schedule=BetaSchedule(cfg.nca_start, cfg.beta_warmup, gate))
    gate = gate if any(t.schedule is not None for t in terms) else None  # OPD: nothing to gate
    if any(t.batch == "other" for t in terms) or cfg.follow_contexts:  # unknown names refused whatever the weight
        check_follow_contexts(task, pool, cfg.follow_contexts)
    return Objective(terms, gate, config_selector(cfg))


def step_options(cfg: TrainConfig, temperature: float, vocab: int, dtype: torch.dtype) -> StepOptions:
    """The step's forwards/backwards (`train.step`): micro-batches, logit chunks, the student's shared prefix (off
    under FSDP or activation checkpointing), autocast."""
    return StepOptions(
        temperature=temperature,
        vocab=vocab,
        budget=cfg.budget,
        seed=cfg.seed,
        micro_batch_size=cfg.micro_batch_size,
        logit_chunk=cfg.logit_chunk,
        shared_prefix=cfg.shared_prefix,
        student_shared_prefix="off" if (cfg.sharding == "fsdp" or cfg.gradient_checkpointing) else None,
        autocast=dtype if dtype in (torch.bfloat16, torch.float16) else None,
    )


def open_log(
    cfg: TrainConfig, run_dir: rundir.RunDir, main: bool, step: int, resume_from: Path | None, verbose: bool, say: Say
) -> Logger:
    """The metrics log, opened once the resumed step is known; rank 0 first clears a fresh run's leftovers and
    writes the resolved config. A resume keeps the lines past its checkpoint until the first new line."""
    fresh = resume_from is None
    if main and fresh:
        rundir.clear_unfinished(run_dir)
    if main:
        run_dir.root.mkdir(parents=True, exist_ok=True)
        rundir.write_config(cfg, run_dir)
        say(rundir.read_metrics(run_dir.metrics)[1])  # the lines past the checkpoint stay until
    path = run_dir.metrics  # the first new line: a resume that stops before it loses none
    logger = Logger(
        path,
        main,
        cfg.log_tensorboard,
        cfg.log_wandb,
        cfg.to_dict(),
        fresh=fresh,
        project=cfg.wandb_project,
        before_first=(lambda: rundir.truncate_metrics(path, step)) if not fresh else None,
    )
    say(config_block(cfg, resume_from) if verbose else config_line(cfg, run_dir.config, resume_from))
    return logger
