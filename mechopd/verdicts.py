"""The claims table's verdict words and the one ceiling rule every "≥" claim applies (docs/method.md §7)."""

from __future__ import annotations

from collections.abc import Iterable

HOLDS, FAILS, NA = "holds", "does not hold", "not measurable here"
NA_CEILING = "not measurable here (ceiling)"
CEILING = 0.995  # a proportion at or above this is at the ceiling: "≥" cannot fail there, so it cannot speak


def at_ceiling(pairs: Iterable[tuple[float | None, float | None]]) -> bool:
    """True when every (a, b) pair (one per seed) has both values defined and ≥ `CEILING`: a claim "a ≥ b" (or
    "a keeps b's level") is then "not measurable here (ceiling)", whatever the claim."""
    pairs = list(pairs)
    return bool(pairs) and all(a is not None and b is not None and a >= CEILING and b >= CEILING for a, b in pairs)


def fragility(stat: dict, bar: float) -> str:
    """A note for a verdict read on a seed mean: with ≥ 2 seeds, when the Student-t interval holds the criterion's
    bar, the verdict could flip with another seed (or thread count): say so; with one seed, say there is no interval."""
    if stat.get("mean") is None:
        return ""
    if stat.get("low") is None:
        return " (one seed: no interval; the verdict may not survive another seed)"
    if stat["low"] <= bar <= stat["high"]:
        return f" (fragile: the seed interval [{stat['low']:.3f}, {stat['high']:.3f}] holds the bar {bar:g})"
    return ""
