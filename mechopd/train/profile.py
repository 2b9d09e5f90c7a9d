"""Where a training step's time goes: wall seconds and tokens/s per stage, logged every step (``time/<stage>``,
``tokens_per_s/<stage>``: the step's global response tokens over the stage's seconds in this process).

Stages: ``rollout`` (sampling, both batches), ``teacher`` (the teacher's trunk forwards, no grad), ``student_fwd`` (the
student's trunk forwards, every view), ``loss`` (per chunk: LM heads, log-softmax, loss terms, their backward into
the head and the hidden-state leaves; selection signals included), ``student_bwd`` (the backward through the
student's trunk), ``optimizer`` (gradient reduction, clipping, the guard, AdamW, the EMA teacher, the engine sync).
On a GPU every stage boundary synchronises the device (a few syncs per step), so the seconds are the device's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

STAGES = ("rollout", "teacher", "student_fwd", "loss", "student_bwd", "optimizer")


class StageClock:
    """Accumulates seconds per stage; `reset` at the start of a step, `logs` at its end."""

    def __init__(self) -> None:
        self.sync = torch.cuda.is_available()
        self.reset()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self._stack: list[list] = []  # [stage, start] of the open stages; an inner stage pauses the outer one

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] += seconds

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        """Time the block as `stage`, exclusive of any stage opened inside it (each second counted once)."""
        now = self._now()
        if self._stack:
            outer = self._stack[-1]
            self.seconds[outer[0]] += now - outer[1]
        self._stack.append([stage, now])
        try:
            yield
        finally:
            now = self._now()
            name, start = self._stack.pop()
            self.seconds[name] += now - start
            if self._stack:
                self._stack[-1][1] = now

    def logs(self, tokens: float) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for s, sec in self.seconds.items():
            out[f"time/{s}"] = sec
            out[f"tokens_per_s/{s}"] = tokens / sec if sec > 0 else None
        return out
