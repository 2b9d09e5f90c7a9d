"""What a study will cost, said before its first job (`check_budget`), and how long it has left (`StudyClock`).

Disk: per run still to train, its final model (the student's parameters in the run's ``dtype``; a LoRA run adds its
adapter) and the checkpoints it keeps (`TrainConfig.keep_checkpoints`: older ones pruned to the model, the latest with
AdamW's two float32 moments of every trainable parameter); while a run trains, one checkpoint with its optimizer state
at a time per worker (a run whose checkpoints go after ``final/`` holds it only until then). Evaluation and probe files
are not counted (small next to a model: measured in docs/outputs.md). A study whose estimate exceeds the free space of
its output's disk is refused with both numbers, before any job.

Memory: per training job, the student, its frozen teacher (self-distillation: a second copy), the gradients and
AdamW's moments of the trainable parameters; activations come on top (they grow with ``batch_size`` and the sequence
length). Times ``workers`` jobs at once. A lower bound, said as one.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechopd.core.errors import ConfigError
from mechopd.pipeline.pool import finished

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ADAM_BYTES = 8  # exp_avg + exp_avg_sq, float32, per trainable parameter
GB = 1e9


def parameter_count(model_dir: str | Path) -> int | None:
    """The number of parameters in a checkpoint directory's safetensors files (headers only); None when the model is
    not a local directory (a hub id: unknown before it is downloaded)."""
    from safetensors import safe_open

    root = Path(model_dir)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    if not files:
        return None
    total = 0
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                n = 1
                for d in st.get_slice(key).get_shape():
                    n *= int(d)
                total += n
    return total


def _trainable(cfg: Any, params: int) -> int:
    """Trainable parameters of a run: all of them, or a LoRA adapter's (rank x (in + out) per targeted matrix; taken
    as 1 % of the model, an upper bound for ranks up to 16 on the usual targets)."""
    return max(1, params // 100) if getattr(cfg, "uses_lora", False) else params


def run_disk(cfg: Any, params: int) -> tuple[int, int]:
    """(bytes left on disk once the run is done, extra bytes while it trains) of one trained run."""
    model = params * DTYPE_BYTES.get(cfg.dtype, 4)
    optim = _trainable(cfg, params) * ADAM_BYTES
    final = model + (_trainable(cfg, params) * 4 if getattr(cfg, "uses_lora", False) else 0)
    saves = cfg.steps // cfg.save_every if cfg.save_every else 0
    if cfg.save_every and not cfg.keep_checkpoints and cfg.steps % cfg.save_every == 0:
        saves -= 1  # no checkpoint at the last step: final/ follows it at once
    if not saves:
        return final, 0
    if cfg.keep_checkpoints:
        return final + saves * model + optim, model  # the next checkpoint is written before the older one is pruned
    return final, model + optim


@dataclass
class Estimate:
    """A study's disk and memory estimate (`estimate`)."""

    disk: int = 0  # bytes left on disk by the runs still to train
    peak: int = 0  # extra bytes while they train (checkpoints on the way)
    memory: int = 0  # bytes per training job, activations not counted
    runs: int = 0
    unknown: list[str] = field(default_factory=list)  # models whose size is not known before the study fetches them

    def need(self) -> int:
        return self.disk + self.peak

    def line(self, workers: int) -> str:
        if not self.runs:
            return "disk: every run is trained already; nothing to train"
        if self.unknown:
            return f"disk: not estimated ({', '.join(self.unknown)} is not a local directory: its size is unknown)"
        return (
            f"estimate: {self.runs} run(s) to train write {self.disk / GB:.2f} GB (models and kept checkpoints; "
            f"{self.peak / GB:.2f} GB more while training); memory: at least {self.memory / GB:.1f} GB per training "
            f"job (weights, teacher, gradients, AdamW; activations on top) x {workers} worker(s)"
        )


def estimate(seed_cfgs: list[Any], student: str, workers: int) -> Estimate:
    """The disk and memory the trainings still to run will take (module docstring)."""
    params = parameter_count(student)
    est = Estimate()
    peaks = []
    for sr in seed_cfgs:
        for role in sr.methods():
            if finished(Path(sr.out) / "train" / role):
                continue
            est.runs += 1
            if params is None:
                continue
            cfg = sr.spec.train_config(role, sr.seed, student)
            left, during = run_disk(cfg, params)
            est.disk += left
            peaks.append(during)
            dtype = DTYPE_BYTES.get(cfg.dtype, 4)
            trainable = _trainable(cfg, params)
            est.memory = max(est.memory, 2 * params * dtype + trainable * (dtype + ADAM_BYTES))
    if params is None and est.runs:
        est.unknown.append(student)
    est.peak = sum(sorted(peaks, reverse=True)[: max(1, workers)])
    return est


def free_bytes(out: Path) -> int:
    """Free bytes on the disk that holds ``out`` (its nearest existing folder)."""
    p = Path(out).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def check_budget(seed_cfgs: list[Any], student: str, out: Path, workers: int, log: Any) -> Estimate:
    """Say the study's estimate; refuse it (one `ConfigError` with the numbers) when the disk cannot hold it."""
    est = estimate(seed_cfgs, student, workers)
    log(est.line(workers))
    free = free_bytes(out)
    if est.runs and not est.unknown and est.need() > free:
        raise ConfigError(
            f"{out.resolve()}: the study needs about {est.need() / GB:.2f} GB ({est.disk / GB:.2f} GB of models and "
            f"kept checkpoints, {est.peak / GB:.2f} GB more while training) and that disk has {free / GB:.2f} GB free; "
            "free space, choose --out on a larger disk, or train fewer runs (save_every / keep_checkpoints: false "
            "keep fewer checkpoints); nothing was trained"
        )
    return est


_DONE = re.compile(r": (\S+) done \((\d+) s\)$")


@dataclass
class StudyClock:
    """The study's log with an ETA: each job's end (the pool's ``<out>: <job> done (N s)`` line) gets the jobs left and
    the time they should take, from the mean measured cost of the jobs of that kind (training, finishing) so far."""

    log: Any
    trainings: int
    finishes: int
    workers: int = 1
    spent: dict[str, list[float]] = field(default_factory=lambda: {"train": [], "finish": []})

    def __call__(self, msg: str) -> None:
        m = _DONE.search(msg)
        if m is None:
            self.log(msg)
            return
        kind = "finish" if m.group(1) == "finish" else "train"
        self.spent[kind].append(float(m.group(2)))
        self.log(f"{msg}; {self.eta()}")

    def eta(self) -> str:
        left = {"train": self.trainings - len(self.spent["train"]), "finish": self.finishes - len(self.spent["finish"])}
        if sum(left.values()) <= 0:
            return "every job done"
        known = {k: sum(v) / len(v) for k, v in self.spent.items() if v}
        secs = sum(n * known[k] for k, n in left.items() if n > 0 and k in known) / max(1, self.workers)
        unmeasured = [f"{n} {_KIND[k]} job(s), not measured yet" for k, n in left.items() if n > 0 and k not in known]
        text = f"left: {', '.join(f'{n} {_KIND[k]}' for k, n in left.items() if n > 0)} job(s)"
        if secs <= 0:
            return f"{text}; an ETA once one of each kind is done"
        return f"{text}; ETA about {_clock(secs)}" + (f" + {'; '.join(unmeasured)}" if unmeasured else "")


_KIND = {"train": "training", "finish": "evaluation/probes/report"}


def _clock(secs: float) -> str:
    secs = int(round(secs))
    return f"{secs // 3600} h {secs % 3600 // 60:02d} min" if secs >= 3600 else f"{secs // 60} min {secs % 60:02d} s"
