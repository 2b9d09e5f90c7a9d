"""A run's state on disk, in and out: `RunSaver` restores the checkpoint being resumed (optimizer, scheduler, RNG,
step, data position, anchor gate) and writes checkpoints (the same state, atomically) and the final model with its
training.json. Every process takes part, rank 0 writes. It holds what it saves; the step and the data position are
the caller's, passed to each call (`mechopd.train.trainer`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mechopd.config import TrainConfig
from mechopd.core.errors import TrainingError
from mechopd.models import atomic_save
from mechopd.objectives.schedule import Gate
from mechopd.train import dist, guard, rundir, teachers
from mechopd.train.checkpoint import load_checkpoint, prune_older, save_checkpoint


@dataclass(frozen=True)
class RunSaver:
    """Checkpoints and the final model of one run (see the module docstring)."""

    cfg: TrainConfig
    run_dir: rundir.RunDir
    rank: int
    models: teachers.Models  # the student (and an EMA teacher's average, LoRA's adapter) as they are saved
    shard: Any  # gathers a sharded model and optimizer state
    tokenizer: Any
    params: list[torch.nn.Parameter]  # checked finite before anything is written
    opt: torch.optim.Optimizer
    sched: Any
    gate: Gate | None

    def restore(self, checkpoint: Path | None) -> tuple[int, int]:
        """(step, data position) of `checkpoint` with its optimizer, scheduler, RNG and gate states loaded;
        (0, 0) for a fresh run (None). The weights were loaded with the models."""
        if checkpoint is None:
            return 0, 0
        state = load_checkpoint(checkpoint, None, self.sched)
        self.shard.load_optimizer_state(self.models.student, self.opt, checkpoint)
        if self.gate is not None:
            self.gate.load(state.get("nca_gate"))
        return state["step"], state["position"]

    def gate_state(self) -> dict[str, Any]:
        """What a checkpoint and training.json record of the anchor gate (nothing without one)."""
        return {"nca_gate": self.gate.state()} if self.gate is not None else {}

    def save(self, path: Path, step: int, position: int) -> None:
        """A checkpoint at `path`: the weights, optimizer, scheduler, RNG, `step`, data `position` and gate."""
        student = self.models.student
        guard.check_weights(self.params, step, "before saving")
        model = self.models.savable(self.shard.full_model(student), checkpoint=True)  # every process
        optim = self.shard.optimizer_state(student, self.opt)  # takes part, rank 0 writes
        if self.rank == 0:
            save_checkpoint(
                path,
                model,
                self.tokenizer,
                optim,
                self.sched,
                {"step": step, "position": position, "config": self.cfg.to_dict(), **self.gate_state()},
            )
            prune_older(path)  # only the latest checkpoint keeps the optimizer state (a resume reads no other)
        dist.barrier()

    def save_final(self, step: int) -> Path:
        """The final model (LoRA: merged, with its adapter) and training.json, in ``final/``; returns that path."""
        guard.check_weights(self.params, step, "before saving the final model")
        model = self.models.savable(self.shard.full_model(self.models.student), checkpoint=False)
        final = self.run_dir.final
        if self.rank == 0:
            info = {"step": step, "config": self.cfg.to_dict(), **self.gate_state()}
            extra = {"training.json": json.dumps(info, indent=1)}
            try:
                atomic_save(model, self.tokenizer, final, extra=extra, writer=rundir.keep_foreign(final))
            except OSError as e:
                raise TrainingError(
                    f"writing {final} failed: {e.strerror or e}; the checkpoints are kept — free disk space, "
                    "then --resume"
                ) from None
            if not self.cfg.keep_checkpoints:  # they served a resume only; the final model is complete
                rundir.remove_own(self.run_dir.checkpoints)
        dist.barrier()
        return final
