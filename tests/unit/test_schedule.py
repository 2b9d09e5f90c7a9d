"""The anchor schedule and its gate (docs/method.md §2): m(s) from a fixed start, a ramp, and a latching KL gate."""

from __future__ import annotations

import math

import pytest

from mechopd.objectives.schedule import AnchorGate, BetaSchedule


def test_fixed_start_and_ramp():
    assert [BetaSchedule()(s) for s in range(3)] == [1.0, 1.0, 1.0]  # the papers' constant β
    assert [BetaSchedule(start=2, warmup=4)(s) for s in range(7)] == [0, 0, 0.25, 0.5, 0.75, 1.0, 1.0]


def test_gate_opens_the_step_after_the_window_mean_reaches_the_level_and_latches():
    gate = AnchorGate(level=0.1, window=3)
    sched = BetaSchedule(gate=gate)
    kls = [8.0, 0.05, 0.05, 0.05, 0.3, 9.0]  # window means: 8, 4.03, 2.7, 0.05 -> opens after step 3
    logs = []
    for step, kl in enumerate(kls):
        assert sched(step) == (1.0 if gate.open_step is not None and step >= gate.open_step else 0.0)
        logs.append(gate.observe(step, kl))
    assert gate.open_step == 4
    assert "nca_gate/open_step" not in logs[2] and logs[3]["nca_gate/open_step"] == 4
    assert logs[3]["nca_gate/kl_mean"] == pytest.approx(0.05)
    assert logs[4] == {} and logs[5] == {}  # latched: a later rise in KL does not close it
    assert [sched(s) for s in range(7)] == [0, 0, 0, 0, 1.0, 1.0, 1.0]


def test_gate_needs_a_full_window_and_never_opens_on_nan():
    gate = AnchorGate(level=1.0, window=3)
    gate.observe(0, 0.0)
    gate.observe(1, 0.0)
    assert gate.open_step is None  # two steps of a three-step window
    nan_gate = AnchorGate(level=1.0, window=1)
    nan_gate.observe(0, math.nan)
    assert nan_gate.open_step is None


def test_gate_composes_with_a_fixed_start_and_a_ramp():
    gate = AnchorGate(level=1.0, window=1)
    sched = BetaSchedule(start=3, warmup=2, gate=gate)
    gate.observe(0, 0.5)  # opens at step 1, but the fixed start says no earlier than 3
    assert [sched(s) for s in range(6)] == [0, 0, 0, 0.5, 1.0, 1.0]


def test_gate_state_round_trips_and_a_missing_state_is_refused():
    gate = AnchorGate(level=0.2, window=2)
    gate.observe(0, 3.0)
    other = AnchorGate(level=0.2, window=2)
    other.load(gate.state())
    assert other.state() == gate.state()
    other.observe(1, 0.1)
    gate.observe(1, 0.1)
    assert other.state() == gate.state() and other.open_step is None  # (3.0 + 0.1) / 2 > 0.2
    with pytest.raises(ValueError, match="no anchor-gate state"):
        other.load(None)
