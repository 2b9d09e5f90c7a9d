"""Removability figures: metric bars per model (fig. 2) and the regime map (fig. 3).

Artifacts read: ``RUN/eval/<name>.json`` (``{"summary": ...}`` as ``mechopd.evaluation.removability.summarize`` returns it; value,
low, high may be null) for ``base`` and every method of ``RUN/demo.json``; the regime thresholds from ``demo.json``
(else from the first report's ``summary.thresholds``, else the `RegimeThresholds` defaults).

Regime map axes: x = accuracy drop Acc_x − Acc_xc (positive: the context hurts), y = Harm, both in percent. The regions
follow ``mechopd.evaluation.removability.classify_regime`` exactly: A where drop ≥ drop_min or Harm ≥ harm_high; B where
drop ≤ −gain_min and Harm < harm_high; C in between. A model whose Harm is undefined (no item right without c) has
no place on the map and is left out (logged).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from mechopd.core.errors import ConfigError, DataError
from mechopd.evaluation.removability import REGIME_NAMES, THRESHOLD_KEYS, RegimeThresholds
from mechopd.plots._common import (
    RunInfo,
    eval_summaries,
    fitted_legend,
    label_bars,
    log,
    missing,
    new_figure,
    palette,
    percent,
    run_info,
    save,
    styled,
)
from mechopd.plots.registry import register_figure
from mechopd.runset import RunSet

BARS_NAME = "removability"
REGIME_NAME = "regime_map"
BAR_METRICS = (("acc_x", "Acc_x"), ("acc_xc", "Acc_xc"), ("harm", "Harm"), ("both_correct", "BothCorrect"))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


# ------------------------------------------------------------------------------------------------------ fig. 2 bars
def _interval(entry: dict[str, Any]) -> tuple[float, float, float] | None:
    """(value, minus, plus) in % for an error bar, or None when the value or a bound is null."""
    if any(entry.get(k) is None for k in ("value", "low", "high")):
        return None
    v, lo, hi = (percent(entry[k]) for k in ("value", "low", "high"))
    return v, max(0.0, v - lo), max(0.0, hi - v)


def _bars(ax: Axes, xs: np.ndarray, entries: list[dict[str, Any]], width: float, colour, label: str | None) -> None:
    """One bar container for one model (undefined values: height 0 and 'n/a'; zero: '0'), error bars where an interval
    exists."""
    heights = [percent(e["value"]) for e in entries]
    ax.bar(xs, [0.0 if np.isnan(h) else h for h in heights], width, color=colour, label=label)
    label_bars(ax, list(xs), heights)
    bars = [(x, iv) for x, e in zip(xs, entries) if (iv := _interval(e)) is not None]
    if bars:
        ax.errorbar(
            [x for x, _ in bars],
            [v for _, (v, _, _) in bars],
            yerr=[[m for _, (_, m, _) in bars], [p for _, (_, _, p) in bars]],
            fmt="none",
            ecolor="0.15",
            elinewidth=1,
            capsize=2,
        )


def _ci_text(summaries: dict[str, dict[str, Any]]) -> str:
    levels = {s.get("bootstrap", {}).get("ci") for s in summaries.values()} - {None}
    return f"{'/'.join(f'{c:.0%}' for c in sorted(levels))} paired bootstrap intervals" if levels else "no intervals"


@styled
def figure_removability(run_dir: Path) -> Figure | None:
    """Acc_x, Acc_xc, Harm, BothCorrect (left, %) and Δlen (right, own axis) per model with their intervals.

    One bar container per model on each axis. None (logged) when no ``eval/<name>.json`` exists.
    """
    info = run_info(run_dir)
    summaries = eval_summaries(info)
    if not summaries:
        missing(BARS_NAME, info.root / "eval" / "<model>.json")
        return None
    colours = palette(info.models)
    names = list(summaries)
    fig = new_figure(9.0, 4.2)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [4, 1.4]})
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        s = summaries[name]
        offset = (k - (len(names) - 1) / 2) * width
        label = f"{info.label(name)} ({s['regime']})" if "regime" in s else info.label(name)
        _bars(left, np.arange(len(BAR_METRICS)) + offset, [s[m] for m, _ in BAR_METRICS], width, colours[name], label)
        _bars(right, np.array([k]), [s["delta_len"]], 0.7, colours[name], None)
    for ax in (left, right):
        ax.grid(axis="x", visible=False)
    left.set_xticks(np.arange(len(BAR_METRICS)), [t for _, t in BAR_METRICS])
    left.set_ylabel("% of held-out items")
    left.set_ylim(0.0, 105.0)  # shares: the whole range (error bars stay inside [0, 100])
    left.set_xlabel("metric (Harm: % of items right without c that turn wrong with c)")
    fitted_legend(fig, min(4, len(names)), loc="outside lower center", title="model (regime)")
    right.axhline(0.0, color="0.3", linewidth=0.8)
    right.set_xticks(np.arange(len(names)), [""] * len(names))  # long labels would crowd the panel: the legend
    right.set_xlabel("model (colours and order\nas in the legend)")  # names the bars
    right.set_ylabel("Δlen (% of the\nno-context length)")
    right.set_title("Δlen with c")
    n_items = sorted({s["n"] for s in summaries.values() if s.get("n") is not None})
    fig.suptitle(f"Context removability — {info.task} (n = {'/'.join(map(str, n_items))} items, {_ci_text(summaries)})")
    return fig


def plot_removability(run_dir: Path, out_dir: Path) -> list[Path]:
    """Fig. 2 to ``out_dir/removability.{png,pdf}``; [] without any ``RUN/eval/<name>.json``."""
    return save(figure_removability(run_dir), out_dir, BARS_NAME)


# ------------------------------------------------------------------------------------------------ fig. 3 regime map
def thresholds_of(info: RunInfo, summaries: dict[str, dict[str, Any]]) -> RegimeThresholds:
    """demo.json's thresholds, else the first report's, else the defaults; DataError when a value is malformed."""
    source, raw = info.root / "demo.json", info.thresholds
    if raw is None:
        first = next((s["thresholds"] for s in summaries.values() if isinstance(s.get("thresholds"), dict)), None)
        source, raw = info.root / "eval", first
    if raw is None:
        return RegimeThresholds()
    try:
        return RegimeThresholds(**{k: float(raw[k]) for k in THRESHOLD_KEYS if k in raw})
    except (TypeError, ValueError, ConfigError) as err:
        raise DataError(f"{source}: regime thresholds {raw!r} are invalid ({err}); use proportions in [0, 1]") from None


def _regions(ax: Axes, t: RegimeThresholds, xlim: tuple[float, float], ylim: tuple[float, float]) -> None:
    """Shade A / B / C (in %) inside the given limits and name them."""
    (x0, x1), (y0, y1) = xlim, ylim
    drop, harm, gain = 100 * t.drop_min, 100 * t.harm_high, 100 * t.gain_min
    cb = sns.color_palette("colorblind")
    boxes = {
        "A": [(drop, y0, x1 - drop, y1 - y0), (x0, harm, drop - x0, y1 - harm)],
        "B": [(x0, y0, -gain - x0, harm - y0)],
        "C": [(-gain, y0, gain + drop, harm - y0)],
    }
    tint = {"A": cb[3], "B": cb[0], "C": cb[2]}
    for regime, rects in boxes.items():
        for x, y, w, h in rects:
            ax.add_patch(Rectangle((x, y), w, h, facecolor=tint[regime], alpha=0.12, edgecolor="none", zorder=0))
    low = y0 + 0.04 * (y1 - y0)
    anchors = {
        "A": (x1 - 0.02 * (x1 - x0), y1 - 0.04 * (y1 - y0), "right", "top"),
        "B": ((x0 - gain) / 2, low, "center", "bottom"),
        "C": ((drop - gain) / 2, low, "center", "bottom"),
    }
    for regime, (x, y, ha, va) in anchors.items():  # the letter only (B and C can be narrow); the title names them
        ax.text(x, y, regime, ha=ha, va=va, fontsize="small", fontweight="bold", color="0.25", zorder=1)


def _limits(values: list[float], must: list[float]) -> tuple[float, float]:
    """Axis limits covering the values and the thresholds, with a margin (units: %)."""
    lo, hi = min(values + must), max(values + must)
    pad = max(2.0, 0.12 * (hi - lo))
    return lo - pad, hi + pad


def _points(run_dirs: Sequence[Path]) -> tuple[list[dict[str, Any]], list[RunInfo], list[dict[str, dict]]]:
    infos = [run_info(d) for d in run_dirs]
    all_summaries = [eval_summaries(info) for info in infos]
    points = []
    for info, summaries in zip(infos, all_summaries):
        for name, s in summaries.items():
            acc_x, acc_xc, harm = (s[k]["value"] for k in ("acc_x", "acc_xc", "harm"))
            if acc_x is None or acc_xc is None or harm is None:
                log.info("figure %s: %s of %s left out (Harm or accuracy undefined)", REGIME_NAME, name, info.root)
                continue
            points.append(
                {
                    "task": info.task,
                    "model": name,
                    "label": info.label(name),
                    "x": percent(acc_x - acc_xc),
                    "y": percent(harm),
                    "interval": _interval(s["harm"]),
                    "regime": s.get("regime"),
                }
            )
    return points, infos, all_summaries


@styled
def figure_regime_map(run_dirs: Path | Sequence[Path]) -> Figure | None:
    """Accuracy drop against Harm, one point per (task, model) over all runs; regions A/B/C shaded.

    One scatter (PathCollection) per point; colour = model, marker = task. None (logged) when no run has a report
    with a defined Harm.
    """
    run_dirs = [run_dirs] if isinstance(run_dirs, (str, Path, RunSet)) else list(run_dirs)
    points, infos, all_summaries = _points(run_dirs)
    if not points:
        first = (run_dirs[0].root if isinstance(run_dirs[0], RunSet) else run_dirs[0]) if run_dirs else "."
        missing(REGIME_NAME, Path(first) / "eval" / "<model>.json (with a defined Harm)")
        return None
    t = _shared_thresholds(infos, all_summaries)
    names = list(dict.fromkeys(m for info in infos for m in info.models))
    colours = palette(names + [p["model"] for p in points])
    tasks = list(dict.fromkeys(p["task"] for p in points))
    marker = {task: MARKERS[i % len(MARKERS)] for i, task in enumerate(tasks)}
    fig = new_figure(7.0, 5.6)
    ax = fig.add_subplot()
    xlim = _limits([p["x"] for p in points], [-100 * t.gain_min, 100 * t.drop_min])
    ytop = _limits([p["y"] + (p["interval"][2] if p["interval"] else 0) for p in points], [100 * t.harm_high])[1]
    ylim = (-0.02 * ytop, ytop)  # Harm is a proportion: nothing below 0
    _regions(ax, t, xlim, ylim)
    _scatter(ax, points, colours, marker)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axvline(0.0, color="0.4", linewidth=0.7, linestyle=":")
    ax.set_xlabel("accuracy drop with context, Acc_x − Acc_xc (percentage points)")
    ax.set_ylabel("Harm = P(wrong with c | right without c) (%)")
    key = " · ".join(f"{r}: {REGIME_NAMES[r]}" for r in REGIME_NAMES)
    fig.suptitle(f"Removability regimes\n{key}", fontsize="medium")  # two lines: the key never outgrows the figure
    ax.set_title(
        f"thresholds: drop_min {t.drop_min:g}, harm_high {t.harm_high:g}, gain_min {t.gain_min:g}", fontsize="small"
    )
    _legends(fig, points, colours, marker, tasks)
    return fig


def _shared_thresholds(infos: list[RunInfo], all_summaries: list[dict[str, dict]]) -> RegimeThresholds:
    """The first run's regime thresholds (the regions drawn); another run's that differ are logged."""
    t = thresholds_of(infos[0], all_summaries[0])
    for info, summaries in zip(infos[1:], all_summaries[1:]):
        if thresholds_of(info, summaries) != t:
            log.warning(
                "figure %s: %s uses other regime thresholds than %s; regions drawn with the latter's",
                REGIME_NAME,
                info.root,
                infos[0].root,
            )
    return t


def _scatter(ax: Axes, points: list[dict[str, Any]], colours: dict[str, Any], marker: dict[str, str]) -> None:
    """One point per (task, model) with its Harm interval as a vertical bar."""
    for p in points:
        if p["interval"] is not None:
            _, minus, plus = p["interval"]
            ax.errorbar(
                [p["x"]],
                [p["y"]],
                yerr=[[minus], [plus]],
                fmt="none",
                ecolor=colours[p["model"]],
                elinewidth=1,
                alpha=0.7,
                zorder=2,
            )
        ax.scatter(
            [p["x"]],
            [p["y"]],
            s=55,
            color=colours[p["model"]],
            marker=marker[p["task"]],
            edgecolor="black",
            linewidth=0.5,
            zorder=3,
        )


def _legends(
    fig: Figure, points: list[dict[str, Any]], colours: dict[str, Any], marker: dict[str, str], tasks: list[str]
) -> None:
    """The models' legend below the plot; the tasks' (markers) beside it when there are several."""
    labels = {p["model"]: p["label"] for p in points}
    handles = [Line2D([], [], linestyle="none", marker="o", color=colours[m], label=lab) for m, lab in labels.items()]
    fitted_legend(fig, 3, handles=handles, title="model", loc="outside lower center")  # below: the plot keeps the width
    if len(tasks) > 1:  # short names: beside the plot
        fig.legend(
            handles=[Line2D([], [], linestyle="none", marker=marker[task], color="0.3", label=task) for task in tasks],
            title="task",
            loc="outside right lower",
        )


def plot_regime_map(run_dirs: Path | Sequence[Path], out_dir: Path) -> list[Path]:
    """Fig. 3 to ``out_dir/regime_map.{png,pdf}`` from one run dir or several; [] when no point can be placed."""
    return save(figure_regime_map(run_dirs), out_dir, REGIME_NAME)


# -- this module's figures (`mechopd.plots.registry`)
register_figure(
    "removability",
    "Context removability per model",
    "Acc_x, Acc_xc, Harm = P(wrong with c | right without c) and BothCorrect per model (left, % of "
    "held-out items) and the relative response-length change Δlen with the context (right). Error bars: "
    "paired bootstrap intervals over items; none where a metric or its interval is undefined.",
    plot_removability,
    group="run",
    order=30,
)
register_figure(
    "regime_map",
    "Removability regimes",
    "Each point is one (task, model): accuracy drop with the context (Acc_x − Acc_xc) against Harm, "
    "vertical bars the Harm interval. Shaded regions: A context hurts (drop ≥ drop_min or Harm ≥ "
    "harm_high), B context still helps (gain ≥ gain_min), C views agree; thresholds from the run's "
    "demo.json.",
    plot_regime_map,
    group="run",
    order=40,
)
