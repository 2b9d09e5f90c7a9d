"""The figure set: one function per figure, each reading the saved artifacts of a run directory only.

Every figure has ``plot_<name>(run_dir, out_dir) -> list[Path]`` (writes ``<out_dir>/<name>.png`` and ``.pdf``;
returns [] and logs why when its artifact is absent) and ``figure_<name>(run_dir) -> Figure | None`` (the same figure
as a matplotlib Figure, for notebooks and tests; no file written). A figure is one registration: `register_figure`
(the run's figures, below) or a probe's ``ProbeSpec.figures``; `draw_all` draws every registered figure whose
artifacts exist; `figure_index` lists (name, title, caption) for ``report.md``.

    from mechopd.plots import draw_all, figure_index
    written = draw_all("runs/demo")                     # -> runs/demo/figures/*.png|pdf
    for fig in figure_index():
        if written[fig.name]:
            print(f"![{fig.title}](figures/{fig.name}.png)\\n\\n*{fig.caption}*")
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from mechopd.errors import ConfigError
from mechopd.plots.following import figure_context_following, plot_context_following
from mechopd.plots.layers import (figure_gradient_alignment, figure_layer_cosine, figure_parameter_deltas,
                                  plot_gradient_alignment, plot_layer_cosine, plot_parameter_deltas)
from mechopd.plots.removability import (figure_regime_map, figure_removability, plot_regime_map,
                                        plot_removability)
from mechopd.plots.teachability import figure_teachability, plot_teachability
from mechopd.plots.training import (figure_budget_curve, figure_gradient_training, figure_training_curves,
                                    plot_budget_curve, plot_gradient_training, plot_training_curves)
from mechopd.probes.registry import figures as probe_figures
from mechopd.probes.registry import resolve
from mechopd.study import Study


class FigureInfo(NamedTuple):
    """One figure of the set: ``name`` (file stem: ``figures/<name>.png``), ``title``, ``caption`` (what is drawn)."""

    name: str
    title: str
    caption: str


Plot = Callable[[Path, Path], list[Path]] | str
_GROUPS = ("run", "tail")  # the run's figures, then every registered probe's, then the tail (report order)
_REGISTRY: dict[str, tuple[FigureInfo, Plot, str]] = {}


def register_figure(name: str, title: str, caption: str, plot: Plot, *, group: str = "tail",
                    replace: bool = False) -> FigureInfo:
    """Add a figure to `draw_all`, `figure_index` and ``report.md``: ``plot(run_dir, out_dir) -> list[Path]`` (or
    ``"module:function"``). ``group``: "run" (before the probes' figures) or "tail" (after them). A probe's figures
    are registered with the probe instead (`ProbeSpec.figures`). A taken name raises unless ``replace``."""
    if group not in _GROUPS:
        raise ConfigError(f"figure {name!r}: group {group!r} is unknown; use run or tail")
    if not replace and name in _REGISTRY:
        raise ConfigError(f"figure {name!r} is already registered; pick another name or pass replace=True")
    info = FigureInfo(name, title, caption)
    _REGISTRY[name] = (info, plot, group)
    return info


def unregister_figure(name: str) -> None:
    _REGISTRY.pop(name, None)


register_figure("training_curves", "Accuracy without and with the context during training",
                "Held-out accuracy of each method over optimizer steps, evaluated in both views: solid lines without "
                "the context (Acc_x), dashed lines with it re-inserted (Acc_xc); one colour per method. Step 0 is "
                "the model before training. With several seeds: the mean over seeds, shaded 95 % Student-t band "
                "(clipped to 0–100 %).", plot_training_curves, group="run")
register_figure("gradient_training", "Gradient alignment over training",
                "On the gradient-statistics steps of each run: the cosine between the two loss terms' gradients "
                "(left) and the ratio of their norms (right, log scale) against the training step; one line per run "
                "and term pair (with several seeds: the mean — geometric for the ratio — with a shaded 95 % Student-t "
                "band). Only runs with two weighted terms have a cosine: NCA's term is 0 before its start step and "
                "an OPD run has one term.", plot_gradient_training, group="run")
register_figure("removability", "Context removability per model",
                "Acc_x, Acc_xc, Harm = P(wrong with c | right without c) and BothCorrect per model (left, % of "
                "held-out items) and the relative response-length change Δlen with the context (right). Error bars: "
                "paired bootstrap intervals over items; none where a metric or its interval is undefined.",
                plot_removability, group="run")
register_figure("regime_map", "Removability regimes",
                "Each point is one (task, model): accuracy drop with the context (Acc_x − Acc_xc) against Harm, "
                "vertical bars the Harm interval. Shaded regions: A context hurts (drop ≥ drop_min or Harm ≥ "
                "harm_high), B context still helps (gain ≥ gain_min), C views agree; thresholds from the run's "
                "demo.json.", plot_regime_map, group="run")
register_figure("context_following", "Context following: other contexts, each against its own target",
                "Left: share of held-out items answered right for each OTHER context of the task (rules: the "
                "family's other rules), one bar per model; a model whose follow_other is at most half the base's is "
                "marked context-deaf. Right: follow_other (mean over the other contexts) and stick (replies that "
                "give the distilled context's answer anyway), 95 % paired bootstrap over items.",
                plot_context_following, group="run")
register_figure("budget_curve", "TA-OPD budget sweep",
                "Final no-context accuracy against the token budget ρ (share of response positions kept in the "
                "loss) for each token selector.", plot_budget_curve, group="tail")


def _figures() -> list[tuple[FigureInfo, Callable[[Path, Path], list[Path]]]]:
    """The run's figures, then every registered probe's, then the tail (report order)."""
    group = lambda g: [(info, resolve(plot)) for info, plot, grp in _REGISTRY.values() if grp == g]  # noqa: E731
    probe_figs = [(FigureInfo(f.name, f.title, f.caption), resolve(f.plot)) for f in probe_figures()]
    return [*group("run"), *probe_figs, *group("tail")]


def figure_index() -> list[FigureInfo]:
    """(name, title, caption) of every figure, in report order."""
    return [info for info, _ in _figures()]


def draw_all(run_dir: str | Path | Study, out_dir: str | Path | None = None) -> dict[str, list[Path]]:
    """Draw every figure whose artifacts exist into ``out_dir`` (default ``<study root>/figures``). ``run_dir``: a
    run dir (its ``study.yaml`` / ``demo.json`` say the roles) or a `Study` (e.g. ``Study.load("my_study.yaml")``).

    Returns figure name -> written files, for every figure of `figure_index` ([] where the artifact is absent).
    """
    src = run_dir if isinstance(run_dir, Study) else Path(run_dir)
    root = src.root if isinstance(src, Study) else src
    out = Path(out_dir) if out_dir is not None else root / "figures"
    return {info.name: plot(src, out) for info, plot in _figures()}


__all__ = [
    "FigureInfo", "draw_all", "figure_index", "register_figure", "unregister_figure",
    "figure_context_following", "plot_context_following",
    "figure_budget_curve", "figure_gradient_alignment", "figure_gradient_training", "figure_layer_cosine",
    "figure_parameter_deltas", "figure_regime_map", "figure_removability", "figure_teachability", "figure_training_curves",
    "plot_budget_curve", "plot_gradient_alignment", "plot_gradient_training", "plot_layer_cosine",
    "plot_parameter_deltas", "plot_regime_map", "plot_removability", "plot_teachability", "plot_training_curves",
]
