"""The analyses of the fixed-context teachability table (`mechopd.probes.teachability`; docs/method.md §3):
quartile buckets of a signal, the high-support gain gap with a sequence bootstrap, the standardized regression. Pure
numpy on the per-token table (column -> ``[n_tokens]``); see the probe module's docstring for the definitions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mechopd.core.errors import ConfigError, DataError
from mechopd.evaluation.removability import resample_blocks
from mechopd.probes.teachability_limits import degeneracy

BUCKET_SIGNALS = ("C_norm", "DL", "DI", "kl_full")
GAINS = ("gain_abs", "gain_rel")
Table = dict[str, np.ndarray]  # column -> [n_tokens]


def _check_column(table: Table, name: str) -> np.ndarray:
    if name not in table:
        raise ConfigError(f"column {name!r} is not in the token table; columns: {', '.join(table)}")
    values = np.asarray(table[name], dtype=float)
    if values.size == 0:
        raise DataError("the token table is empty; the bank has no response tokens")
    return values


def quartile_buckets(table: Table, signal: str, gains: Sequence[str] = GAINS) -> list[dict[str, Any]]:
    """Mean gain per value-quartile of ``signal`` (Q1 = x ≤ q25, ..., Q4 = x > q75). One dict per quartile."""
    x = _check_column(table, signal)
    edges = np.quantile(x, [0.25, 0.5, 0.75])
    bucket = np.searchsorted(edges, x, side="left")  # number of edges strictly below x: 0..3
    bounds = [-math.inf, *edges.tolist(), math.inf]
    out = []
    for q in range(4):
        sel = bucket == q
        row: dict[str, Any] = {
            "signal": signal,
            "quartile": q + 1,
            "lo": bounds[q],
            "hi": bounds[q + 1],
            "n": int(sel.sum()),
        }
        for g in gains:
            values = _check_column(table, g)[sel]
            row[f"mean_{g}"] = float(values.mean()) if values.size else float("nan")
        out.append(row)
    return out


def _gap(H: np.ndarray, D: np.ndarray, C: np.ndarray, G: np.ndarray) -> tuple[float, int, int, int, float, float]:
    """(gap, n_q3, n_high, n_low, mean_high, mean_low) for one token set (NaN gap when a tercile is empty)."""
    q3 = (H <= np.median(H)) & (D > np.median(D))
    n_q3 = int(q3.sum())
    if n_q3 == 0:
        return float("nan"), 0, 0, 0, float("nan"), float("nan")
    c, g = C[q3], G[q3]
    lo, hi = np.quantile(c, [1 / 3, 2 / 3])
    high, low = g[c > hi], g[c <= lo]
    m_high = float(high.mean()) if high.size else float("nan")
    m_low = float(low.mean()) if low.size else float("nan")
    return m_high - m_low, n_q3, int(high.size), int(low.size), m_high, m_low


def _sequence_index(seq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens grouped by sequence: (order, starts, lengths) with ``order[starts[s] : starts[s]+lengths[s]]``."""
    order = np.argsort(seq, kind="stable")
    _, starts, lengths = np.unique(seq[order], return_index=True, return_counts=True)
    return order, starts, lengths


def _resampled_tokens(order: np.ndarray, starts: np.ndarray, lengths: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """Token indices of the sequences ``picks`` (with repeats), concatenated."""
    lens = lengths[picks]
    offsets = np.repeat(starts[picks] - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return order[offsets + np.arange(lens.sum())]


def high_support_gap(
    table: Table, n_boot: int, seed: int, gain: str = "gain_abs", c_col: str = "C_exact", ci: float = 0.95
) -> dict[str, Any]:
    """Q3 (low H, high D) high-C minus low-C tercile mean gain, with a sequence bootstrap CI (see module docstring)."""
    if n_boot < 0:
        raise ConfigError(f"n_boot={n_boot} is invalid: it must be >= 0")
    H, D, C, G = (_check_column(table, c) for c in ("H", "D", c_col, gain))
    seq = np.asarray(table["seq"])
    est, n_q3, n_high, n_low, m_high, m_low = _gap(H, D, C, G)
    order, starts, lengths = _sequence_index(seq)
    boots = []
    for picks in resample_blocks(len(starts), n_boot, seed):  # [block, n_seq] sequence indices
        for row in picks:
            idx = _resampled_tokens(order, starts, lengths, row)
            boots.append(_gap(H[idx], D[idx], C[idx], G[idx])[0])
    valid = np.asarray([b for b in boots if math.isfinite(b)])
    lo, hi = np.quantile(valid, [(1 - ci) / 2, 1 - (1 - ci) / 2]).tolist() if valid.size else (math.nan, math.nan)
    return {
        "estimate": est,
        "ci_low": lo,
        "ci_high": hi,
        "ci": ci,
        "n_boot": n_boot,
        "n_boot_valid": int(valid.size),
        "seed": seed,
        "gain": gain,
        "c_col": c_col,
        "n_tokens": int(H.size),
        "n_sequences": int(len(starts)),
        "n_q3": n_q3,
        "n_high": n_high,
        "n_low": n_low,
        "mean_high": m_high,
        "mean_low": m_low,
    }


def _z(x: np.ndarray) -> np.ndarray | None:
    sd = x.std()
    return None if not sd > 1e-12 else (x - x.mean()) / sd


def standardized_regression(
    table: Table, gain: str = "gain_abs", predictors: Sequence[str] = ("H", "DL", "DI")
) -> dict[str, Any]:
    """OLS ``z(G) = b0 + Σ_j b_j z(X_j)`` (numpy lstsq): standardized coefficients, intercept, R², n."""
    zg = _z(_check_column(table, gain))
    zs = {p: _z(_check_column(table, p)) for p in predictors}
    used = {p: z for p, z in zs.items() if z is not None}  # predictors in order, the constant ones left out
    coef = {p: float("nan") for p in predictors}
    n = int(len(table[gain]))
    if zg is None:  # constant gain: nothing to explain
        return {"gain": gain, "coef": coef, "intercept": float("nan"), "r2": float("nan"), "n": n}
    X = np.column_stack([np.ones(n), *used.values()])
    fit, *_ = np.linalg.lstsq(X, zg, rcond=None)
    resid = zg - X @ fit
    r2 = 1.0 - float(resid @ resid) / float(zg @ zg)  # zg has mean 0
    coef.update({p: float(b) for p, b in zip(used, fit[1:])})
    return {"gain": gain, "coef": coef, "intercept": float(fit[0]), "r2": r2, "n": n}


def summarize(table: Table, n_boot: int, seed: int) -> dict[str, Any]:
    """All analyses: quartile buckets per signal, the high-support gap and the regression, for both gains; and the
    degeneracy check (`teachability_limits.degeneracy`)."""
    return {
        "degeneracy": degeneracy(table),
        "n_tokens": int(len(table["seq"])),
        "n_sequences": int(len(np.unique(table["seq"]))),
        "means": {c: float(np.mean(table[c])) for c in ("H", "D", "kl0", "kl1", "gain_abs", "gain_rel")},
        "buckets": {s: quartile_buckets(table, s) for s in BUCKET_SIGNALS},
        "gap": {g: high_support_gap(table, n_boot, seed, gain=g) for g in GAINS},
        "regression": {g: standardized_regression(table, gain=g) for g in GAINS},
    }
