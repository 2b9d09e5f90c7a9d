"""The one range language (a leaf: it imports only `mechopd.core.errors`): `Range`, which every option's ``range=``
uses (`mechopd.core.options.option`, the probes' options too; re-exported there with the common ones: ``GE0``,
``GE1``, ``GT0``, ``UNIT``), and the seed and temperature rules every verb shares (train, eval, the probes,
pretraining and task options; `config/` re-exports them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mechopd.core.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """``lo`` (inclusive unless ``open_lo``) up to ``hi`` (inclusive); None = unbounded on that side."""

    lo: float | None
    hi: float | None = None
    open_lo: bool = False

    def text(self) -> str:
        hi = f"{self.hi:g}" if isinstance(self.hi, float) else f"{self.hi}"  # 1.0 -> 1; an integer bound as written
        if self.lo is None:
            return f"<= {hi}"
        return f"{'>' if self.open_lo else '>='} {self.lo:g}" + (f" and <= {hi}" if self.hi is not None else "")

    def holds(self, value: float) -> bool:
        low = self.lo is None or (value > self.lo if self.open_lo else value >= self.lo)
        return low and (self.hi is None or value <= self.hi)


SEED_MAX = 2**63 - 1  # every verb's seed: 0..SEED_MAX (torch, numpy and random all take it)
# A sampling temperature below this is refused in every verb (train, eval, probes, task options): logits / T
# overflows float32 long before T reaches 0; omit the temperature for greedy decoding (eval, probes) instead.
MIN_TEMPERATURE = 1e-4
SEED_RANGE = Range(0, SEED_MAX)
TEMPERATURE_RANGE = Range(MIN_TEMPERATURE)


def in_range(name: str, value: Any, rng: Range, integer: bool = False, optional: bool = False) -> None:
    """Refuse a value outside ``rng`` (numbers: finite; ``integer``: an int), naming the field and the range."""
    if value is None and optional:
        return
    bad_type = isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float))
    if bad_type or not math.isfinite(value) or not rng.holds(value):
        kind = "an integer" if integer else "a finite number"
        raise ConfigError(
            f"{name}={value!r} is invalid: it must be {kind} {rng.text()}{' (or null)' if optional else ''}"
        )


def check_seed(value: Any, flag: str = "seed") -> int:
    """The one seed rule of every verb: an integer 0..SEED_MAX."""
    in_range(flag, value, SEED_RANGE, integer=True)
    return value


def check_temperature(value: Any, flag: str = "temperature", optional: bool = True) -> Any:
    """The one temperature rule of every verb: finite and >= MIN_TEMPERATURE (None = the default, where allowed)."""
    in_range(flag, value, TEMPERATURE_RANGE, optional=optional)
    return value
