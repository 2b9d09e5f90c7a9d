"""The `Trainer`'s periodic evaluation and its saving (`mechopd.train.trainer`): checkpoints with the optimizer, RNG,
data position and anchor gate; the final model with its training.json. Every process takes part, rank 0 writes. A
base class of `Trainer` (its methods read the trainer's attributes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mechopd.core.errors import TrainingError
from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
from mechopd.train import dist, guard, rundir
from mechopd.train.checkpoint import save_checkpoint
from mechopd.train.reporting import eval_line


class TrainerSaving:
    """`Trainer.evaluate`, `Trainer.save` and `Trainer.save_final` (see `mechopd.train.trainer`)."""

    # the Trainer's state these methods read (built by `TrainerSetup._setup`; declared here for the type checker)
    cfg: Any
    run_dir: rundir.RunDir
    rank: int
    step: int
    student: Any
    tokenizer: Any
    shard: Any
    params: list
    models: Any
    task: Any
    spec: Any
    sched: Any
    progress: bool
    position: Any
    pool: Any
    opt: Any
    gate: Any
    engine: Any
    last_eval: tuple[int, Any] | None  # (step, scores) of the last in-training evaluation

    def evaluate(self) -> dict[str, Any]:
        """Periodic evaluation on rank 0 (every process must call it; the others wait and get {})."""
        with self.shard.gathered(self.student):
            rec = self._evaluate() if self.rank == 0 else {}
            dist.barrier()
        return rec

    def _evaluate(self) -> dict[str, Any]:
        cfg = self.cfg
        ecfg = EvalConfig(
            n=cfg.eval_n, seed=cfg.seed, n_boot=200, engine=cfg.rollout_engine, shared_prefix=cfg.shared_prefix
        )
        rep = evaluate_model(
            self.student,
            self.tokenizer,
            self.task,
            ecfg,
            self.spec,
            train_uids={ex.uid for ex in self.pool},
            engine=self.engine,
        )
        s = rep["summary"]
        self.last_eval = (self.step, s)
        if self.progress:
            tqdm.write(eval_line(self.step, cfg.steps, s))  # above the progress bar (rank 0 only evaluates)
        else:
            print(eval_line(self.step, cfg.steps, s), flush=True)
        return {f"eval/{k}": s[k]["value"] for k in ("acc_x", "acc_xc", "harm", "help", "both_correct", "delta_len")}

    def _gate_state(self) -> dict[str, Any]:
        """What a checkpoint and training.json record of the anchor gate (nothing without one)."""
        return {"nca_gate": self.gate.state()} if self.gate is not None else {}

    def save(self, path: Path) -> None:
        guard.check_weights(self.params, self.step, "before saving")
        model = self.models.savable(self.shard.full_model(self.student), checkpoint=True)  # every process
        optim = self.shard.optimizer_state(self.student, self.opt)  # takes part, rank 0 writes
        if self.rank == 0:
            save_checkpoint(
                path,
                model,
                self.tokenizer,
                optim,
                self.sched,
                {"step": self.step, "position": self.position, "config": self.cfg.to_dict(), **self._gate_state()},
            )
        dist.barrier()

    def save_final(self) -> Path:
        from mechopd.models import atomic_save

        guard.check_weights(self.params, self.step, "before saving the final model")
        model = self.models.savable(self.shard.full_model(self.student), checkpoint=False)  # LoRA: merged + adapter
        if self.rank == 0:
            info = {"step": self.step, "config": self.cfg.to_dict(), **self._gate_state()}
            extra = {"training.json": json.dumps(info, indent=1)}
            try:
                atomic_save(
                    model,
                    self.tokenizer,
                    self.run_dir.final,
                    extra=extra,
                    writer=rundir.keep_foreign(self.run_dir.final),
                )
            except OSError as e:
                raise TrainingError(
                    f"writing {self.run_dir.final} failed: {e.strerror or e}; the checkpoints are "
                    "kept — free disk space, then --resume"
                ) from None
        dist.barrier()
        return self.run_dir.final
