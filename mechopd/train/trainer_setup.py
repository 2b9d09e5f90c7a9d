"""The `Trainer`'s construction (`mechopd.train.trainer`): the task, tokenizer and render checked before any model
loads; the models, the method's loss terms and selector, the optimizer, the rollout engine and the step's scorers;
then the state of the checkpoint being resumed and the metrics log. A base class of `Trainer` (its methods read and
set the trainer's attributes), kept apart so the loop reads on its own."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from mechopd.config import TrainConfig, adopt_pins
from mechopd.core.checks import check_task_vocab, resolve_device
from mechopd.core.errors import ConfigError
from mechopd.core.model_checks import read_config
from mechopd.evaluation.pinning import train_render
from mechopd.generate.prefix import PrefixStore
from mechopd.generate.sampler import SamplingSettings
from mechopd.generate.settings import known_vocab
from mechopd.models import check_same_tokenizer, load_tokenizer
from mechopd.objectives.follow import check_follow_contexts
from mechopd.objectives.losses import config_terms, terms_need
from mechopd.objectives.schedule import AnchorGate, BetaSchedule
from mechopd.objectives.select import config_selector
from mechopd.tasks.base import get_task
from mechopd.train import dist, otherbatch, rundir, teachers
from mechopd.train.checkpoint import load_checkpoint
from mechopd.train.engine import resolve_student, resolve_teacher, rollout_engine
from mechopd.train.headstep import make_scorer
from mechopd.train.lr import lr_multiplier
from mechopd.train.reporting import Logger, config_block, config_line
from mechopd.train.sharding import make_sharding
from mechopd.train.step import StepOptions, enable_checkpointing


class TrainerSetup:
    """`Trainer._setup` and its parts: everything `Trainer.__init__` builds (see `mechopd.train.trainer`)."""

    # set by Trainer.__init__ before `_setup` runs (declared here for the type checker)
    run_dir: rundir.RunDir
    rank: int
    world: int
    verbose: bool
    _say: Callable[[str | None], None]

    def _setup(self, cfg: TrainConfig, resume: bool, progress: bool) -> None:
        cfg, path_note = rundir.record_paths(cfg, self.run_dir, resume)  # absolute; a resume reads the run's
        self.cfg, self.progress = cfg, progress
        self.task = get_task(cfg.task, **cfg.task_options)  # validate cheap inputs before touching --out
        adopt_pins(cfg, self.run_dir.config, resume)  # a resumed run keeps its pinned render
        resume, note = rundir.prepare(self.run_dir, cfg, resume, self.rank == 0)
        self._say(path_note)
        dist.barrier()
        self.device = resolve_device(cfg.device)  # a named device this machine lacks fails before any loading
        dtype = getattr(torch, cfg.dtype)
        student_path = resolve_student(
            cfg, self.device, progress=progress, main=self.rank == 0, barrier=dist.barrier
        )  # organism:<task> pretrained on demand (vLLM, CPU: hd32)
        self.tokenizer = load_tokenizer(student_path)
        check_task_vocab(self.tokenizer, self.task)  # as evaluation does: no training on <unk> soup
        rundir.check_items(self.task, cfg)  # pool_size / eval_n within the task's item space, before any model
        self.pool = self.task.examples("train", cfg.pool_size, cfg.seed)
        self.max_new = cfg.max_new_tokens or self.task.max_new_tokens
        self._prompt_cache: dict[tuple, list[int]] = {}  # (prompt, context or None) -> ids (`Trainer._render`)
        self.spec, pinned = train_render(
            self.tokenizer, self.task, self.pool, cfg, self.max_new, read_config(student_path), self._prompt_cache
        )  # pinned and length-checked before any load; the pool's prompts rendered once, here
        self._say("\n".join(t for t in (note, pinned) if t))
        teacher_path = resolve_teacher(cfg, student_path, main=self.rank == 0, barrier=dist.barrier)
        if cfg.teacher:
            check_same_tokenizer(self.tokenizer, load_tokenizer(teacher_path))
        self.resume_from = rundir.latest_checkpoint(self.run_dir.root) if resume else None
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.shard = make_sharding(cfg.sharding, self.device)
        self.models = teachers.build(cfg, student_path, teacher_path, self.resume_from, dtype, self.shard, self.device)
        self.student, self.teacher = self.models.student, self.models.teacher  # teacher_mode / LoRA: train.teachers
        self.vocab = known_vocab(self.tokenizer, self.student, self.teacher)  # ids past the tokenizer / a head: out
        self.T = cfg.temperature or self.task.temperature
        self._build_objective(cfg)
        named = [(n, p) for n, p in self.student.named_parameters() if p.requires_grad]
        self.param_names, self.params = [self.models.param_name(n) for n, _ in named], [p for _, p in named]
        self.trainable_share, line = self.models.share_line()
        self._say(line)
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_multiplier(s, cfg.steps, cfg.warmup, cfg.lr_schedule)
        )
        self.engine = rollout_engine(cfg, self.student, self.shard, student_path, self.device, self.world)
        self.sampling = SamplingSettings.for_model(  # the rollout's: only ids the teacher can score are drawn
            self.tokenizer,
            self.student,
            others=(self.teacher,),
            max_new_tokens=self.max_new,
            temperature=self.T,
            engine=self.engine or cfg.rollout_engine,
            shared_prefix=cfg.shared_prefix,
        )
        # the frozen teacher's context block, reused step after step (FSDP: every process must run the same forwards)
        self.teacher_store = PrefixStore() if cfg.sharding == "none" and self.models.frozen_teacher else None
        self._agree = dist.agree_prefix if dist.active() else None  # one process: prefix groups (generate/groups.py)
        self._build_scoring(cfg, dtype)
        self.max_len = getattr(self.student.config, "max_position_embeddings", None)
        self._restore_and_open_log(cfg)

    def _restore_and_open_log(self, cfg: TrainConfig) -> None:
        """Step, position, optimizer, scheduler and gate from the checkpoint being resumed; then the metrics log and
        the resolved config (rank 0)."""
        self.step, self.position = 0, 0
        if self.resume_from is not None:
            state = load_checkpoint(self.resume_from, None, self.sched)
            self.shard.load_optimizer_state(self.student, self.opt, self.resume_from)
            self.step, self.position = state["step"], state["position"]
            if self.gate is not None:
                self.gate.load(state.get("nca_gate"))
        self.fresh = self.resume_from is None
        if self.rank == 0 and self.fresh:
            rundir.clear_unfinished(self.run_dir)
        if self.rank == 0:
            self.run_dir.root.mkdir(parents=True, exist_ok=True)
            rundir.write_config(cfg, self.run_dir)
            self._say(rundir.read_metrics(self.run_dir.metrics)[1])  # the lines past the checkpoint stay until
        step, path = self.step, self.run_dir.metrics  # the first new line: a resume that stops before it loses none
        self.logger = Logger(
            path,
            self.rank == 0,
            cfg.log_tensorboard,
            cfg.log_wandb,
            cfg.to_dict(),
            fresh=self.fresh,
            project=cfg.wandb_project,
            before_first=(lambda: rundir.truncate_metrics(path, step)) if not self.fresh else None,
        )
        self._say(
            config_block(cfg, self.resume_from)
            if self.verbose
            else config_line(cfg, self.run_dir.config, self.resume_from)
        )

    def _build_objective(self, cfg: TrainConfig) -> None:
        """The method's loss terms (with the anchor schedule and its gate) and the token selector."""
        gate = AnchorGate(cfg.nca_gate, cfg.nca_gate_window) if cfg.nca_gate is not None else None
        # the method's terms, then the added ones (follow_weight > 0: the follow term, on its own rollout under c′)
        self.terms = config_terms(cfg, schedule=BetaSchedule(cfg.nca_start, cfg.beta_warmup, gate))
        self.other_terms = [t for t in self.terms if t.batch == "other"]  # scored on a rollout under c′ (otherbatch)
        self.gate = gate if any(t.schedule is not None for t in self.terms) else None  # OPD: nothing to gate
        self.needs = terms_need([t for t in self.terms if t.batch == "main"])
        if self.other_terms or cfg.follow_contexts:  # unknown names refused whatever the weight
            check_follow_contexts(self.task, self.pool, cfg.follow_contexts)
        self.selector = config_selector(cfg)

    def _build_scoring(self, cfg: TrainConfig, dtype: torch.dtype) -> None:
        """The step's forwards/backwards (`train.step`): micro-batches, logit chunks, checkpointing, autocast."""
        if cfg.gradient_checkpointing:
            enable_checkpointing(self.student)
        student_prefix = "off" if (cfg.sharding == "fsdp" or cfg.gradient_checkpointing) else None
        opts = StepOptions(
            temperature=self.T,
            vocab=self.vocab,
            budget=cfg.budget,
            seed=cfg.seed,
            micro_batch_size=cfg.micro_batch_size,
            logit_chunk=cfg.logit_chunk,
            shared_prefix=cfg.shared_prefix,
            student_shared_prefix=student_prefix,
            autocast=dtype if dtype in (torch.bfloat16, torch.float16) else None,
        )
        self.scoring = make_scorer(
            cfg,
            self.student,
            self.teacher,
            [t for t in self.terms if t.batch == "main"],
            self.selector,
            self.params,
            opts,
            self.teacher_store,
        )  # loss_head: train.headstep
        self._say(self.scoring.head_line)  # which head `loss_head` resolved to, and why
        self.other_scoring = otherbatch.scorer(self, opts)  # the follow term's batch under c′ (None without it)
        self.clock = self.scoring.clock  # seconds per stage (train.profile), shared by both scorers
        if cfg.logit_chunk is not None and not all(self.scoring.split.values()):
            raise ConfigError(
                f"logit_chunk={cfg.logit_chunk}: this model's LM head cannot run apart from its trunk "
                "(not a plain linear head over the base model); set logit_chunk=null"
            )
