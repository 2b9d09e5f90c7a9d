"""The anchor's schedule: a fixed start, a linear ramp, and an optional gate on OPD's progress (docs/method.md §2).

NCA's anchor ``β · KL(sg[q_x] ‖ q_c)`` pulls the context view toward the no-context view. The papers use a constant β
from the first step. On a student whose two views start far apart (the organisms: wrong without the context, right
with it) the anchor then pulls the context view toward a no-context view that has learned nothing yet, and its
gradient can dwarf OPD's (docs/results.md). The gate starts the anchor once the no-context view has reached the teacher, measured without labels.
``AnchorGate(level)`` holds the gate's state (the trainer feeds it, the checkpoint saves it); ``BetaSchedule`` turns a
step into the anchor's weight multiplier.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class AnchorGate:
    """Opens the anchor once OPD has brought the no-context view onto the teacher; stays open after that.

        open from step s + 1   at the first s with   (1/W) Σ_{i = s−W+1..s} KL_i ≤ level

    KL_i: step i's full-vocabulary ``KL(q_x ‖ f)``, the token mean over the global rollout batch (the trainer's logged
    ``kl/teacher_student``, identical on every process); W = ``window`` steps. Why this quantity: with ``q_c`` still
    at the teacher (self-distillation, step 0: ``q_c = f``), the anchor's own value ``KL(q_x ‖ q_c)`` equals this KL,
    so opening at ``level`` nats means the anchor pulls the context view toward a target at most about ``level`` from
    the teacher, instead of toward an untrained no-context view. Labels are never read. The level is in nats per
    response token, so it is task-dependent: the library default is no gate (the papers' constant β).
    """

    level: float
    window: int = 5
    history: list[float] = field(default_factory=list)
    open_step: int | None = None

    def observe(self, step: int, kl: float) -> dict[str, Any]:
        """Feed the KL of 0-based optimizer step ``step`` (just taken); returns what to log for that step."""
        if self.open_step is not None:
            return {}
        self.history = (self.history + [float(kl)])[-self.window :]
        mean = sum(self.history) / len(self.history)
        logs: dict[str, Any] = {"nca_gate/kl_mean": mean}
        if len(self.history) == self.window and mean <= self.level:  # a NaN mean never opens it
            self.open_step = step + 1
            logs["nca_gate/open_step"] = self.open_step
        return logs

    def update(self, step: int, logs: dict[str, Any], measure: Callable[[], tuple[float, float]]) -> dict[str, Any]:
        """The trainer's call after step ``step``: reads the step's logged KL (`measure` is the accuracy gate's)."""
        return self.observe(step, logs["kl/teacher_student"])

    def never_opened(self) -> str:
        return f"mean KL(q_x‖f) over {self.window} steps stayed above nca_gate={self.level:g}"

    def state(self) -> dict[str, Any]:
        return {"level": self.level, "window": self.window, "history": list(self.history), "open_step": self.open_step}

    def load(self, state: dict[str, Any] | None) -> None:
        """Restore `state` (from a checkpoint); None (a checkpoint written without a gate) is refused."""
        if state is None or "level" not in state:
            raise ValueError("the checkpoint holds no KL anchor-gate state")
        self.history, self.open_step = [float(v) for v in state["history"]], state["open_step"]


@dataclass(eq=False)
class AccuracyGate:
    """Opens the anchor once OPD has brought the no-context view's ANSWERS to the teacher's, on training items:

        open from step s + 1   at the first checked s with   acc_x(s) ≥ share · acc_f

    acc_x(s): the student's greedy accuracy WITHOUT the context on ``n`` fixed training items after step s, checked
    after every ``every``-th step; acc_f: the teacher's greedy accuracy WITH the context on the same items, measured
    once at the first check (`measure` returns both; the trainer's `_gate_accuracy`). Why not the KL gate: the KL is
    a mean over every response token, mostly the restated question, and on SmolLM2's handbooks it fell to its level
    while no answer was learned and stayed above it after the answers were (docs/real_models.md, pilot 3). This gate
    reads the task's labels of TRAINING items only, never a held-out one; it costs 2 greedy decodes of ``n`` items
    at the first check and 1 per check after that.
    """

    share: float
    every: int
    history: list[float] = field(default_factory=list)  # acc_x at each check
    reference: float | None = None  # acc_f
    open_step: int | None = None

    @property
    def window(self) -> int:  # the KL gate's name for its step count (the report and the warning read it)
        return self.every

    def update(self, step: int, logs: dict[str, Any], measure: Callable[[], tuple[float, float]]) -> dict[str, Any]:
        """After step ``step`` (0-based, just taken): on a check step, `measure` gives (acc_x, acc_f) and the
        gate may open; returns what to log (``nca_gate/acc_x``, ``nca_gate/acc_teacher``, ``nca_gate/open_step``)."""
        if self.open_step is not None or (step + 1) % self.every:
            return {}
        acc, ref = measure()
        self.reference = ref if self.reference is None else self.reference
        self.history.append(float(acc))
        out: dict[str, Any] = {"nca_gate/acc_x": float(acc), "nca_gate/acc_teacher": self.reference}
        if acc >= self.share * self.reference:
            self.open_step = step + 1
            out["nca_gate/open_step"] = self.open_step
        return out

    def never_opened(self) -> str:
        ref = "n/a" if self.reference is None else f"{self.reference:.3f}"
        best = max(self.history, default=float("nan"))
        return (
            f"the no-context view's greedy accuracy on training items (best {best:.3f}) stayed below "
            f"nca_gate_acc={self.share:g} x the teacher's {ref}"
        )

    def state(self) -> dict[str, Any]:
        return {
            "share": self.share,
            "every": self.every,
            "history": list(self.history),
            "reference": self.reference,
            "open_step": self.open_step,
        }

    def load(self, state: dict[str, Any] | None) -> None:
        """Restore `state` (from a checkpoint); a state of the other gate, or none, is refused."""
        if state is None or "reference" not in state:
            raise ValueError("the checkpoint holds no accuracy-gate state")
        self.history, self.reference = [float(v) for v in state["history"]], state["reference"]
        self.open_step = state["open_step"]


Gate = AnchorGate | AccuracyGate


@dataclass(frozen=True)
class BetaSchedule:
    """The anchor's weight multiplier at optimizer step ``s`` (0-based; docs/method.md §2, "anchor schedule").

        m(s) = 0                                   s < start
        m(s) = min(1, (s − start + 1) / warmup)    s ≥ start, warmup > 0
        m(s) = 1                                   otherwise

    with ``start = max(nca_start, gate.open_step)`` when a gate is set (m = 0 while it is closed), else ``nca_start``.
    ``nca_start = warmup = 0`` and no gate is the papers' constant β from the first step.
    """

    start: int = 0
    warmup: int = 0
    gate: Gate | None = None

    def __call__(self, step: int) -> float:
        start = self.start
        if self.gate is not None:
            if self.gate.open_step is None:
                return 0.0
            start = max(start, self.gate.open_step)
        if step < start:
            return 0.0
        return min(1.0, (step - start + 1) / self.warmup) if self.warmup > 0 else 1.0
