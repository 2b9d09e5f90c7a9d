"""Figures over training: accuracy curves without / with the context (fig. 1), gradient alignment of the loss terms
over training, and the TA-OPD budget sweep (fig. 8).

Artifacts read:
  ``RUN/train/<method>/metrics.jsonl``  evaluation lines carry ``eval/acc_x`` and ``eval/acc_xc`` (null when
                                        undefined; step 0 = before training). A step logged twice (a resumed run)
                                        keeps its last value. Gradient-statistics steps carry ``grad/cos/<a>__<b>``
                                        (global cosine of the two terms' gradients) and ``grad/norm/<term>``.
  ``RUN/demo.json`` ``seed_runs``       an aggregate directory: the curves are the mean over these seed runs at the
                                        steps every run logged, with a 95 % Student-t band over seeds.
  ``RUN/sweep/sweep.json``              ``{"rows": [{"selector", "budget", "acc_x", ...}, ...]}``; budget ρ in (0, 1].
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.transforms import ScaledTranslation

from mechopd.core.errors import DataError
from mechopd.core.stats import seed_stat
from mechopd.plots._common import (
    fitted_legend,
    log,
    missing,
    new_figure,
    palette,
    percent,
    read_json,
    read_jsonl,
    run_info,
    save,
    styled,
)
from mechopd.plots.registry import register_figure

TRAINING_NAME = "training_curves"
GRAD_TRAINING_NAME = "gradient_training"
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


def seed_runs(run_dir: Path) -> list[Path]:
    """The seed runs an aggregate directory's demo.json lists (``seed_runs``), else ``[run_dir]``."""
    meta = Path(run_dir) / "demo.json"
    runs = (read_json(meta) or {}).get("seed_runs") if meta.is_file() else None
    return [Path(r) for r in runs] if runs else [Path(run_dir)]


Band = tuple[list[int], list[float], list[float], list[float]]  # steps, mean, low, high (low/high NaN: no band)


def seed_band(
    series: list[tuple[list[int], list[float]]], lo: float = -math.inf, hi: float = math.inf, log_scale: bool = False
) -> Band:
    """Mean and 95 % t-interval over seeds at the steps every series has (one series: no band). The band is clipped
    to the quantity's range [lo, hi] (a t-interval of a proportion over 3 seeds can leave it); ``log_scale``: mean and
    interval of log10(value), i.e. the geometric mean (for positive ratios)."""
    common = sorted(set.intersection(*(set(steps) for steps, _ in series))) if series else []
    maps = [dict(zip(steps, vals)) for steps, vals in series]
    f, inv = (math.log10, lambda v: 10.0**v) if log_scale else (float, float)
    stats = [seed_stat([f(m[s]) if not log_scale or m[s] > 0 else None for m in maps]) for s in common]
    clip = lambda v: math.nan if v is None else min(hi, max(lo, inv(v)))  # noqa: E731
    return (
        common,
        [clip(st["mean"]) for st in stats],
        [clip(st["low"]) for st in stats],
        [clip(st["high"]) for st in stats],
    )


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DODGE_PT = 2.0  # points between neighbouring methods' curves (display only: the data stay the logged values)


def dodge(ax, k: int, n: int) -> Any:
    """``ax.transData`` shifted by (k − (n−1)/2) · DODGE_PT points right and up: curves with equal values (two methods
    both at 100 %) are drawn side by side instead of one over the other."""
    d = (k - (n - 1) / 2) * DODGE_PT / 72.0
    return ax.transData + ScaledTranslation(d, d, ax.figure.dpi_scale_trans)


def _draw_band(ax, band: Band, colour, label: str, dash: str = "-", marker: str = "o", transform: Any = None) -> None:
    """The mean (markers at the logged steps) and, over seeds, a light band outlined in the line's own style."""
    steps, mean, low, high = band
    kw = {"transform": transform} if transform is not None else {}
    ax.plot(steps, mean, linestyle=dash, marker=marker, markersize=3.5, color=colour, label=label, **kw)
    if any(math.isfinite(v) for v in low):
        ax.fill_between(steps, low, high, color=colour, alpha=0.07, linewidth=0, **kw)
        for edge in (low, high):
            ax.plot(steps, edge, linestyle=dash, linewidth=0.6, alpha=0.6, color=colour, label="_band edge", **kw)


def _method_curves(runs: list[Path], method: str) -> dict[str, Band] | None:
    per_run = []
    for run in runs:
        path = run / "train" / method / "metrics.jsonl"
        if not path.is_file():
            log.info("figure %s: %s not found; method %s left out", TRAINING_NAME, path, method)
            return None
        per_run.append(eval_points(path))
    bands = {key: seed_band([p[key] for p in per_run], 0.0, 100.0) for key, _, _ in VIEWS}
    if not any(b[0] for b in bands.values()):
        log.info("figure %s: no eval/acc_x or eval/acc_xc values for method %s; left out", TRAINING_NAME, method)
        return None
    return bands


@styled
def figure_training_curves(run_dir: Path) -> Figure | None:
    """Accuracy over training steps, one colour per method; solid = without context, dashed = with it. An aggregate
    directory draws the mean over its seed runs with a 95 % t band.

    Returns None (and logs why) when no method has evaluation points.
    """
    info = run_info(run_dir)
    runs = seed_runs(info.root)
    curves = {m: c for m in info.methods if (c := _method_curves(runs, m)) is not None}
    if not curves:
        missing(TRAINING_NAME, info.root / "train" / "<method>" / "metrics.jsonl (with eval/acc_x)")
        return None
    colours = palette(info.models)
    fig = new_figure(7.0, 4.6)
    ax = fig.add_subplot()
    for k, (method, bands) in enumerate(curves.items()):
        shift = dodge(ax, k, len(curves))
        for key, view, dash in VIEWS:
            if bands[key][0]:
                _draw_band(
                    ax,
                    bands[key],
                    colours[method],
                    f"{info.label(method)}, {view}",
                    dash,
                    MARKERS[k % len(MARKERS)],
                    shift,
                )
    steps = [x for bands in curves.values() for b in bands.values() for x in b[0]]  # a shifted transform does not
    pad = 0.04 * max(1, max(steps) - min(steps))  # update the data limits: set them from the logged steps
    ax.set_xlim(min(steps) - pad, max(steps) + pad)
    ax.set_xlabel(f"training step (optimizer steps; methods drawn {DODGE_PT:g} pt apart so equal curves stay visible)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_ylim(-5.0, 105.0)  # the whole range (runs compare at a glance), with room for the dodged curves at 0 and 100
    seeds = f", {len(runs)} seeds" if len(runs) > 1 else ""
    ax.set_title(f"Accuracy without (solid) / with (dashed) the context — {info.task}{seeds}")
    handles, labels = ax.get_legend_handles_labels()  # band edges ("_band edge") are not listed
    fitted_legend(fig, 2, handles=handles, labels=labels, loc="outside lower center", title="method, view")
    return fig


# ------------------------------------------------------------------------------------ gradient alignment over steps
def grad_series(path: Path) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """``"<a>__<b>"`` -> (steps, cos(∇a, ∇b), ‖∇a‖/‖∇b‖) from the gradient-statistics lines of a metrics.jsonl."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for rec in read_jsonl(path):
        for key, cos in rec.items():
            if not key.startswith("grad/cos/") or cos is None:
                continue
            pair = key[len("grad/cos/") :]
            a, _, b = pair.partition("__")
            na, nb = rec.get(f"grad/norm/{a}"), rec.get(f"grad/norm/{b}")
            ratio = float(na) / float(nb) if na is not None and nb else math.nan
            out.setdefault(pair, {})[int(rec["step"])] = (float(cos), ratio)
    return {p: (sorted(d), [d[s][0] for s in sorted(d)], [d[s][1] for s in sorted(d)]) for p, d in out.items()}


@styled
def figure_gradient_training(run_dir: Path) -> Figure | None:
    """cos(∇a, ∇b) (left) and ‖∇a‖/‖∇b‖ (right, log scale) against the training step, one line per run and term
    pair; an aggregate directory draws the seed mean (the ratio: geometric mean) with a 95 % t band. A step where a
    term's weight is 0 (NCA before ``nca_start``) has no cosine and is not drawn. None without gradient statistics."""
    info = run_info(run_dir)
    runs = seed_runs(info.root)
    lines: dict[tuple[str, str], list[tuple[list[int], list[float], list[float]]]] = {}
    for method in info.methods:
        paths = [r / "train" / method / "metrics.jsonl" for r in runs]
        if not all(p.is_file() for p in paths):
            continue
        for path in paths:
            for pair, series in grad_series(path).items():
                lines.setdefault((method, pair), []).append(series)
    lines = {k: v for k, v in lines.items() if len(v) == len(runs)}
    if not lines:
        missing(GRAD_TRAINING_NAME, info.root / "train" / "<method>" / "metrics.jsonl (with grad/cos/<a>__<b>)")
        return None
    colours = palette(info.models)
    fig = new_figure(9.0, 4.4)
    ax_cos, ax_ratio = fig.subplots(1, 2)
    for (method, pair), per_seed in lines.items():
        label = f"{info.label(method)}: {pair.replace('__', ' vs ')}"
        _draw_band(ax_cos, seed_band([(s, c) for s, c, _ in per_seed], -1.0, 1.0), colours[method], label)
        _draw_band(ax_ratio, seed_band([(s, r) for s, _, r in per_seed], log_scale=True), colours[method], label)
    ax_cos.axhline(0.0, color="0.5", linewidth=0.8)
    ax_cos.set_ylabel("cosine of the two terms' gradients")
    ax_ratio.set_yscale("log")
    ax_ratio.set_ylabel("gradient norm ratio ‖∇a‖ / ‖∇b‖")
    for ax in (ax_cos, ax_ratio):
        ax.set_xlabel("training step")
    fig.suptitle(f"Gradient alignment over training — {info.task}")
    handles, labels = ax_cos.get_legend_handles_labels()
    fitted_legend(fig, 2, handles=handles, labels=labels, loc="outside lower center", title="run: a vs b")
    return fig


def plot_gradient_training(run_dir: Path, out_dir: Path) -> list[Path]:
    """Gradient alignment over training to ``out_dir/gradient_training.{png,pdf}``; [] without gradient statistics."""
    return save(figure_gradient_training(run_dir), out_dir, GRAD_TRAINING_NAME)


def plot_training_curves(run_dir: Path, out_dir: Path) -> list[Path]:
    """Fig. 1 to ``out_dir/training_curves.{png,pdf}``; [] when no metrics.jsonl has evaluation points."""
    return save(figure_training_curves(run_dir), out_dir, TRAINING_NAME)


# ------------------------------------------------------------------------------------------------- budget sweep
def sweep_curves(path: Path) -> dict[str, tuple[list[float], list[float]]]:
    """selector -> (budgets in %, no-context accuracy in %), budgets ascending, null accuracies dropped."""
    data = read_json(path)
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise DataError(f'{path}: expected {{"rows": [{{"selector", "budget", "acc_x"}}, ...]}}')
    curves: dict[str, dict[float, float]] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or any(k not in row for k in ("selector", "budget", "acc_x")):
            raise DataError(f"{path}: rows[{i}] needs 'selector', 'budget' and 'acc_x'")
        if row["acc_x"] is None:
            continue
        curves.setdefault(str(row["selector"]), {})[percent(row["budget"])] = percent(row["acc_x"])
    return {sel: (sorted(d), [d[b] for b in sorted(d)]) for sel, d in curves.items()}


def sweep_kept(path: Path) -> dict[str, dict[float, float]]:
    """selector -> {budget in %: measured kept fraction} for the rows that carry ``kept`` (written by the demo)."""
    out: dict[str, dict[float, float]] = {}
    for row in read_json(path).get("rows", []):
        if isinstance(row, dict) and row.get("kept") is not None and row.get("acc_x") is not None:
            out.setdefault(str(row["selector"]), {})[percent(row["budget"])] = float(row["kept"])
    return out


@styled
def figure_budget_curve(run_dir: Path) -> Figure | None:
    """Final no-context accuracy against the TA-OPD budget ρ, one line per selector, each point annotated with the
    kept fraction it measured (rows with ``kept``). None without sweep.json."""
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
    kept = sweep_kept(path)
    for selector, (budgets, acc) in curves.items():
        ax.plot(budgets, acc, marker="o", color=colours[selector], label=info.label(selector))
        for b, a in zip(budgets, acc):
            if b in kept.get(selector, {}):  # the share of positions the run actually trained on
                ax.annotate(
                    f"kept {kept[selector][b]:.2f}",
                    (b, a),
                    textcoords="offset points",
                    xytext=(3, 3),
                    fontsize=6,
                    color=colours[selector],
                )
    ticks = sorted({b for budgets, _ in curves.values() for b in budgets})
    ax.set_xticks(ticks, [f"{b:g}" for b in ticks])
    ax.margins(x=0.12)  # room for the "kept" notes of the last budget inside the panel
    ax.set_xlabel("token budget ρ (% of response positions trained on)")
    ax.set_ylabel("final accuracy without context (%)")
    ax.set_title(f"TA-OPD budget sweep — {info.task}")
    fig.legend(loc="outside right upper", title="selector")
    return fig


def plot_budget_curve(run_dir: Path, out_dir: Path) -> list[Path]:
    """Fig. 8 to ``out_dir/budget_curve.{png,pdf}``; [] without ``RUN/sweep/sweep.json``."""
    return save(figure_budget_curve(run_dir), out_dir, BUDGET_NAME)


# -- this module's figures (`mechopd.plots.registry`)
register_figure(
    "training_curves",
    "Accuracy without and with the context during training",
    "Held-out accuracy of each method over optimizer steps, evaluated in both views: solid lines without "
    "the context (Acc_x), dashed lines with it re-inserted (Acc_xc); one colour per method. Step 0 is "
    "the model before training. With several seeds: the mean over seeds, shaded 95 % Student-t band "
    "(clipped to 0–100 %).",
    plot_training_curves,
    group="run",
    order=10,
)
register_figure(
    "gradient_training",
    "Gradient alignment over training",
    "On the gradient-statistics steps of each run: the cosine between the two loss terms' gradients "
    "(left) and the ratio of their norms (right, log scale) against the training step; one line per run "
    "and term pair (with several seeds: the mean — geometric for the ratio — with a shaded 95 % Student-t "
    "band). Only runs with two weighted terms have a cosine: NCA's term is 0 before its start step and "
    "an OPD run has one term.",
    plot_gradient_training,
    group="run",
    order=20,
)
register_figure(
    "budget_curve",
    "TA-OPD budget sweep",
    "Final no-context accuracy against the token budget ρ (share of response positions kept in the "
    "loss) for each token selector.",
    plot_budget_curve,
    group="tail",
    order=10,
)
