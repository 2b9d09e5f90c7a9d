"""Context-following figure: does each model still read OTHER contexts? (docs/method.md §7, `mechopd.evaluation.following`).

Artifacts read: ``RUN/eval/<name>.json`` written by ``mechopd eval --other-contexts`` (or the demo): the top-level
``other_contexts`` list (``{label, n, follow, stick}``) and ``summary.follow_other`` / ``summary.stick``
(``{value, low, high}``), ``summary.context_deaf``. Left: accuracy under each other context against that context's
own target, one bar per model. Right: follow_other and stick per model with their paired bootstrap intervals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from mechopd.plots._common import (
    fitted_legend,
    label_bars,
    log,
    missing,
    new_figure,
    palette,
    percent,
    read_json,
    run_info,
    save,
    styled,
)
from mechopd.plots.registry import register_figure
from mechopd.runset import RunSet

NAME = "context_following"


def following_reports(run_dir: Path | RunSet) -> tuple[Any, dict[str, dict[str, Any]]]:
    """(RunInfo, model -> eval report) for the models whose report carries context-following results (the study's
    eval paths, as `_common.eval_summaries`)."""
    info = run_info(run_dir)
    runs = {r.name: r for r in info.study} if info.study is not None else {}
    out = {}
    for name in info.models:
        path = runs[name].eval_path if name in runs else info.root / "eval" / f"{name}.json"
        if path.is_file():
            rep = read_json(path)
            if rep.get("other_contexts"):
                out[name] = rep
    return info, out


def _err(entry: dict[str, Any]) -> tuple[float, float, float]:
    v = percent(entry.get("value"))
    if entry.get("low") is None or entry.get("high") is None:
        return v, 0.0, 0.0
    return v, max(0.0, v - percent(entry["low"])), max(0.0, percent(entry["high"]) - v)


@styled
def figure_context_following(run_dir: Path | RunSet) -> Figure | None:
    """Per-context following (left) and follow_other / stick (right) per model; None (logged) without results."""
    info, reps = following_reports(run_dir)
    if not reps:
        missing(NAME, info.root / "eval" / "<model>.json (with other_contexts: mechopd eval --other-contexts)")
        return None
    labels = list(dict.fromkeys(r["label"] for rep in reps.values() for r in rep["other_contexts"]))
    colours = palette(info.models)
    fig = new_figure(10.0, 4.2 + 0.25 * ((len(reps) + 1) // 2))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1.4]})
    width = 0.8 / len(reps)
    for k, (name, rep) in enumerate(reps.items()):
        per = {r["label"]: r["follow"] for r in rep["other_contexts"]}
        xs = np.arange(len(labels)) + (k - (len(reps) - 1) / 2) * width
        deaf = " (context-deaf)" if rep["summary"].get("context_deaf") else ""
        heights = [percent(per.get(lab)) for lab in labels]  # NaN: this model has no result for that context
        left.bar(
            xs, [0.0 if np.isnan(h) else h for h in heights], width, color=colours[name], label=info.label(name) + deaf
        )
        label_bars(left, list(xs), heights)
        for j, key in enumerate(("follow_other", "stick")):
            v, lo, hi = _err(rep["summary"][key])
            x = j + (k - (len(reps) - 1) / 2) * width
            right.bar(
                x, 0.0 if np.isnan(v) else v, width, color=colours[name], yerr=[[lo], [hi]], ecolor="0.15", capsize=2
            )
            label_bars(right, [x], [v])
    left.set_xticks(np.arange(len(labels)), labels, rotation=30, ha="right")
    left.set_ylabel("% of items right for that context's target")
    left.set_title("Accuracy under each other context")
    right.set_xticks([0, 1], ["follow_other", "stick"])
    right.set_ylabel("% (95 % paired bootstrap)")
    right.set_title("Mean over other contexts")
    for ax in (left, right):
        ax.set_ylim(0, 105)
        ax.grid(axis="x", visible=False)
    handles, names = left.get_legend_handles_labels()  # below both panels: long labels never squeeze the axes
    fitted_legend(
        fig,
        min(3, len(reps)),
        handles=handles,
        labels=names,
        loc="outside lower center",
        frameon=False,
        fontsize="small",
    )
    log.info("figure %s: %d models, %d other contexts", NAME, len(reps), len(labels))
    return fig


def plot_context_following(run_dir: Path | RunSet, out_dir: Path) -> list[Path]:
    """The figure to ``out_dir/context_following.{png,pdf}``; [] without context-following results."""
    return save(figure_context_following(run_dir), out_dir, NAME)


# -- this module's figures (`mechopd.plots.registry`)
register_figure(
    "context_following",
    "Context following: other contexts, each against its own target",
    "Left: share of held-out items answered right for each OTHER context of the task (rules: the "
    "family's other rules), one bar per model; a model whose follow_other is at most half the base's is "
    "marked context-deaf. Right: follow_other (mean over the other contexts) and stick (replies that "
    "give the distilled context's answer anyway), 95 % paired bootstrap over items.",
    plot_context_following,
    group="run",
    order=50,
)
