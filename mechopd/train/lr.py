"""The learning-rate multiplier per optimizer step: linear warm-up, then constant, linear or cosine decay to 0.

    m(s) = (s + 1) / W                          s < W                (W = warmup; W = 0: no warm-up)
    m(s) = 1                                    constant
    m(s) = 1 − p                                linear,   p = (s − W) / (S − W) ∈ [0, 1)
    m(s) = ½ (1 + cos(π p))                     cosine

at 0-based step ``s`` of ``S = steps``. ``constant`` is the papers' (lr 5e-6, 50–100 steps). The decays exist for
students trained far above that rate (the organisms: lr 1e-3), where AdamW near convergence can take rare large
steps and the final checkpoint may be caught in one (docs/results.md).
"""

from __future__ import annotations

import math

from mechopd.config import TrainConfig


def lr_multiplier(step: int, steps: int, warmup: int = TrainConfig.warmup, schedule: str = "constant") -> float:
    """m(s) above; `schedule` is one of ``config.sections.LR_SCHEDULES`` (validated by TrainConfig)."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    p = min(1.0, (step - warmup) / max(1, steps - warmup))
    return 1.0 - p if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
