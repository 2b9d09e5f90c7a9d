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
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mechopd.config import TrainConfig, resolve_train_data
from mechopd.core.errors import MechopdError, TrainingError
from mechopd.core.views import assemble_two_views, render_prompt_ids
from mechopd.evaluation.pinning import PROMPT_CACHE
from mechopd.generate.sampler import play_games, sample_rows, stable_seed
from mechopd.train import dist, gradstats, guard, otherbatch, rundir
from mechopd.train.engine import sync_engine
from mechopd.train.reporting import final_line
from mechopd.train.rundir import RunDir
from mechopd.train.trainer_saving import TrainerSaving
from mechopd.train.trainer_setup import TrainerSetup


class Trainer(TrainerSetup, TrainerSaving):
    """Holds the models and state of one run; `run()` is the loop. Build with `Trainer(cfg, out_dir, resume)`."""

    def __init__(
        self, cfg: TrainConfig, out_dir: str | Path, resume: bool = False, progress: bool = True, verbose: bool = False
    ):
        self.rank, self.world = dist.init()
        self.verbose = verbose
        self.last_eval = None
        self.run_dir = RunDir(Path(out_dir))
        self._lock = rundir.acquire(self.run_dir, self.rank == 0)  # one writer per run dir, until run() ends
        rundir.releasing_on_error(self._lock, self._setup, cfg, resume, progress)

    def _say(self, text: str | None) -> None:
        if text and self.rank == 0:
            print(text, flush=True)

    def _render(self, prompt: str, context: str | None) -> list[int]:
        key = (prompt, context)
        if key not in self._prompt_cache:
            if len(self._prompt_cache) >= PROMPT_CACHE:  # games: every move's prompt is new; keep the cache bounded
                self._prompt_cache.clear()
            self._prompt_cache[key] = render_prompt_ids(self.tokenizer, prompt, context, self.spec)
        return self._prompt_cache[key]

    def _examples(self) -> list:
        """The global batch at the current data position (deterministic epochs over the training pool)."""
        out = []
        for i in range(self.position, self.position + self.cfg.batch_size):
            epoch, offset = divmod(i, len(self.pool))
            out.append(self.pool[self._epoch_order(epoch)[offset]])
        return out

    def _epoch_order(self, epoch: int) -> list[int]:
        if getattr(self, "_order_epoch", None) != epoch:
            order = list(range(len(self.pool)))
            random.Random(f"{self.cfg.seed}|epoch{epoch}").shuffle(order)
            self._order_epoch, self._order = epoch, order
        return self._order

    def rollout(self, examples: list, rows: range) -> tuple[list[str], list[str], list[list[int]], dict]:
        """This process's samples: (prompts, contexts, response ids) and rollout stats as SUMS over its rows."""
        cfg, model = self.cfg, self.student
        mine = [examples[i] for i in rows]
        seeds = [stable_seed(cfg.seed, self.step, i) % (2**31) for i in rows]
        if self.task.is_game:
            per_move = self.sampling.replace(shared_prefix="off") if dist.active() else self.sampling  # processes
            eps, turns = play_games(
                model,
                self.tokenizer,
                self.task,
                mine,
                self._render,
                per_move,  # may differ in
                with_context=False,
                seeds=seeds,
            )  # moves: no collective per move

            prompts = [t.prompt for t in turns]
            contexts = [mine[t.game].context for t in turns]
            responses = [t.response for t in turns]
            return prompts, contexts, responses, {"train_win_rate": float(sum(e.won for e in eps))}
        ids = [self._render(ex.prompt, None) for ex in mine]
        responses = sample_rows(
            model, ids, seeds, self.sampling.replace(batch_size=max(1, len(ids))), agree=self._agree
        )  # row seeds (seed, step, global row); the global prefix
        stats = {
            "train_acc_x": float(
                sum(
                    self.task.score(ex, self.tokenizer.decode(r, skip_special_tokens=True))
                    for ex, r in zip(mine, responses)
                )
            )
        }
        return [ex.prompt for ex in mine], [ex.context for ex in mine], responses, stats

    def train_step(self) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.perf_counter()
        self.clock.reset()
        examples = self._examples()
        rows = dist.shard(len(examples), self.rank, self.world)
        gather = self.shard.gathered(self.student) if self.engine is None else contextlib.nullcontext()
        with gather, torch.profiler.record_function("mechopd.rollout"):  # FSDP: one all-gather per rollout, not
            prompts, contexts, responses, roll_stats = self.rollout(examples, rows)  # per decode step
            other = otherbatch.rollout(self, examples, rows) if self.other_terms else None  # under c′ (follow)
        t_roll = time.perf_counter() - t0
        self.clock.add("rollout", t_roll)
        batch = assemble_two_views(
            [self._render(p, None) for p in prompts],
            [self._render(p, c) for p, c in zip(prompts, contexts)],
            responses,
            self.tokenizer.pad_token_id,
            max_length=self.max_len,
        ).to(self.device)
        mask = batch.response_mask
        self.opt.zero_grad(set_to_none=True)
        stats_step = bool(cfg.grad_stats_every) and (self.step + 1) % cfg.grad_stats_every == 0
        res = otherbatch.step(self, batch, other, stats_step)  # forwards + backwards (train/step.py; + the c′ batch)
        self._prefix_paths = res.prefix
        logs: dict[str, Any] = {k: float(dist.all_sum(v)) for k, v in res.logs.items()}  # shares -> global means
        guard.check_losses({t.name: logs[f"loss/{t.name}"] for t in self.terms}, self.step + 1)
        logs.update(("beta_eff", res.weights[t.name]) for t in self.terms if t.schedule is not None)  # the last one
        self._last_term_norms: dict[str, float] | None = None
        if stats_step:  # one autograd.grad per term (train/gradstats.py); their sum is the step's gradient
            grads = res.term_grads
            assert grads is not None  # a per-term step returns them (`StepResult.term_grads`)
            gradstats.set_summed_grads(self.params, grads)
            stats = gradstats.grad_stats(grads, self.param_names)
            self._last_term_norms = {t: float(stats[f"grad/norm/{t}"] or 0.0) for t in grads}  # a norm: never None
            logs.update(stats)
        with self.clock("optimizer"):
            gnorm = self._apply_step(lambda: otherbatch.step(self, batch, other, True).term_grads)
        logs.update(self.gate.observe(self.step, logs["kl/teacher_student"]) if self.gate else {})
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
        cfg = self.cfg
        return {
            "step": self.step,
            "loss": float(dist.all_sum(torch.as_tensor(res.loss))),
            **logs,
            "kept_fraction": res.kept,
            "grad_norm": gnorm,
            "lr": self.sched.get_last_lr()[0],
            "response_len": n_tok / max(1.0, n_samples),
            "samples": int(n_samples),
            "response_tokens": int(n_tok),
            "tokens_per_s": n_tok / dt,
            "trainable_share": self.trainable_share,
            **self.clock.logs(n_tok),
            "step_s": dt,
            "rollout_s": t_roll,
            "shared_prefix": self._prefix_paths.get("teacher", 0),  # context tokens computed once (0: unshared)
            "prefix/shared_rows": int(
                dist.all_sum(
                    torch.tensor(  # teacher rows whose context ran shared
                        float(self._prefix_paths.get("teacher:rows", 0))
                    )
                )
            ),
            **{
                k: float(dist.all_sum(torch.tensor(v, dtype=torch.float64))) / cfg.batch_size
                for k, v in roll_stats.items()
            },
        }  # means over the global batch (prompts or games)

    def _apply_step(self, term_grads: Any) -> float:
        """Reduce, clip, guard, step. A non-finite gradient norm stops the run BEFORE the optimizer step; the terms'
        own gradient norms then name the culprit (from this step's stats, or by scoring the batch again: replicas;
        `term_grads()` re-scores it per term)."""
        self.shard.reduce_grads(self.params)
        gnorm = self.shard.clip_grads(self.params, self.cfg.grad_clip)
        diagnose: Callable[[], dict[str, float]] | None
        last = self._last_term_norms
        if last is not None:
            diagnose = lambda: last  # noqa: E731
        elif len(self.terms) == 1:
            diagnose = lambda: {self.terms[0].name: gnorm}  # noqa: E731
        elif self.cfg.sharding == "none":
            diagnose = lambda: gradstats.norms(term_grads())  # noqa: E731
        else:
            diagnose = None
        guard.check_grad_norm(gnorm, self.step + 1, diagnose)
        self.opt.step()
        self.models.after_step()  # teacher_mode: ema follows the student
        self.sched.step()
        guard.check_weights(self.params, self.step + 1)
        sync_engine(self.engine, self.student, self.shard)  # vLLM samples the next rollout from these weights
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
        if self.rank == 0 and self.fresh and rundir.latest_checkpoint(self.run_dir.root) is None:
            for name in rundir.RUN_FILES:
                with contextlib.suppress(OSError):
                    rundir.remove_own(self.run_dir.root / name)
            if self.run_dir.root.is_dir() and not any(self.run_dir.root.iterdir()):
                self.run_dir.root.rmdir()

    def _run(self) -> Path:
        cfg = self.cfg
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
            if cfg.save_every and self.step % cfg.save_every == 0:
                self.save(self.run_dir.checkpoints / f"step-{self.step}")
        bar.close()
        if self.gate is not None and self.gate.open_step is None:
            self._say(
                f"warning: the anchor gate never opened (mean KL(q_x‖f) over {self.gate.window} steps stayed "
                f"above nca_gate={self.gate.level:g}): the anchor's weight was 0 at every step, so this {cfg.method} "
                "run trained as OPD; raise nca_gate or train longer"
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
