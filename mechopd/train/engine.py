"""The trainer's side of ``rollout_engine: vllm``: build one colocated engine per process and sync the student into it
after every optimizer step (in place, no checkpoint round trip; FSDP: one gather of the full parameters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mechopd.config import TrainConfig


def rollout_engine(cfg: TrainConfig, student: Any, shard: Any, path: str | Path, device: torch.device,
                   world: int) -> Any:
    """None unless ``rollout_engine: vllm``; else a vLLM engine over `path` (the student's own directory, never a
    checkpoint dir: vLLM would read its optimizer files), synced with `student` now (a resumed run's weights). The
    trainer puts it in its `SamplingSettings` (``engine=``): rollouts and the periodic evaluation sample with it."""
    if cfg.rollout_engine != "vllm":
        return None
    from mechopd.generate.vllm_engine import VllmEngine

    engine = VllmEngine(path, dtype=cfg.dtype, seed=cfg.seed, device=device.type, world=world, **cfg.vllm_options)
    sync_engine(engine, student, shard)
    return engine


def sync_engine(engine: Any, student: Any, shard: Any) -> None:
    """The student's weights into the rollout engine, in place (no-op without an engine)."""
    if engine is not None:
        with shard.gathered(student):
            engine.load_weights(student)
