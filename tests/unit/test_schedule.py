"""The anchor schedule and its gate (docs/method.md §2): m(s) from a fixed start, a ramp, and a latching KL gate."""

from __future__ import annotations

import math

import pytest

from mechopd.objectives.schedule import AccuracyGate, AnchorGate, BetaSchedule


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
    with pytest.raises(ValueError, match="no KL anchor-gate state"):
        other.load(None)


def test_accuracy_gate_checks_every_few_steps_measures_the_teacher_once_and_latches():
    """acc_x ≥ share · acc_f on check steps only (every `every`); the teacher's accuracy is measured at the first
    check and kept; the opening latches and is logged once."""
    gate = AccuracyGate(share=0.6, every=2)
    sched = BetaSchedule(gate=gate)
    calls: list[int] = []
    accs = iter([0.0, 0.25, 0.5, 0.0])  # acc_x at steps 1, 3, 5 (0.6 x 0.75 = 0.45: opens after step 5)

    def measure() -> tuple[float, float]:
        calls.append(1)
        return next(accs), 0.75 if len(calls) == 1 else 0.0  # a later reference is ignored

    logs = [gate.update(step, {}, measure) for step in range(8)]
    assert len(calls) == 3 and [bool(x) for x in logs] == [False, True, False, True, False, True, False, False]
    assert logs[1] == {"nca_gate/acc_x": 0.0, "nca_gate/acc_teacher": 0.75}
    assert logs[5]["nca_gate/open_step"] == 6 and gate.open_step == 6 and gate.reference == 0.75
    assert [sched(s) for s in range(8)] == [0, 0, 0, 0, 0, 0, 1.0, 1.0]


def test_accuracy_gate_state_round_trips_and_the_other_gates_state_is_refused():
    gate = AccuracyGate(share=0.5, every=1)
    gate.update(0, {}, lambda: (0.1, 0.8))
    other = AccuracyGate(share=0.5, every=1)
    other.load(gate.state())
    assert other.state() == gate.state() and other.reference == 0.8 and other.open_step is None
    assert other.update(1, {}, lambda: (0.4, 0.0))["nca_gate/open_step"] == 2  # the restored reference, 0.8
    with pytest.raises(ValueError, match="no accuracy-gate state"):
        other.load(AnchorGate(level=0.2).state())
    with pytest.raises(ValueError, match="no KL anchor-gate state"):
        AnchorGate(level=0.2).load(gate.state())
    assert "stayed below nca_gate_acc=0.5 x the teacher's 0.800" in AccuracyGate(0.5, 1, [0.1], 0.8).never_opened()
