"""The trainer's side of ``rollout_engine: vllm``: build one colocated engine per process and sync the student into it
after every optimizer step (in place, no checkpoint round trip; FSDP: one gather of the full parameters)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mechopd.config import TrainConfig
from mechopd.generate.vllm_engine import VllmEngine
from mechopd.models.spec import organism_task, resolve_spec


def rollout_engine(
    cfg: TrainConfig, student: Any, shard: Any, path: str | Path, device: torch.device, world: int
) -> Any:
    """None unless ``rollout_engine: vllm``; else a vLLM engine over `path` (the student's own directory, never a
    checkpoint dir: vLLM would read its optimizer files), synced with `student` now (a resumed run's weights). The
    trainer puts it in its `SamplingSettings` (``engine=``): rollouts and the periodic evaluation sample with it."""
    if cfg.rollout_engine != "vllm":
        return None

    engine = VllmEngine(path, dtype=cfg.dtype, seed=cfg.seed, device=device.type, world=world, **cfg.vllm_options)
    sync_engine(engine, student, shard)
    return engine


def sync_engine(engine: Any, student: Any, shard: Any) -> None:
    """The student's weights into the rollout engine, in place (no-op without an engine)."""
    if engine is not None:
        with shard.gathered(student):
            engine.load_weights(student)


def engine_organism(
    cfg: TrainConfig, device: torch.device, *, progress: bool, main: bool, barrier: Callable[[], None]
) -> str | None:
    """``organism:<task>`` with ``rollout_engine: vllm`` on a CPU: the organism's head_dim-32 variant
    (``<organism_dir>/<task>-hd32``: 3 query heads of 32, 1 key/value head, the same hidden size; pretrained on demand,
    cached), since vLLM's CPU attention refuses the default organisms' head_dim 24 (`vllm_engine.CPU_HEAD_SIZES`).
    None otherwise (the student spec resolves as usual)."""
    from mechopd.organisms.pretrain import default_config, pretrain

    task = organism_task(cfg.student)
    if cfg.rollout_engine != "vllm" or device.type != "cpu" or task is None:
        return None
    base = default_config(task, seed=0)
    if base.hidden_size % 32:
        return None  # no head_dim-32 split of this width: vllm_engine.check_shape refuses it with the fix
    path = Path(cfg.organism_dir) / f"{task}-hd32"
    if main:
        pretrain(dataclasses.replace(base, num_heads=base.hidden_size // 32, num_kv_heads=1), path, progress=progress)
    barrier()
    return str(path)


def resolve_student(
    cfg: TrainConfig, device: torch.device, *, progress: bool, main: bool, barrier: Callable[[], None]
) -> str:
    """The student's directory: `engine_organism` where it applies, else `models.spec.resolve_spec` (an
    ``organism:<task>`` pretrained on demand on the `main` process; any other spec unchanged)."""
    from mechopd.organisms.pretrain import pretrain_organism

    make = functools.partial(pretrain_organism, progress=progress)
    return engine_organism(cfg, device, progress=progress, main=main, barrier=barrier) or resolve_spec(
        cfg.student, cfg.organism_dir, make=make, main=main, barrier=barrier
    )


def resolve_teacher(cfg: TrainConfig, student_path: str, *, main: bool, barrier: Callable[[], None]) -> str:
    """The teacher's directory: the student's when there is no teacher (self-distillation), else its spec through
    `models.spec.resolve_spec` (``model:NAME`` fetched on first use, on the `main` process)."""
    if not cfg.teacher:
        return student_path
    return resolve_spec(cfg.teacher, cfg.organism_dir, main=main, barrier=barrier)
