"""The claims table's verdict words, the interval rule every row is decided by, and the one ceiling rule every "≥"
claim applies (docs/method.md §8). Imports only the statistics leaf (`mechopd.core.stats`).

The interval rule, for a criterion ``stat OP bar`` (OP one of ≥, >, ≤, <) on a seed statistic ``{"mean", "low",
"high", "n"}`` (`mechopd.core.stats.seed_stat` / `hier_bootstrap`, 95 % Student-t over seeds), with tolerance ``TOL = 1e-9``:

    ≥ 2 seeds:  holds           iff every v in [low, high] satisfies  v OP bar
                does not hold   iff every v in [low, high] violates   v OP bar
                otherwise       "not measurable here (fragile)"       (the interval holds the bar)
    1 seed:     with an item-level interval (a one-seed `hier_bootstrap` is an item bootstrap) the same rule on
                that interval, marked; without one the value itself decides, marked; but a statistic of a study of
                several seeds (``stat["of"]`` ≥ 2, set by the claims) defined in only one of them is fragile

The satisfying set of ``v OP bar`` is a half-line, so checking the two ends decides the whole interval. A zero-width
interval exactly at the bar satisfies ≥ and ≤ and violates > and <. Compound criteria use three-valued (Kleene)
logic: `all_of` fails if any part fails, holds if all hold, else is undecided; `any_of` holds if any part holds,
fails if all fail, else is undecided. Undecided is "fragile" when every undecided part is fragile, plain "not
measurable here" when a part is undefined, and "not measurable here (design: REASON)" when a part's statistic has no
informative unit (``stat["degenerate"]``: never a zero-width interval) or a row's precondition fails (`na_design`).

Each decision carries the one-sided p of its direction (`stats.p_value`; compounds: the intersection-union p of an
AND that holds is its largest part's, of an OR that holds its smallest) for Holm over the confirmatory rows, and a
"fragile" or "does not hold" part carries its MDE at 80 % power (`stats.mde`) and the seeds × items that would
decide the observed distance from the bar (`stats.design_for`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mechopd.core.stats import design_for, mde, on_scale, p_value

HOLDS, FAILS, NA = "holds", "does not hold", "not measurable here"
NA_CEILING = "not measurable here (ceiling)"
NA_FRAGILE = "not measurable here (fragile)"
NA_FLOOR_BOTH = "not measurable here (floor: both at 0)"  # the ceiling's mirror: a comparison of two zeros
CEILING = 0.995  # a proportion at or above this is at the ceiling: "≥" cannot fail there, so it cannot speak
TOL = 1e-9
RULE = "with ≥ 2 seeds the whole 95 % seed interval must clear the bar, else fragile"
ONE_SEED_NOTE = " (one seed: no seed interval; the verdict may not survive another seed)"
OPS = (">=", ">", "<=", "<")
NA_DESIGN = NA + " (design: "


def na_design(reason: str) -> str:
    """The verdict of a row whose precondition fails or whose statistic has no informative unit."""
    return f"{NA_DESIGN}{reason})"


@dataclass(frozen=True)
class Decision:
    """A verdict (`HOLDS`, `FAILS`, `NA_FRAGILE` or `NA`), the fragile parts that left it undecided (each a phrase
    naming its interval and bar) and ``one_seed`` (a part was decided on a single value: no interval)."""

    verdict: str
    fragile: tuple[str, ...] = ()
    one_seed: bool = False
    p: float | None = None
    mde: tuple[str, ...] = ()

    @property
    def note(self) -> str:
        """The text the measured cell gets: why it is fragile, or that one seed has no interval, and the MDE of a
        fragile or failing part; else empty."""
        sees = f"; {'; '.join(self.mde)}" if self.mde and self.verdict in (NA_FRAGILE, FAILS) else ""
        if self.verdict == NA_FRAGILE:
            return f" (fragile: {'; '.join(self.fragile)}{sees})"
        one = ONE_SEED_NOTE if self.one_seed and self.verdict in (HOLDS, FAILS) else ""
        return one + (f" ({sees[2:]})" if sees else "")


def mde_text(stat: dict[str, Any], bar: float, label: str = "") -> str:
    """``MDE 0.083 (to decide the observed +0.040: 12 seeds × 200 items)``: the smallest distance from the bar the
    run could see at 80 % power, on the statistic's scale (× for a log-scale ratio), and the design for the observed
    distance; empty without an se."""
    size = mde(stat)
    if size is None:
        return ""
    scale = stat.get("scale", "linear")
    text = (
        f"MDE ×{math.exp(size):.3g}"
        if scale == "log"
        else f"MDE {size:.3g}" + ("" if scale == "linear" else f" ({scale})")
    )
    seen = _distance(stat, bar)
    need = design_for(stat, seen) if seen else None
    on = "" if scale == "linear" else f" ({scale})"
    if need is not None:
        text += f" (to decide the observed distance {seen:.3g}{on}: {need[0]} seeds × {need[1]} items)"
    elif seen and stat.get("var_item") is not None and stat.get("var_seed") is not None:
        text += f" (the observed distance {seen:.3g}{on} needs more than 200 seeds × {4 * round(stat.get('items') or 0)} items)"
    return f"{label}: {text}" if label else text


def _distance(stat: dict[str, Any], bar: float) -> float | None:
    a, b = on_scale(stat["mean"], stat.get("scale", "linear")), on_scale(bar, stat.get("scale", "linear"))
    return None if a is None or b is None else abs(a - b)


def satisfies(v: float, bar: float, op: str) -> bool:
    """``v OP bar`` with tolerance `TOL`: a non-strict OP accepts v within TOL of the bar, a strict one refuses it."""
    if op == ">=":
        return v >= bar - TOL
    if op == ">":
        return v > bar + TOL
    if op == "<=":
        return v <= bar + TOL
    if op == "<":
        return v < bar - TOL
    raise ValueError(f"decide: op must be one of {OPS}, got {op!r}")


def decide(stat: dict[str, Any], bar: float, op: str, label: str = "") -> Decision:
    """The interval rule (module docstring) for ``stat OP bar``; ``label`` names the part in a fragile note.
    Undefined statistic (mean None): `NA`."""
    if op not in OPS:
        raise ValueError(f"decide: op must be one of {OPS}, got {op!r}")
    if stat.get("mean") is None:
        return Decision(NA)
    if stat.get("degenerate"):
        return Decision(na_design(f"{label + ': ' if label else ''}{stat['degenerate']}"))
    if stat.get("of", 0) >= 2 and stat.get("n", 0) < 2:  # a study of several seeds, the quantity defined in one
        why = f"defined in {stat.get('n', 0)} of {stat['of']} seeds, so no interval"
        return Decision(NA_FRAGILE, (f"{label}: {why}" if label else why,))
    if stat.get("low") is None:
        return Decision(HOLDS if satisfies(stat["mean"], bar, op) else FAILS, one_seed=True)
    one = stat.get("n", 0) < 2  # one seed: an item-level interval, no seed interval
    ends = [satisfies(stat[k], bar, op) for k in ("low", "high")]
    p = p_value(stat, bar, op)
    if all(ends):
        return Decision(HOLDS, one_seed=one, p=p)
    sees = tuple(t for t in (mde_text(stat, bar, label),) if t)
    if not any(ends):
        return Decision(FAILS, one_seed=one, p=p, mde=sees)
    why = f"the 95 % interval [{stat['low']:.3f}, {stat['high']:.3f}] holds the bar {bar:g}"
    return Decision(NA_FRAGILE, (f"{label}: {why}" if label else why,), mde=sees)


def _kleene(parts: tuple[Decision, ...], absorbing: str, identity: str) -> Decision:
    """Three-valued AND (absorbing FAILS, identity HOLDS) or OR (absorbing HOLDS, identity FAILS): one part with the
    absorbing verdict decides; all parts at the identity decide; else undecided — fragile when every undecided part is
    fragile (naming them), not measurable otherwise."""
    one = any(d.one_seed for d in parts)
    sees = tuple(m for d in parts for m in d.mde)
    if any(d.verdict == absorbing for d in parts):  # decided by its strongest absorbing part
        ps = [d.p for d in parts if d.verdict == absorbing]
        return Decision(absorbing, one_seed=one, p=None if None in ps else min(ps), mde=sees)  # type: ignore[type-var]
    if all(d.verdict == identity for d in parts):  # every part needed: the weakest
        ps = [d.p for d in parts]
        return Decision(identity, one_seed=one, p=None if None in ps else max(ps), mde=sees)  # type: ignore[type-var]
    rest = [d for d in parts if d.verdict not in (HOLDS, FAILS)]
    if all(d.verdict == NA_FRAGILE for d in rest):
        return Decision(NA_FRAGILE, tuple(f for d in rest for f in d.fragile), one, mde=sees)
    design = [d.verdict for d in rest if d.verdict.startswith(NA_DESIGN)]
    return Decision(design[0] if design else NA, one_seed=one)


def all_of(*parts: Decision) -> Decision:
    """Kleene AND: fails if any part fails, holds if every part holds, else undecided (fragile or not measurable)."""
    return _kleene(parts, FAILS, HOLDS)


def any_of(*parts: Decision) -> Decision:
    """Kleene OR: holds if any part holds, fails if every part fails, else undecided (fragile or not measurable)."""
    return _kleene(parts, HOLDS, FAILS)
