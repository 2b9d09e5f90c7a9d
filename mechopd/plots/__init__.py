"""The figure set: one function per figure, each reading the saved artifacts of a run directory only.

Every figure has ``plot_<name>(run_dir, out_dir) -> list[Path]`` (writes ``<out_dir>/<name>.png`` and ``.pdf``;
returns [] and logs why when its artifact is absent) and ``figure_<name>(run_dir) -> Figure | None`` (the same figure
as a matplotlib Figure, for notebooks and tests; no file written). A figure is one registration, `register_figure`
at the end of its plot module (`mechopd.plots.registry`): a new figure is one file; `draw_all` draws every registered
figure whose artifacts exist; `figure_index` lists (name, title, caption) for ``report.md``.

    from mechopd.plots import draw_all, figure_index
    written = draw_all("runs/demo")                     # -> runs/demo/figures/*.png|pdf
    for fig in figure_index():
        if written[fig.name]:
            print(f"![{fig.title}](figures/{fig.name}.png)\\n\\n*{fig.caption}*")
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from mechopd.plots.following import figure_context_following, plot_context_following
from mechopd.plots.layers import (
    figure_gradient_alignment,
    figure_layer_cosine,
    figure_parameter_deltas,
    plot_gradient_alignment,
    plot_layer_cosine,
    plot_parameter_deltas,
)
from mechopd.plots.registry import FigureInfo, register_figure, unregister_figure
from mechopd.plots.registry import figures as _figures
from mechopd.plots.removability import figure_regime_map, figure_removability, plot_regime_map, plot_removability
from mechopd.plots.teachability import figure_teachability, plot_teachability
from mechopd.plots.training import (
    figure_budget_curve,
    figure_gradient_training,
    figure_training_curves,
    plot_budget_curve,
    plot_gradient_training,
    plot_training_curves,
)
from mechopd.runset import RunSet


def figure_index() -> list[FigureInfo]:
    """(name, title, caption) of every figure, in report order."""
    return [info for info, _ in _figures()]


def draw_all(run_dir: str | Path | RunSet, out_dir: str | Path | None = None) -> dict[str, list[Path]]:
    """Draw every figure whose artifacts exist into ``out_dir`` (default ``<study root>/figures``). ``run_dir``: a
    run dir (its ``study.yaml`` / ``demo.json`` say the roles) or a `RunSet` (e.g. ``RunSet.load("my_study.yaml")``).

    Returns figure name -> written files, for every figure of `figure_index` ([] where the artifact is absent).
    """
    src = run_dir if isinstance(run_dir, RunSet) else Path(run_dir)
    root = src.root if isinstance(src, RunSet) else src
    out = Path(out_dir) if out_dir is not None else root / "figures"
    return {info.name: plot(src, out) for info, plot in _figures()}


def redraw(study: RunSet, out_dir: str | Path) -> dict[str, list[Path]]:
    """`draw_all` as one set (`mechopd figures`): every figure drawn into a hidden folder beside ``out_dir`` first,
    then moved in; a figure that fails to draw (a bad artifact) leaves ``out_dir`` exactly as it was."""
    out = Path(out_dir)
    stage = Path(tempfile.mkdtemp(prefix=".figures-", dir=out.parent))
    try:
        drawn = draw_all(study, stage)
        if any(drawn.values()):
            out.mkdir(parents=True, exist_ok=True)
        for files in drawn.values():
            for f in files:
                os.replace(f, out / f.relative_to(stage))
        return {name: [out / f.relative_to(stage) for f in files] for name, files in drawn.items()}
    finally:
        shutil.rmtree(stage, ignore_errors=True)


__all__ = [
    "FigureInfo",
    "draw_all",
    "redraw",
    "figure_index",
    "register_figure",
    "unregister_figure",
    "figure_context_following",
    "plot_context_following",
    "figure_budget_curve",
    "figure_gradient_alignment",
    "figure_gradient_training",
    "figure_layer_cosine",
    "figure_parameter_deltas",
    "figure_regime_map",
    "figure_removability",
    "figure_teachability",
    "figure_training_curves",
    "plot_budget_curve",
    "plot_gradient_alignment",
    "plot_gradient_training",
    "plot_layer_cosine",
    "plot_parameter_deltas",
    "plot_regime_map",
    "plot_removability",
    "plot_teachability",
    "plot_training_curves",
]
