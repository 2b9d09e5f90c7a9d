"""Context removability over PAIRED per-item outcomes (docs/method.md section 2, "When Context Returns").

Each record is one held-out item (or game seed) answered by the same trained student twice: without the context
(view x) and with it re-inserted (view x,c). Fields: ``correct_x``, ``correct_xc`` (bool), ``len_x``, ``len_xc``
(response lengths in tokens). Records are mappings or objects with those attributes.

Metrics (point estimates over all N items; indicator sums run over items i):
    Acc_x        = (1/N) Σ 1[x_i right]
    Acc_xc       = (1/N) Σ 1[xc_i right]
    Harm         = P(wrong with c | right without c) = Σ 1[x_i right ∧ xc_i wrong] / Σ 1[x_i right]
    Help         = P(right with c | wrong without c) = Σ 1[x_i wrong ∧ xc_i right] / Σ 1[x_i wrong]
    BothCorrect  = (1/N) Σ 1[x_i right ∧ xc_i right]
    Δlen         = (mean len_xc − mean len_x) / mean len_x

Undefined values: Harm is None when no item is right without c (``n_right_x == 0``), Help when none is wrong
(``n_wrong_x == 0``), Δlen when mean len_x is 0. Never NaN.

Intervals: paired percentile bootstrap. One set of `n_boot` resamples of the ITEMS (with replacement, seeded) is drawn
and every metric is computed on the same resamples, so the metrics' intervals are mutually consistent. A resample whose
denominator is 0 for a metric (e.g. no item right without c) is skipped for that metric only; the interval is None when
fewer than `MIN_VALID_RESAMPLES` resamples are valid. ``n_boot_valid`` reports how many were used.

Regimes (the paper gives no thresholds; `RegimeThresholds` makes them explicit). With gap = Acc_xc − Acc_x and
thresholds inclusive (a float tolerance of 1e-9 absorbs rounding):
    X  collapsed:             Acc_x ≤ 0.05 AND Acc_xc ≤ 0.05 (`COLLAPSED_MAX`)   (checked first: never "views agree")
    A  context hurts:         gap ≤ −drop_min  OR  Harm ≥ harm_high          (checked first)
    B  context still helps:   gap ≥ +gain_min                                (and not A)
    C  views agree:           otherwise: −drop_min < gap < gain_min and Harm < harm_high (or Harm undefined)
A takes precedence over B and C: a net gain that comes with high harm is still "context hurts" on the items the
student already solved; a model right on almost nothing in either view has no regime to speak of (its Harm rests on
a handful of items) and is X. The four are exhaustive and mutually exclusive by construction. Classification uses point estimates.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from mechopd.core.errors import ConfigError, DataError
from mechopd.core.stats import never_a_point
from mechopd.evaluation.config import EvalConfig, RegimeThresholds  # RegimeThresholds: declared with EvalConfig

METRICS = ("acc_x", "acc_xc", "harm", "help", "both_correct", "delta_len")
FIELDS = ("correct_x", "correct_xc", "len_x", "len_xc")
MIN_VALID_RESAMPLES = 10
RESAMPLE_BLOCK = 256  # resamples drawn per block: bounds memory at RESAMPLE_BLOCK x n_items indices
_TOL = 1e-9
THRESHOLD_KEYS = ("drop_min", "harm_high", "gain_min")
REGIME_NAMES = {"A": "context hurts", "B": "context still helps", "C": "views agree", "X": "collapsed"}
COLLAPSED_MAX = 0.05  # regime X: Acc_x and Acc_xc both at most this (a model right on almost nothing in either view)


THRESHOLDS = RegimeThresholds()  # the defaults (frozen)


# ----------------------------------------------------------------------------------------------------- inputs
def _field(record: Any, key: str, index: int) -> Any:
    if isinstance(record, Mapping):
        if key not in record:
            raise DataError(f"paired record {index}: missing field {key!r} (each record needs {', '.join(FIELDS)})")
        return record[key]
    if not hasattr(record, key):
        raise DataError(f"paired record {index}: missing field {key!r} (each record needs {', '.join(FIELDS)})")
    return getattr(record, key)


def _as_bool(value: Any, key: str, index: int) -> bool:
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise DataError(f"paired record {index}: field {key!r} = {value!r} must be true/false")


def _as_length(value: Any, key: str, index: int) -> float:
    try:
        length = float(value)
    except (TypeError, ValueError):
        length = float("nan")
    if isinstance(value, bool) or not np.isfinite(length) or length < 0:
        raise DataError(f"paired record {index}: field {key!r} = {value!r} must be a finite length >= 0 (tokens)")
    return length


def paired_arrays(records: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Records -> (correct_x [n] bool, correct_xc [n] bool, len_x [n] float, len_xc [n] float); validated."""
    if len(records) == 0:
        raise DataError("no paired records to summarise; evaluate at least one item in both views")
    cx, cxc, lx, lxc = [], [], [], []
    for i, r in enumerate(records):
        cx.append(_as_bool(_field(r, "correct_x", i), "correct_x", i))
        cxc.append(_as_bool(_field(r, "correct_xc", i), "correct_xc", i))
        lx.append(_as_length(_field(r, "len_x", i), "len_x", i))
        lxc.append(_as_length(_field(r, "len_xc", i), "len_xc", i))
    return np.array(cx, bool), np.array(cxc, bool), np.array(lx, float), np.array(lxc, float)


# ---------------------------------------------------------------------------------------------------- metrics
def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with NaN where den == 0 (undefined)."""
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=den != 0)
    return out


def batched_metrics(cx: np.ndarray, cxc: np.ndarray, lx: np.ndarray, lxc: np.ndarray) -> dict[str, np.ndarray]:
    """All metrics for a batch of item sets at once.

    cx, cxc: [B, n] bool (right without / with c); lx, lxc: [B, n] float lengths.
    Returns metric -> [B] float, NaN where undefined (empty conditioning set, zero mean length).
    """
    n = cx.shape[1]
    right_x, right_xc = cx.sum(1), cxc.sum(1)  # [B]
    harmed = (cx & ~cxc).sum(1)  # right without c, wrong with c
    helped = (~cx & cxc).sum(1)  # wrong without c, right with c
    mean_lx, mean_lxc = lx.mean(1), lxc.mean(1)
    return {
        "acc_x": right_x / n,
        "acc_xc": right_xc / n,
        "harm": _ratio(harmed.astype(float), right_x.astype(float)),
        "help": _ratio(helped.astype(float), (n - right_x).astype(float)),
        "both_correct": (cx & cxc).sum(1) / n,
        "delta_len": _ratio(mean_lxc - mean_lx, mean_lx),
    }


def resample_blocks(n_items: int, n_boot: int, seed: int) -> Iterator[np.ndarray]:
    """Bootstrap resamples of item indices, [block, n_items] int per block, `n_boot` rows in all.

    Deterministic for (n_items, n_boot, seed): blocks of `RESAMPLE_BLOCK` rows drawn in order from one
    ``np.random.default_rng(seed)``.
    """
    rng = np.random.default_rng(seed)
    for start in range(0, n_boot, RESAMPLE_BLOCK):
        rows = min(RESAMPLE_BLOCK, n_boot - start)
        yield rng.integers(0, n_items, size=(rows, n_items))


def bootstrap_distributions(arrays: tuple[np.ndarray, ...], n_boot: int, seed: int) -> dict[str, np.ndarray]:
    """Metric -> [n_boot] values over the SAME item resamples for every metric (NaN where undefined)."""
    cx, cxc, lx, lxc = arrays
    parts: dict[str, list[np.ndarray]] = {m: [] for m in METRICS}
    for idx in resample_blocks(len(cx), n_boot, seed):  # idx: [block, n]
        for name, values in batched_metrics(cx[idx], cxc[idx], lx[idx], lxc[idx]).items():
            parts[name].append(values)
    return {m: (np.concatenate(v) if v else np.empty(0)) for m, v in parts.items()}


def _interval(values: np.ndarray, ci: float) -> tuple[float | None, float | None, int]:
    valid = values[np.isfinite(values)]
    if len(valid) < MIN_VALID_RESAMPLES:
        return None, None, int(len(valid))
    lo, hi = np.quantile(valid, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return float(lo), float(hi), int(len(valid))


# ---------------------------------------------------------------------------------------------------- regimes
def classify_regime(
    acc_x: float, acc_xc: float, harm: float | None, thresholds: RegimeThresholds = THRESHOLDS
) -> tuple[str, str]:
    """(regime letter, human reason with the deciding numbers); rule in the module docstring."""
    t = thresholds
    gap = acc_xc - acc_x
    harm_txt = "undefined (no item right without c)" if harm is None else f"{harm:.3f}"
    if acc_x <= COLLAPSED_MAX + _TOL and acc_xc <= COLLAPSED_MAX + _TOL:
        return "X", (
            f"X ({REGIME_NAMES['X']}): Acc_x {acc_x:.3f} and Acc_xc {acc_xc:.3f} both ≤ {COLLAPSED_MAX} "
            f"(Acc_xc − Acc_x = {gap:+.3f}; harm {harm_txt} rests on "
            f"{'no' if harm is None else 'a handful of'} items)"
        )
    if gap <= -t.drop_min + _TOL:
        return "A", (
            f"A ({REGIME_NAMES['A']}): Acc_xc − Acc_x = {gap:+.3f} ≤ −drop_min = {-t.drop_min:+.3f} "
            f"(Acc_x {acc_x:.3f}, Acc_xc {acc_xc:.3f}; harm {harm_txt})"
        )
    if harm is not None and harm >= t.harm_high - _TOL:
        return "A", (
            f"A ({REGIME_NAMES['A']}): harm = {harm:.3f} ≥ harm_high = {t.harm_high:.3f} "
            f"although Acc_xc − Acc_x = {gap:+.3f}"
        )
    if gap >= t.gain_min - _TOL:
        return "B", (
            f"B ({REGIME_NAMES['B']}): Acc_xc − Acc_x = {gap:+.3f} ≥ gain_min = {t.gain_min:.3f} "
            f"and harm {harm_txt} < harm_high = {t.harm_high:.3f}"
        )
    return "C", (
        f"C ({REGIME_NAMES['C']}): −drop_min = {-t.drop_min:+.3f} < Acc_xc − Acc_x = {gap:+.3f} "
        f"< gain_min = {t.gain_min:.3f} and harm {harm_txt} < harm_high = {t.harm_high:.3f}"
    )


# ---------------------------------------------------------------------------------------------------- summary
def summarize(
    records: Sequence[Any],
    n_boot: int = EvalConfig.n_boot,
    seed: int = EvalConfig.seed,
    ci: float = 0.95,
    thresholds: RegimeThresholds = THRESHOLDS,
) -> dict:
    """Removability summary of paired outcomes (JSON-serialisable).

    Returns ``{metric: {"value", "low", "high", "n_boot_valid"}}`` for each of `METRICS` (value / bounds None when
    undefined), plus ``n``, ``n_right_x``, ``n_wrong_x``, ``regime`` ("A" | "B" | "C" | "X"), ``regime_reason``,
    ``thresholds`` (dict) and ``bootstrap`` ({"n_boot", "seed", "ci", "method"}).
    """
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 0:
        raise ConfigError(f"n_boot={n_boot!r} must be an integer >= 0 (0 skips the intervals)")
    if not 0.0 < ci < 1.0:
        raise ConfigError(f"ci={ci!r} must lie strictly between 0 and 1 (e.g. 0.95)")
    arrays = paired_arrays(records)
    point = {m: float(v[0]) for m, v in batched_metrics(*(a[None, :] for a in arrays)).items()}
    boots = bootstrap_distributions(arrays, int(n_boot), seed)
    out: dict[str, Any] = {}
    for name in METRICS:
        value = point[name] if np.isfinite(point[name]) else None
        lo, hi, valid = _interval(boots[name], ci) if value is not None else (None, None, 0)
        out[name] = {"value": value, "low": lo, "high": hi, "n_boot_valid": valid}
    n_right = int(arrays[0].sum())
    units = {"harm": n_right, "help": len(arrays[0]) - n_right}  # a proportion's informative units; else every item
    for name in ("acc_x", "acc_xc", "harm", "help", "both_correct"):  # never a zero-width interval (#53)
        e = out[name]
        e["low"], e["high"] = never_a_point(e["value"], e["low"], e["high"], units.get(name, len(arrays[0])), ci)
    d = out["delta_len"]  # no item changes its length between the views: no interval, not a point
    if d["low"] is not None and d["high"] - d["low"] <= 1e-12:
        d["low"] = d["high"] = None
    regime, reason = classify_regime(point["acc_x"], point["acc_xc"], out["harm"]["value"], thresholds)
    out.update(
        n=len(arrays[0]),
        n_right_x=n_right,
        n_wrong_x=len(arrays[0]) - n_right,
        regime=regime,
        regime_reason=reason,
        thresholds=asdict(thresholds),
        bootstrap={"n_boot": int(n_boot), "seed": seed, "ci": ci, "method": "paired percentile, items resampled"},
    )
    return out


# -------------------------------------------------------------------------------------------------- comparison
LABELS = {
    "acc_x": "Acc_x",
    "acc_xc": "Acc_xc",
    "harm": "Harm",
    "help": "Help",
    "both_correct": "BothCorrect",
    "delta_len": "Δlen",
}


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _cell(entry: Mapping[str, Any], signed: bool) -> str:
    text = _fmt(entry["value"], signed)
    if entry["value"] is not None and entry["low"] is not None:
        text += f" [{_fmt(entry['low'], signed)}, {_fmt(entry['high'], signed)}]"
    return text


def _check_summary(name: str, summary: Mapping[str, Any]) -> None:
    for key in (*METRICS, "n", "regime", "thresholds"):
        if key not in summary:
            raise DataError(f"compare_table: summary {name!r} lacks {key!r}; pass dicts returned by summarize()")


def compare_table(named_summaries: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """Models side by side: (markdown, csv). Rows = models in the given order; columns = n, each metric with its
    interval, regime. Markdown cells read ``value [low, high]`` (3 decimals, Δlen signed; "n/a" when undefined); the
    CSV has ``<metric>``, ``<metric>_ci_low``, ``<metric>_ci_high`` columns (empty when undefined), ``regime`` and
    ``threshold_<name>`` columns."""
    if not named_summaries:
        raise ConfigError("compare_table: no summaries given; pass {model_name: summarize(...)}")
    for name, summary in named_summaries.items():
        _check_summary(name, summary)
    follow = any("follow_other" in s for s in named_summaries.values())
    header = ["model", "n", *(LABELS[m] for m in METRICS), *(FOLLOW_LABELS if follow else ()), "regime"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 2) + [":---:"]) + "|"]
    for name, s in named_summaries.items():
        cells = [str(name).replace("|", "\\|"), str(s["n"])]
        cells += [_cell(s[m], signed=m == "delta_len") for m in METRICS]
        cells += _follow_cells(s) if follow else []
        lines.append("| " + " | ".join(cells + [_regime_cell(s)]) + " |")
    intervals = {s.get("bootstrap", {}).get("ci") for s in named_summaries.values()} - {None}
    note = f"Intervals: {'/'.join(f'{c:.0%}' for c in sorted(intervals)) or 'no'} paired bootstrap over items."
    thresholds = {tuple(sorted(s["thresholds"].items())) for s in named_summaries.values()}
    rules = "; ".join(", ".join(f"{k}={v}" for k, v in t) for t in sorted(thresholds))
    lines += ["", f"{note} Regime thresholds: {rules}."]
    return "\n".join(lines) + "\n", _csv(named_summaries)


FOLLOW_LABELS = ("follow_other", "stick", "retention")


def _follow_cells(s: Mapping[str, Any]) -> list[str]:
    """Context-following cells (`mechopd.evaluation.following`): n/a where a model was not measured or has no base."""
    empty = {"value": None, "low": None}
    return [_cell(s.get("follow_other", empty), False), _cell(s.get("stick", empty), False), _fmt(s.get("retention"))]


def _regime_cell(s: Mapping[str, Any]) -> str:
    """The regime letter, qualified ``context-deaf`` when `mechopd.evaluation.following` found the model deaf."""
    return f"{s['regime']}, context-deaf" if s.get("context_deaf") else s["regime"]


def _csv_number(value: float | None) -> str:
    """Full precision (round-trips through float()); empty when undefined."""
    return "" if value is None else repr(float(value))


def _csv(named_summaries: Mapping[str, Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    columns = [c for m in METRICS for c in (m, f"{m}_ci_low", f"{m}_ci_high")]
    follow = any("follow_other" in s for s in named_summaries.values())
    extra = (
        ["follow_other", "follow_other_ci_low", "follow_other_ci_high", "stick", "retention", "context_deaf"]
        if follow
        else []
    )
    writer.writerow(["model", "n", *columns, *extra, "regime", *(f"threshold_{k}" for k in THRESHOLD_KEYS)])
    for name, s in named_summaries.items():
        values = [_csv_number(s[m][k]) for m in METRICS for k in ("value", "low", "high")]
        if follow:
            fo = s.get("follow_other") or {}
            values += [_csv_number(fo.get(k)) for k in ("value", "low", "high")]
            values += [
                _csv_number((s.get("stick") or {}).get("value")),
                _csv_number(s.get("retention")),
                "" if s.get("context_deaf") is None else str(bool(s["context_deaf"])).lower(),
            ]
        writer.writerow([name, s["n"], *values, s["regime"], *(s["thresholds"][k] for k in THRESHOLD_KEYS)])
    return buffer.getvalue()
