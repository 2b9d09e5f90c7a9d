"""Figures over training: accuracy curves without / with the context (fig. 1), and the TA-OPD budget sweep (fig. 8).

Artifacts read:
  ``RUN/train/<method>/metrics.jsonl``  evaluation lines carry ``eval/acc_x`` and ``eval/acc_xc`` (null when
                                        undefined; step 0 = before training). A step logged twice (a resumed run)
                                        keeps its last value.
  ``RUN/sweep/sweep.json``              ``{"rows": [{"selector", "budget", "acc_x", ...}, ...]}``; budget ρ in (0, 1].
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure

from mechopd.errors import DataError
from mechopd.plots._common import (log, missing, new_figure, palette, percent, read_json, read_jsonl, run_info, save,
                                   styled)

TRAINING_NAME = "training_curves"
BUDGET_NAME = "budget_curve"
VIEWS = (("eval/acc_x", "without context", "-"), ("eval/acc_xc", "with context", "--"))


# ------------------------------------------------------------------------------------------------ training curves
def eval_points(path: Path) -> dict[str, tuple[list[int], list[float]]]:
    """``eval/acc_x`` and ``eval/acc_xc`` of one metrics.jsonl: key -> (steps, values in %), steps ascending.

    Null values (undefined) are dropped; a step logged twice keeps its last value.
    """
    by_step: dict[str, dict[int, float]] = {key: {} for key, _, _ in VIEWS}
    for i, rec in enumerate(read_jsonl(path), 1):
        for key in by_step:
            if rec.get(key) is None:
                continue
            if "step" not in rec:
                raise DataError(f"{path} line {i}: has {key!r} but no 'step'; every metrics line needs a step")
            value = percent(rec[key])
            if math.isfinite(value):
                by_step[key][int(rec["step"])] = value
    return {key: (sorted(d), [d[s] for s in sorted(d)]) for key, d in by_step.items()}


@styled
def figure_training_curves(run_dir: Path) -> Figure | None:
    """Accuracy over training steps, one colour per method; solid = without context, dashed = with it.

    Returns None (and logs why) when no method has evaluation points.
    """
    info = run_info(run_dir)
    curves = {}
    for method in info.methods:
        path = info.root / "train" / method / "metrics.jsonl"
        if not path.is_file():
            log.info("figure %s: %s not found; method %s left out", TRAINING_NAME, path, method)
            continue
        points = eval_points(path)
        if any(steps for steps, _ in points.values()):
            curves[method] = points
        else:
            log.info("figure %s: %s has no eval/acc_x or eval/acc_xc values; method %s left out",
                     TRAINING_NAME, path, method)
    if not curves:
        missing(TRAINING_NAME, info.root / "train" / "<method>" / "metrics.jsonl (with eval/acc_x)")
        return None
    colours = palette(info.models)
    fig = new_figure(7.0, 4.2)
    ax = fig.add_subplot()
    for method, points in curves.items():
        for key, view, dash in VIEWS:
            steps, values = points[key]
            if steps:
                ax.plot(steps, values, linestyle=dash, marker="o", markersize=3.5, color=colours[method],
                        label=f"{info.label(method)}, {view}")
    ax.set_xlabel("training step (optimizer steps)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(f"Accuracy without (solid) and with (dashed) the context — {info.task}")
    fig.legend(loc="outside right upper", title="method, view")
    return fig


def plot_training_curves(run_dir: Path, out_dir: Path) -> list[Path]:
    """Fig. 1 to ``out_dir/training_curves.{png,pdf}``; [] when no metrics.jsonl has evaluation points."""
    return save(figure_training_curves(run_dir), out_dir, TRAINING_NAME)


# ------------------------------------------------------------------------------------------------- budget sweep
def sweep_curves(path: Path) -> dict[str, tuple[list[float], list[float]]]:
    """selector -> (budgets in %, no-context accuracy in %), budgets ascending, null accuracies dropped."""
    data = read_json(path)
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise DataError(f"{path}: expected {{\"rows\": [{{\"selector\", \"budget\", \"acc_x\"}}, ...]}}")
    curves: dict[str, dict[float, float]] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or any(k not in row for k in ("selector", "budget", "acc_x")):
            raise DataError(f"{path}: rows[{i}] needs 'selector', 'budget' and 'acc_x'")
        if row["acc_x"] is None:
            continue
        curves.setdefault(str(row["selector"]), {})[percent(row["budget"])] = percent(row["acc_x"])
    return {sel: (sorted(d), [d[b] for b in sorted(d)]) for sel, d in curves.items()}


@styled
def figure_budget_curve(run_dir: Path) -> Figure | None:
    """Final no-context accuracy against the TA-OPD budget ρ, one line per selector. None without sweep.json."""
    info = run_info(run_dir)
    path = info.root / "sweep" / "sweep.json"
    if not path.is_file():
        missing(BUDGET_NAME, path)
        return None
    curves = sweep_curves(path)
    if not curves:
        log.info("figure %s skipped: %s has no row with a no-context accuracy", BUDGET_NAME, path)
        return None
    colours = palette(info.models + list(curves))
    fig = new_figure(6.0, 4.0)
    ax = fig.add_subplot()
    for selector, (budgets, acc) in curves.items():
        ax.plot(budgets, acc, marker="o", color=colours[selector], label=info.label(selector))
    ticks = sorted({b for budgets, _ in curves.values() for b in budgets})
    ax.set_xticks(ticks, [f"{b:g}" for b in ticks])
    ax.set_xlabel("token budget ρ (% of response positions trained on)")
    ax.set_ylabel("final accuracy without context (%)")
    ax.set_title(f"TA-OPD budget sweep — {info.task}")
    fig.legend(loc="outside right upper", title="selector")
    return fig


def plot_budget_curve(run_dir: Path, out_dir: Path) -> list[Path]:
    """Fig. 8 to ``out_dir/budget_curve.{png,pdf}``; [] without ``RUN/sweep/sweep.json``."""
    return save(figure_budget_curve(run_dir), out_dir, BUDGET_NAME)
