"""The learning-rate multiplier (mechopd/train/lr.py): warm-up, then constant, linear or cosine decay to 0."""

from __future__ import annotations

import math

import pytest

from mechopd.config import TrainConfig
from mechopd.core.errors import ConfigError
from mechopd.train.lr import lr_multiplier


def test_constant_is_the_old_warmup_rule():
    for warmup in (0, 1, 3):
        assert [lr_multiplier(s, 10, warmup) for s in range(10)] == [
            min(1.0, (s + 1) / max(1, warmup)) for s in range(10)
        ]


def test_linear_and_cosine_decay_to_zero_after_warmup():
    assert [lr_multiplier(s, 6, 2, "linear") for s in range(6)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    cos = [lr_multiplier(s, 5, 0, "cosine") for s in range(5)]
    assert cos[0] == 1.0 and cos[2] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.4)))
    assert all(a > b for a, b in zip(cos, cos[1:])) and cos[-1] > 0  # the last step still moves
    assert lr_multiplier(9, 10, 0, "linear") == pytest.approx(0.1)


def test_unknown_schedule_is_refused():
    with pytest.raises(ConfigError, match="lr_schedule='step' is unknown; choose one of constant, linear, cosine"):
        TrainConfig(lr_schedule="step")
