"""What a study of S seeds × n items can decide, said before its first job (#54 item 2, docs/method.md §8).

For each core row (`CORE`) the planned minimum detectable effect at 80 % power from the MDE rule (`stats.mde`) with
a stated per-item variance v (a Harm of 0.2, the bar plus its SESOI: v = 0.2 · 0.8 = 0.16; a paired accuracy
difference with 10 % of its items discordant: v = 0.10) and no between-seed spread:

    MDE = (t_{0.975, S−1} + t_{0.80, S−1}) · sqrt(v / (S · n_row))     (one seed: normal quantiles, no seed interval)

where n_row is the row's informative units per seed: every item for the accuracy differences, the items right without
the context for the Harm rows (assumed half of them before the run). A row whose planned MDE exceeds its smallest
effect of interest (SESOI: the bar's distance the papers' claims need) cannot be decided by this design; the line names
it and the seeds × items that would (`stats.design_for`). Real spreads only widen the MDE: the report prints each
undecided row's measured MDE.
"""

from __future__ import annotations

from mechopd.core.stats import design_for, mde

HARM_VAR, DIFF_VAR = 0.16, 0.10  # per-item variance of a Harm at 0.2; of a paired difference, 10 % discordant
# row key -> (what, smallest effect of interest, share of the items that are the row's units, per-item variance)
CORE: dict[str, tuple[str, float, float, float]] = {
    "degradation": ("OPD's Harm − the base's ≥ 0.10", 0.10, 0.5, HARM_VAR),
    "nca_removes": ("NCA's Harm − 0.5 × OPD's ≤ 0 (half of a 0.10 Harm)", 0.05, 0.5, HARM_VAR),
    "nca_keeps": ("NCA non-inferior to OPD (margin 0.05)", 0.05, 1.0, DIFF_VAR),
    "ta_opd": ("TA-OPD non-inferior to OPD (margin 0.05)", 0.05, 1.0, DIFF_VAR),
}


def planned(seeds: int, items: int) -> dict[str, tuple[float, tuple[int, int] | None]]:
    """Per core row: its planned MDE and the seeds × items that would detect its SESOI (None: more than 200 seeds)."""
    out = {}
    for key, (_, sesoi, share, var) in CORE.items():
        n = max(int(items * share), 1)
        stat = {"se": (var / (seeds * n)) ** 0.5, "df": seeds - 1, "var_item": var / n, "items": n}
        size = mde(stat)
        out[key] = (float(size) if size is not None else float("inf"), design_for({**stat, "var_seed": 0.0}, sesoi))
    return out


def design_lines(seeds: int, items: int) -> list[str]:
    """The lines printed before the first job: the rows this design cannot decide (planned MDE > SESOI), each with
    the design that would; one line saying so when it can decide all four."""
    rows = planned(seeds, items)
    short = [k for k, (size, _) in rows.items() if size > CORE[k][1]]
    head = f"design: {seeds} seed{'s' if seeds != 1 else ''} × {items} items"
    if not short:
        return [f"{head}: the core rows can see their smallest effects of interest (planned MDE ≤ SESOI)"]
    out = [f"{head}: cannot decide {len(short)} of {len(rows)} core rows (planned MDE at 80 % power > SESOI):"]
    for k in short:
        size, need = rows[k]
        n_row = max(int(items * CORE[k][2]), 1)
        to = f"{need[0]} seeds × {round(need[1] / CORE[k][2])} items" if need else "more than 200 seeds"
        out.append(f"  {k}: {CORE[k][0]}: MDE {size:.3f} on {n_row} units per seed; to decide it: {to}")
    if seeds == 1:
        out.append("  one seed: no seed interval; every verdict is marked and may not survive another seed")
    return out
