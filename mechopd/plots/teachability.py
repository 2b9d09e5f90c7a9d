"""Teachability figure (fig. 7): fixed-context gain by quartile of each pre-update signal, the high-support gain gap
with its bootstrap interval, and the standardized regression of the gain.

Artifact read: ``RUN/probes/teachability_summary.json`` as ``mechopd.probes.teachability.run_teachability`` writes it
(`mechopd.core.artifacts.TeachabilitySummary`, NaN / ±inf as null): ``buckets[signal]`` = four quartile rows with ``n`` and ``mean_<gain>``;
``gap[gain]`` = estimate, ci_low, ci_high, ci, mean_high, mean_low, n_q3; ``regression[gain]`` = coef {H, DL, DI}, r2.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from mechopd.core.errors import ConfigError, DataError
from mechopd.plots._common import missing, new_figure, read_json, run_info, save, styled
from mechopd.plots.registry import register_figure
from mechopd.probes.teachability import TeachabilitySummary
from mechopd.probes.teachability_analysis import BUCKET_SIGNALS, GAINS

NAME = "teachability"
SUMMARY_NAME = TeachabilitySummary.FILE  # the names the probe writes, read from the probe (one schema)
# Plain Unicode, no mathtext: mathtext parsing would cost more than the rest of the figure.
SIGNAL_LABELS = {
    "C_norm": "compatibility C̃",
    "DL": "learnable Dᴸ = D̃·C̃",
    "DI": "incompatible Dᴵ = D̃·(1 − C̃)",
    "kl_full": "raw KL(p_teacher ‖ p_θ₀)",
}
GAIN_UNITS = {"gain_abs": "mean gain KL₀ − KL₁ (nats)", "gain_rel": "mean relative gain (KL₀ − KL₁)/KL₀"}
PREDICTORS = ("H", "DL", "DI")


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def _check(summary: Any, path: Path, gain: str) -> dict[str, Any]:
    if not isinstance(summary, dict):
        raise DataError(f"{path}: expected the object written by mechopd probe teachability")
    for key in ("buckets", "gap", "regression"):
        if not isinstance(summary.get(key), dict):
            raise DataError(f"{path} lacks {key!r}; rewrite it with mechopd probe teachability")
    if gain not in summary["gap"] or gain not in summary["regression"]:
        raise DataError(f"{path} has no {gain!r} analysis (gains: {', '.join(summary['gap'])}); use one of them")
    return summary


def _bars(ax: Axes, labels: list[str], heights: list[float], colour, errors: dict[int, tuple[float, float]]) -> None:
    """One bar container; NaN heights drawn as 0 with 'n/a'; asymmetric error bars at the given indices."""
    xs = np.arange(len(labels))
    ax.bar(xs, [0.0 if math.isnan(h) else h for h in heights], 0.65, color=colour)
    for x, h in zip(xs, heights):
        if math.isnan(h):
            ax.text(float(x), 0, "n/a", ha="center", va="bottom", fontsize="x-small")
    for i, (lo, hi) in errors.items():
        if not (math.isnan(lo) or math.isnan(hi) or math.isnan(heights[i])):
            ax.errorbar(
                [xs[i]],
                [heights[i]],
                yerr=[[max(0.0, heights[i] - lo)], [max(0.0, hi - heights[i])]],
                fmt="none",
                ecolor="0.15",
                capsize=3,
            )
    ax.set_xticks(xs, labels)
    ax.axhline(0.0, color="0.3", linewidth=0.8)


@styled
def figure_teachability(run_dir: Path, gain: str = "gain_abs") -> Figure | None:
    """2 × 3 panels: gain by quartile of C̃, D^L, D^I, raw KL; the Q3 high-support gap; the regression coefficients.

    gain: "gain_abs" (the paper's G_t, default) or "gain_rel" (the released code's). None without the summary.
    """
    if gain not in GAINS:
        raise ConfigError(f"gain={gain!r} is unknown: use one of {', '.join(GAINS)}")
    info = run_info(run_dir)
    path = info.root / "probes" / SUMMARY_NAME
    if not path.is_file():
        missing(NAME, path)
        return None
    s = _check(asdict(TeachabilitySummary.from_dict(read_json(path), str(path))), path, gain)  # the typed schema
    cb = sns.color_palette("colorblind")
    fig = new_figure(11.0, 6.4)
    axes = fig.subplots(2, 3).ravel()
    for ax, signal, colour in zip(axes, BUCKET_SIGNALS, cb):
        rows = sorted(s["buckets"].get(signal) or [], key=lambda r: r["quartile"])
        if len(rows) != 4:
            raise DataError(f"{path}: buckets.{signal} must hold 4 quartile rows, found {len(rows)}")
        _bars(
            ax, [f"Q{r['quartile']}\nn={r['n']}" for r in rows], [_num(r.get(f"mean_{gain}")) for r in rows], colour, {}
        )
        ax.set_title(f"by quartile of {SIGNAL_LABELS.get(signal, signal)}")
        ax.set_xlabel("quartile before the update (Q1 = lowest)")
        ax.set_ylabel(GAIN_UNITS.get(gain, gain))
    gap = s["gap"][gain]
    est, lo, hi = (_num(gap.get(k)) for k in ("estimate", "ci_low", "ci_high"))
    ax = axes[len(BUCKET_SIGNALS)]
    means = [_num(gap.get("mean_low")), _num(gap.get("mean_high")), est]
    _bars(ax, ["low-C\ntercile", "high-C\ntercile", "gap"], means, cb[4], {2: (lo, hi)})
    ci = gap.get("ci")
    ax.set_title(
        f"high-support gain gap (Q3 cell, n = {gap.get('n_q3')} tokens)\n"
        f"{est:+.3g} [{lo:+.3g}, {hi:+.3g}], {'' if ci is None else f'{ci:.0%} '}CI over sequences"
    )
    ax.set_xlabel("C tercile inside Q3 (low entropy, high divergence)")
    ax.set_ylabel(GAIN_UNITS.get(gain, gain))
    reg = s["regression"][gain]
    ax = axes[len(BUCKET_SIGNALS) + 1]
    coef = reg.get("coef") or {}
    _bars(ax, ["H", "Dᴸ", "Dᴵ"], [_num(coef.get(p)) for p in PREDICTORS], cb[5], {})
    ax.set_title(f"regression of the gain, R² = {_num(reg.get('r2')):.3f}")
    ax.set_xlabel("predictor (z-scored, before the update)")
    ax.set_ylabel("standardized coefficient (SD / SD)")
    fig.suptitle(
        f"Teachability: gain on fixed contexts by pre-update signal — {info.task} "
        f"({s.get('n_tokens', '?')} tokens, {s.get('n_sequences', '?')} sequences)"
    )
    return fig


def plot_teachability(run_dir: Path, out_dir: Path) -> list[Path]:
    """Fig. 7 to ``out_dir/teachability.{png,pdf}``; [] without ``RUN/probes/teachability_summary.json``."""
    return save(figure_teachability(run_dir), out_dir, NAME)


# -- this module's figures (`mechopd.plots.registry`)
register_figure(
    "teachability",
    "Teachability of teacher–student disagreement",
    "Fixed-context gain (KL to the teacher before minus after training, same token ids) by quartile of the "
    "pre-update compatibility C̃, learnable D^L, incompatible D^I and raw KL; the high-support gain gap inside "
    "the low-entropy / high-divergence cell with its sequence-bootstrap interval; the standardized regression "
    "coefficients of the gain.",
    plot_teachability,
    group="probe",
    order=40,
)
