"""The value rules every verb shares (a leaf: it imports only `mechopd.core.errors`).

One seed rule and one temperature rule for train, eval, the probes, pretraining and task options; `config/`
re-exports them; every other training field declares its range with its field (`mechopd.core.options.option`).
"""

from __future__ import annotations

import math
from typing import Any

from mechopd.core.errors import ConfigError

SEED_MAX = 2**63 - 1  # every verb's seed: 0..SEED_MAX (torch, numpy and random all take it)
# A sampling temperature below this is refused in every verb (train, eval, probes, task options): logits / T
# overflows float32 long before T reaches 0; omit the temperature for greedy decoding (eval, probes) instead.
MIN_TEMPERATURE = 1e-4
# (integer?, lower bound, lower bound inclusive?, upper bound or None, None allowed?)
SEED_RANGE = (True, 0, True, SEED_MAX, False)
TEMPERATURE_RANGE = (False, MIN_TEMPERATURE, True, None, True)


def in_range(
    name: str, value: Any, integer: bool, lo: float, lo_closed: bool, hi: float | None, optional: bool
) -> None:
    """Refuse a value outside its stated range, naming the field and the range."""
    if value is None and optional:
        return
    kind = "an integer" if integer else "a finite number"
    rng = f"{'>=' if lo_closed else '>'} {lo:g}" + (f" and <= {hi}" if hi is not None else "")
    bad_type = isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float))
    if (
        bad_type
        or not math.isfinite(value)
        or (value < lo if lo_closed else value <= lo)
        or (hi is not None and value > hi)
    ):
        none = " (or null)" if optional else ""
        raise ConfigError(f"{name}={value!r} is invalid: it must be {kind} {rng}{none}")


def check_seed(value: Any, flag: str = "seed") -> int:
    """The one seed rule of every verb: an integer 0..SEED_MAX."""
    in_range(flag, value, *SEED_RANGE)
    return value


def check_temperature(value: Any, flag: str = "temperature", optional: bool = True) -> Any:
    """The one temperature rule of every verb: finite and >= MIN_TEMPERATURE (None = the default, where allowed)."""
    in_range(flag, value, *TEMPERATURE_RANGE[:4], optional)
    return value
