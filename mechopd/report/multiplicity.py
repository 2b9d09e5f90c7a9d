"""Multiplicity as a rule (docs/method.md §8, #53): Holm over the CONFIRMATORY rows — the papers' headline claims —
and every other row labelled exploratory.

The confirmatory family (`CONFIRMATORY`): OPD causes the degradation, NCA removes it, NCA keeps no-context accuracy,
TA-OPD is no worse than OPD. Each row's decision carries the one-sided p of its direction (`stats.p_value`; the
interval rule decides a row at p < 0.025, the 95 % interval's one-sided level). Holm at family level ALPHA = 0.025 per
direction over the m = 4 rows: sort the decided rows' p ascending; the i-th (i = 0, 1, …) stays decided while
p_(i) ≤ ALPHA / (m − i); at the first that does not, it and every later one become fragile, naming the step. A row
decided on an exact bound (no p: `stats.exact_bound`) keeps its decision and says Holm could not be applied.
Exploratory rows are each their own 5 % test, and the note under the table says how many a null world decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mechopd.report.verdicts import FAILS, HOLDS, NA_FRAGILE

CONFIRMATORY = ("degradation", "nca_removes", "nca_keeps", "ta_opd")
ALPHA = 0.025  # one-sided: the level at which the 95 % interval rule decides a direction
ROW_ERROR = 0.05  # each row's chance of a wrong decision with its true value on its bar (bench/coverage.py: ≤ 0.034)


def holm(rows: Sequence[Any], family: Sequence[str] = CONFIRMATORY, alpha: float = ALPHA) -> None:
    """Holm's step-down over the rows whose key is in ``family`` (in place): a decided row whose p fails its step
    becomes `NA_FRAGILE`, with the step in its measured cell; every row gets ``family`` "confirmatory" or
    "exploratory"."""
    for r in rows:
        r.family = "confirmatory" if r.key in family else "exploratory"
    m = len(family)
    decided = sorted(
        (r for r in rows if r.key in family and r.verdict in (HOLDS, FAILS) and r.p is not None), key=lambda r: r.p
    )
    stop = False
    for i, r in enumerate(decided):
        bar = alpha / (m - i)
        stop = stop or r.p > bar
        if stop:
            r.measured += (
                f" (fragile after Holm over the {m} confirmatory rows: p = {r.p:.3g} > {bar:.3g} at step {i + 1}; "
                f"it {r.verdict} at 5 % alone)"
            )
            r.verdict = NA_FRAGILE
    for r in rows:
        if r.key in family and r.verdict in (HOLDS, FAILS) and r.p is None:
            r.measured += " (exact bound: no p, Holm not applied)"


def chance_decisions(rows: int, alpha: float = ROW_ERROR, level: float = 0.05) -> tuple[float, int]:
    """In a null world (every row's true value on its bar, rows independent, each decided by chance with probability
    ≤ α): the expected number of chance decisions, rows·α, and the least k with P(Binomial(rows, α) ≥ k) ≤ level."""
    tail, k = 1.0, 0
    while tail > level:
        tail -= math.comb(rows, k) * alpha**k * (1 - alpha) ** (rows - k)
        k += 1
    return rows * alpha, k


def multiplicity_note(claims: Sequence[Any]) -> str:
    """The multiplicity line under the table: Holm over the confirmatory rows, the exploratory rows each at 5 % with
    how many of them a null world decides by chance, and how many this table decides."""
    decided = sum(c.verdict in (HOLDS, FAILS) for c in claims)
    explore = [c for c in claims if getattr(c, "family", "exploratory") != "confirmatory"]
    expect, k = chance_decisions(len(explore))
    confirm = [c.key for c in claims if getattr(c, "family", "") == "confirmatory"]
    return (
        f"Multiplicity: {len(claims)} rows. Confirmatory ({', '.join(confirm) or 'none here'}): Holm over the "
        f"{len(CONFIRMATORY)} headline rows at one-sided {ALPHA} (docs/method.md §8). Exploratory ({len(explore)} "
        f"rows): each decided on its own 95 % interval; a null world — every true value on its bar — would decide "
        f"about {expect:.2f} of them by chance ({k} or more with probability ≤ 5 %). This table decides {decided}."
    )
