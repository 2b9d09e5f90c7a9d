"""The one training loop: OPD, NCA, DualOPD, SymKL, TA-OPD and the selector baselines.

A method is a list of loss terms (`losses.config_terms`) plus a token selector (`select.config_selector`); nothing else
differs between methods. One step:
  1. the student samples one response per prompt on the NO-context view (KV cache, batched; games: one prompt per
     move, every (turn prompt, response) a sample);
  2. `views` builds the two-view batch (same response ids, prompts left-padded);
  3-5. `step.StepScorer` (micro-batches of ``micro_batch_size`` rows, chunks of ``logit_chunk`` positions, the same
     update as one shot): the teacher scores the context view (no grad); the selector picks the OPD term's tokens
     (global top ⌈ρN⌉ over the whole rollout batch, all processes) BEFORE any loss pass; the student scores the
     no-context view (grad) and, when a term needs it (NCA, DualOPD, SymKL), the context view (grad);
     `losses.total_loss` per chunk: Σ_terms w(step) · Σ(per-token loss · mask) / (global token count), backward per
     chunk, then through the trunk (on a ``grad_stats_every`` step: per-term gradients and their statistics,
     `gradstats`); gradients summed over processes; clip; the step guard (`guard`: finite losses, gradient norm and
     weights — a non-finite step is never applied nor saved); one AdamW step. A term registered with
     ``batch="other"`` (the follow term) gets its own rollout under another context and its own scorer pass, whose
     gradients add to the same ``.grad`` before the reduction (`otherbatch`).
Processes hold full replicas or FSDP shards (`sharding` says how each layout sums gradients, generates and saves);
checkpoints are atomic; ``resume`` continues from the latest one with the same weights, optimizer, RNG and data
position (a 2N-step run equals an N-step run resumed for N more).

The `Trainer` is composed, not inherited: `parts.build_parts` builds once what the loop reads (`TrainerParts`: task,
pool, models, objective, optimizer, engine, scorers); `saving.RunSaver` restores and writes the run's state on disk,
taking the step and data position per call; `evaluator.PeriodicEval` runs the periodic evaluation; the `Trainer`
holds these with the loop's own state (``step``, ``position``) and runs the loop.
"""

from __future__ import annotations

import contextlib
import operator
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mechopd.config import TrainConfig
from mechopd.core.errors import MechopdError, TrainingError
from mechopd.core.views import assemble_two_views, render_prompt_ids
from mechopd.evaluation.pinning import PROMPT_CACHE
from mechopd.generate.sampler import play_games, sample_rows, stable_seed
from mechopd.organisms.recipes import resolve_train_data
from mechopd.train import dist, gradstats, guard, rundir
from mechopd.train.engine import sync_engine
from mechopd.train.evaluator import PeriodicEval
from mechopd.train.parts import TrainerParts, build_parts, open_log
from mechopd.train.reporting import Logger, final_line
from mechopd.train.rollcopy import sampler
from mechopd.train.rundir import RunDir
from mechopd.train.saving import RunSaver
from mechopd.train.step import StepResult


class _Part:
    """A read-only attribute of the `Trainer` that is one of its parts: ``trainer.opt`` is ``trainer.parts.opt``."""

    def __init__(self, path: str = "") -> None:
        self.path = path  # dotted, under `parts` (``models.student``); default: the attribute's own name

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.get = operator.attrgetter(self.path or name)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else self.get(obj.parts)

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"Trainer.{self.name} is a part of the trainer (trainer.parts), read-only")


class Trainer:
    """One run: the parts built once (`parts`), the checkpoints in and out (`saver`), the periodic evaluation
    (`evaluator`), the metrics log (`logger`), and the loop's own state, ``step`` and ``position`` (the data position,
    in prompts). `run()` is the loop; `train_step()` one step. Build with `Trainer(cfg, out_dir, resume)`."""

    parts: TrainerParts
    saver: RunSaver
    evaluator: PeriodicEval
    logger: Logger
    step: int  # optimizer steps taken
    position: int  # prompts drawn from the training pool's epochs

    def __init__(
        self, cfg: TrainConfig, out_dir: str | Path, resume: bool = False, progress: bool = True, verbose: bool = False
    ):
        self.rank, self.world = dist.init()
        self.progress, self.verbose = progress, verbose
        self.run_dir = RunDir(Path(out_dir))
        self._lock = rundir.acquire(self.run_dir, self.rank == 0)  # one writer per run dir, until run() ends
        self._order_epoch: int | None = None  # the epoch whose shuffled order `_order` holds (`_epoch_order`)
        self._order: list[int] = []
        self._prefix_paths: dict[str, int] = {}  # the last step's shared-prefix counts (`StepResult.prefix`)
        self._last_term_norms: dict[str, float] | None = None  # the last step's per-term gradient norms, if measured
        rundir.releasing_on_error(self._lock, self._assemble, cfg, resume)

    def _assemble(self, cfg: TrainConfig, resume: bool) -> None:
        """Build the parts, then the components that take them; restore a resumed run's state; open the log."""
        p = self.parts = build_parts(cfg, self.run_dir, resume, self.progress, self.rank, self.world, self._say)
        self.saver = RunSaver(
            p.cfg, self.run_dir, self.rank, p.models, p.shard, p.tokenizer, p.params, p.opt, p.sched, p.objective.gate
        )
        self.evaluator = PeriodicEval(
            cfg=p.cfg,
            task=p.task,
            tokenizer=p.tokenizer,
            spec=p.spec,
            train_uids={ex.uid for ex in p.pool},
            student=p.models.student,
            shard=p.shard,
            engine=p.engine,
            rank=self.rank,
            progress=self.progress,
        )
        self.step, self.position = self.saver.restore(p.resume_from)
        self.logger = open_log(p.cfg, self.run_dir, self.rank == 0, self.step, p.resume_from, self.verbose, self._say)

    # The parts a caller reads, read-only (tests, benches, notebooks: `TrainerParts`); the loop reads `self.parts`.
    cfg = _Part()
    task = _Part()
    tokenizer = _Part()
    pool = _Part()
    device = _Part()
    models = _Part()
    student = _Part("models.student")
    teacher = _Part("models.teacher")
    params = _Part()
    opt = _Part()
    sched = _Part()
    vocab = _Part()
    sampling = _Part()
    engine = _Part()
    scoring = _Part()
    teacher_store = _Part()

    @property
    def last_eval(self) -> tuple[int, Any] | None:
        """(step, summary) of the last in-training evaluation."""
        return self.evaluator.last

    def evaluate(self) -> dict[str, Any]:
        """Periodic evaluation on rank 0 (every process must call it; the others wait and get {})."""
        return self.evaluator.evaluate(self.step)

    def save(self, path: Path) -> None:
        """A checkpoint of this step at `path` (every process takes part, rank 0 writes)."""
        self.saver.save(path, self.step, self.position)

    def save_final(self) -> Path:
        return self.saver.save_final(self.step)

    def _say(self, text: str | None) -> None:
        if text and self.rank == 0:
            print(text, flush=True)

    def _render(self, prompt: str, context: str | None) -> list[int]:
        cache, key = self.parts.prompt_cache, (prompt, context)
        if key not in cache:
            if len(cache) >= PROMPT_CACHE:  # games: every move's prompt is new; keep the cache bounded
                cache.clear()
            cache[key] = render_prompt_ids(self.parts.tokenizer, prompt, context, self.parts.spec)
        return cache[key]

    def _examples(self) -> list:
        """The global batch at the current data position (deterministic epochs over the training pool)."""
        pool, out = self.parts.pool, []
        for i in range(self.position, self.position + self.parts.cfg.batch_size):
            epoch, offset = divmod(i, len(pool))
            out.append(pool[self._epoch_order(epoch)[offset]])
        return out

    def _epoch_order(self, epoch: int) -> list[int]:
        if self._order_epoch != epoch:
            order = list(range(len(self.parts.pool)))
            random.Random(f"{self.parts.cfg.seed}|epoch{epoch}").shuffle(order)
            self._order_epoch, self._order = epoch, order
        return self._order

    def rollout(self, examples: list, rows: range) -> tuple[list[str], list[str], list[list[int]], dict]:
        """This process's samples: (prompts, contexts, response ids) and rollout stats as SUMS over its rows."""
        p = self.parts
        cfg, task, tokenizer = p.cfg, p.task, p.tokenizer
        model = sampler(p.models.student, p.rollout_copy)  # rollout_dtype: bfloat16 -> its copy (`train.rollcopy`)
        mine = [examples[i] for i in rows]
        seeds = [stable_seed(cfg.seed, self.step, i) % (2**31) for i in rows]
        if task.is_game:
            per_move = p.sampling.replace(shared_prefix="off") if dist.active() else p.sampling  # processes may
            eps, turns = play_games(  # differ in moves: no collective per move
                model, tokenizer, task, mine, self._render, per_move, with_context=False, seeds=seeds
            )
            prompts = [t.prompt for t in turns]
            contexts = [mine[t.game].context for t in turns]
            responses = [t.response for t in turns]
            return prompts, contexts, responses, {"train_win_rate": float(sum(e.won for e in eps))}
        ids = [self._render(ex.prompt, None) for ex in mine]
        responses = sample_rows(
            model, ids, seeds, p.sampling.replace(batch_size=max(1, len(ids))), agree=p.agree
        )  # row seeds (seed, step, global row); the global prefix
        decoded = (tokenizer.decode(r, skip_special_tokens=True) for r in responses)
        stats = {"train_acc_x": float(sum(task.score(ex, text) for ex, text in zip(mine, decoded)))}
        return [ex.prompt for ex in mine], [ex.context for ex in mine], responses, stats

    def _gate_accuracy(self) -> tuple[float, float]:
        """The accuracy gate's measure (`objectives.schedule.AccuracyGate`): greedy accuracy of the student without
        the context and of the teacher with it, on ``nca_gate_n`` training items spread evenly over the pool's fixed
        order (never a held-out item); the teacher's only while the gate has no reference yet."""
        p = self.parts
        gate = p.objective.gate
        n = min(p.cfg.nca_gate_n, len(p.pool))
        items = [p.pool[i * len(p.pool) // n] for i in range(n)]
        greedy = p.sampling.replace(greedy=True, batch_size=n)

        def accuracy(model: Any, with_context: bool) -> float:
            ids = [self._render(ex.prompt, ex.context if with_context else None) for ex in items]
            was_training = model.training
            model.eval()
            gather = p.shard.gathered(model) if model is p.models.student else contextlib.nullcontext()
            with gather, torch.no_grad():
                out = sample_rows(model, ids, None, greedy, agree=p.agree)
            model.train(was_training)
            texts = (p.tokenizer.decode(r, skip_special_tokens=True) for r in out)
            return sum(p.task.score(ex, text) for ex, text in zip(items, texts)) / n

        ref = getattr(gate, "reference", None)  # measured once: the frozen teacher
        return accuracy(p.models.student, False), ref if ref is not None else accuracy(p.models.teacher, True)

    def _score(self, batch: Any, other: Any, per_term: bool) -> StepResult:
        """The step's forwards and backwards (`train.step`): the main batch, then the c′ batch's, whose gradients
        add (`otherbatch`; `other` is None without a follow term)."""
        main = self.parts.scoring.step(batch, self.step, per_term=per_term)
        if other is None:
            return main
        assert self.parts.other is not None  # `other` is its rollout
        return self.parts.other.add(main, other, self.step, per_term)

    def train_step(self) -> dict[str, Any]:
        p = self.parts
        cfg, clock, terms = p.cfg, p.scoring.clock, p.objective.terms
        t0 = time.perf_counter()
        clock.reset()
        examples = self._examples()
        rows = dist.shard(len(examples), self.rank, self.world)
        gather = p.shard.gathered(p.models.student) if p.engine is None else contextlib.nullcontext()
        with gather, torch.profiler.record_function("mechopd.rollout"):  # FSDP: one all-gather per rollout, not
            prompts, contexts, responses, roll_stats = self.rollout(examples, rows)  # per decode step
            other = p.other.rollout(examples, rows, self.step, self._render) if p.other else None  # c′ (follow)
        t_roll = time.perf_counter() - t0
        clock.add("rollout", t_roll)
        batch = assemble_two_views(
            [self._render(q, None) for q in prompts],
            [self._render(q, c) for q, c in zip(prompts, contexts)],
            responses,
            p.tokenizer.pad_token_id,
            max_length=p.max_len,
        ).to(p.device)
        mask = batch.response_mask
        p.opt.zero_grad(set_to_none=True)
        stats_step = bool(cfg.grad_stats_every) and (self.step + 1) % cfg.grad_stats_every == 0
        res = self._score(batch, other, stats_step)
        self._prefix_paths = res.prefix
        logs: dict[str, Any] = {k: float(dist.all_sum(v)) for k, v in res.logs.items()}  # shares -> global means
        guard.check_losses({t.name: logs[f"loss/{t.name}"] for t in terms}, self.step + 1)
        logs.update(("beta_eff", res.weights[t.name]) for t in terms if t.schedule is not None)  # the last one
        self._last_term_norms = None
        if stats_step:  # one autograd.grad per term (train/gradstats.py); their sum is the step's gradient
            grads = res.term_grads
            assert grads is not None  # a per-term step returns them (`StepResult.term_grads`)
            gradstats.set_summed_grads(p.params, grads)
            stats = gradstats.grad_stats(grads, p.param_names)
            self._last_term_norms = {t: float(stats[f"grad/norm/{t}"] or 0.0) for t in grads}  # a norm: never None
            logs.update(stats)
        with clock("optimizer"):
            gnorm = self._apply_step(lambda: self._score(batch, other, True).term_grads)
        gate = p.objective.gate
        logs.update(gate.update(self.step, logs, self._gate_accuracy) if gate else {})
        n_tok = float(dist.all_sum(mask.sum().float()))
        dt = time.perf_counter() - t0
        self.step += 1
        self.position += cfg.batch_size
        n_samples = float(dist.all_sum(torch.tensor(float(len(prompts)))))
        return self._step_record(res, logs, gnorm, n_tok, n_samples, dt, t_roll, roll_stats)

    def _step_record(
        self,
        res: Any,
        logs: dict[str, Any],
        gnorm: float,
        n_tok: float,
        n_samples: float,
        dt: float,
        t_roll: float,
        roll_stats: dict[str, float],
    ) -> dict[str, Any]:
        """The step's metrics record (global sums and means over every process: the collectives run here, in order)."""
        p = self.parts
        return {
            "step": self.step,
            "loss": float(dist.all_sum(torch.as_tensor(res.loss))),
            **logs,
            "kept_fraction": res.kept,
            "grad_norm": gnorm,
            "lr": p.sched.get_last_lr()[0],
            "response_len": n_tok / max(1.0, n_samples),
            "samples": int(n_samples),
            "response_tokens": int(n_tok),
            "tokens_per_s": n_tok / dt,
            "trainable_share": p.trainable_share,
            **p.scoring.clock.logs(n_tok),
            "step_s": dt,
            "rollout_s": t_roll,
            "shared_prefix": self._prefix_paths.get("teacher", 0),  # context tokens computed once (0: unshared)
            "prefix/shared_rows": int(  # teacher rows whose context ran shared
                dist.all_sum(torch.tensor(float(self._prefix_paths.get("teacher:rows", 0))))
            ),
            **{
                k: float(dist.all_sum(torch.tensor(v, dtype=torch.float64))) / p.cfg.batch_size
                for k, v in roll_stats.items()
            },
        }  # means over the global batch (prompts or games)

    def _apply_step(self, term_grads: Any) -> float:
        """Reduce, clip, guard, step. A non-finite gradient norm stops the run BEFORE the optimizer step; the terms'
        own gradient norms then name the culprit (from this step's stats, or by scoring the batch again: replicas;
        `term_grads()` re-scores it per term)."""
        p = self.parts
        terms = p.objective.terms
        p.shard.reduce_grads(p.params)
        gnorm = p.shard.clip_grads(p.params, p.cfg.grad_clip)
        diagnose: Callable[[], dict[str, float]] | None
        last = self._last_term_norms
        if last is not None:
            diagnose = lambda: last  # noqa: E731
        elif len(terms) == 1:
            diagnose = lambda: {terms[0].name: gnorm}  # noqa: E731
        elif p.cfg.sharding == "none":
            diagnose = lambda: gradstats.norms(term_grads())  # noqa: E731
        else:
            diagnose = None
        guard.check_grad_norm(gnorm, self.step + 1, diagnose)
        p.opt.step()
        p.models.after_step()  # teacher_mode: ema follows the student
        p.sched.step()
        guard.check_weights(p.params, self.step + 1)
        sync_engine(p.engine, p.models.student, p.shard)  # vLLM samples the next rollout from these weights
        if p.rollout_copy is not None:
            p.rollout_copy.refresh()  # so does the bf16 copy (rollout_dtype: bfloat16)
        return gnorm

    def run(self) -> Path:
        try:
            return self._run()
        except MechopdError as e:
            if not isinstance(e, TrainingError):
                self._forget_refused_run()
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Close the metrics log and release the run directory's lock (`run` does both when it ends; a caller that
        drives `train_step` itself calls this, or uses the trainer as a context manager)."""
        self.logger.close()
        rundir.release(self._lock)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _forget_refused_run(self) -> None:
        """A new run refused for bad input before its first checkpoint leaves no file behind."""
        fresh = self.parts.resume_from is None
        if self.rank == 0 and fresh and rundir.latest_checkpoint(self.run_dir.root) is None:
            for name in rundir.RUN_FILES:
                with contextlib.suppress(OSError):
                    rundir.remove_own(self.run_dir.root / name)
            if self.run_dir.root.is_dir() and not any(self.run_dir.root.iterdir()):
                self.run_dir.root.rmdir()

    def _run(self) -> Path:
        cfg, gate = self.parts.cfg, self.parts.objective.gate
        if self.step == 0 and cfg.eval_every:
            self.logger.log({"step": 0, **self.evaluate()})
        bar = tqdm(
            total=cfg.steps,
            initial=self.step,
            desc=f"train {cfg.method}/{cfg.selector}",
            disable=not self.progress or self.rank != 0,
        )
        while self.step < cfg.steps:
            rec = self.train_step()
            if cfg.eval_every and self.step % cfg.eval_every == 0:
                rec.update(self.evaluate())
            self.logger.log(rec)
            bar.update(1)
            bar.set_postfix(loss=f"{rec['loss']:.4f}", kl=f"{rec['kl/teacher_student']:.4f}")
            if cfg.save_every and self.step % cfg.save_every == 0 and (cfg.keep_checkpoints or self.step < cfg.steps):
                self.save(self.run_dir.checkpoints / f"step-{self.step}")
        bar.close()
        if gate is not None and gate.open_step is None:
            self._say(
                f"warning: the anchor gate never opened ({gate.never_opened()}): the anchor's weight was 0 at every "
                f"step, so this {cfg.method} run trained as OPD; loosen the gate or train longer"
            )
        self.logger.settle()  # a resume with no step left: its metrics end at the checkpoint too
        final = self.save_final()
        self._say(final_line(self.step, cfg.steps, self.last_eval, self.run_dir.root))
        return final


def train(
    config: TrainConfig | dict, out_dir: str | Path, resume: bool = False, progress: bool = True, verbose: bool = False
) -> Path:
    """Train one run into `out_dir` (see the module docstring); returns the final checkpoint directory. Prints the
    config as one line (``verbose``: the full resolved YAML), each periodic evaluation and the last one at the end
    (`mechopd.train.reporting`)."""
    cfg = config if isinstance(config, TrainConfig) else TrainConfig(**resolve_train_data(config))
    return Trainer(cfg, out_dir, resume=resume, progress=progress, verbose=verbose).run()
