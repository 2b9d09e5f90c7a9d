"""Per-layer figures from the probe tables: two-view cosine (fig. 4), gradient alignment (fig. 5), parameter
deltas (fig. 6).

Artifacts read (the probe modules own the formats; nothing is recomputed here):
  ``RUN/probes/similarity.csv``  ``mechopd.probes.similarity`` rows: model, site, depth, layer, ..., cos_mean,
                                 cos_median. x = depth: embed (0), decoder layers 0..L-1, final norm (L + 1).
  ``RUN/probes/gradients.csv``   ``mechopd.probes.gradients.GradRow`` rows; the heatmap uses scope "layer_module",
                                 the title the "global" row. One panel per (term_a, term_b) pair in the file.
  ``RUN/probes/deltas.csv``      ``mechopd.probes.delta_rows.write_table``'s tidy table. Per-tensor rows are combined per
                                 site with ``aggregate_deltas`` (sums of squares: weight + bias of a module), which is
                                 the aggregation that module defines, not a recomputation from weights. Panels: each
                                 model's ‖Δ‖_F/‖W0‖_F (vs "base"), then each pair's ‖θ_b − θ_a‖_F/‖W0‖_F (vs a label),
                                 all on one colour scale.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib as mpl
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.collections import QuadMesh
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure

from mechopd.core.sites import MODULE_ORDER, site_layer
from mechopd.plots._common import (
    BASE,
    RunInfo,
    log,
    missing,
    new_figure,
    palette,
    read_csv,
    run_info,
    save,
    styled,
    to_float,
)
from mechopd.plots.registry import register_figure
from mechopd.probes.delta_rows import read_table
from mechopd.probes.gradients import CSV_NAME as GRADIENTS_CSV
from mechopd.probes.gradients import GradRow

if TYPE_CHECKING:
    from mechopd.probes.delta_rows import DeltaRow

COSINE_NAME = "layer_cosine"
GRADIENT_NAME = "gradient_alignment"
DELTAS_NAME = "parameter_deltas"
TERM_LABELS = {"opd": "OPD", "nca": "NCA", "dual": "DualOPD", "sym": "SymKL"}
MAX_ANNOTATED_CELLS = 160  # write the value into each cell up to this grid size
GRAD_COLUMNS = tuple(f.name for f in fields(GradRow))  # the gradients.csv schema, owned by the probe


# --------------------------------------------------------------------------------------------------------- helpers
def module_order(modules: Iterable[str]) -> list[str]:
    """Modules in forward order (``sites.MODULE_ORDER``), unknown ones after, alphabetically."""
    mods = set(modules)
    return [m for m in MODULE_ORDER if m in mods] + sorted(mods - set(MODULE_ORDER))


def layer_grid(cells: dict[tuple[int, str], float]) -> tuple[list[int], list[str], np.ndarray]:
    """(layer, module) -> value  to  (layers ascending, modules in forward order, [layers, modules] with NaN holes)."""
    layers = sorted({layer for layer, _ in cells})
    modules = module_order(m for _, m in cells)
    grid = np.full((len(layers), len(modules)), np.nan)
    for (layer, module), value in cells.items():
        grid[layers.index(layer), modules.index(module)] = value if math.isfinite(value) else np.nan
    return layers, modules, grid


MAX_LAYER_TICKS = 12  # layer labels per heatmap axis (a deeper model labels every k-th layer)
DELTA_PANEL_MAX = 2.6  # inches of layers per parameter_deltas panel (30 layers: 0.09 in a row, not 0.3)


def thinned(positions: list, most: int) -> list:
    """At most about ``most`` of ``positions``, evenly spaced, the first and the last always (the last replaces its
    neighbour when they would sit side by side: the final norm's label does not overlap the last layer's)."""
    every = max(1, math.ceil(len(positions) / most))
    shown = [p for i, p in enumerate(positions) if i % every == 0]
    if positions and shown[-1] != positions[-1]:
        if every > 1 and positions.index(shown[-1]) > len(positions) - 1 - every:
            shown[-1] = positions[-1]
        else:
            shown.append(positions[-1])
    return shown


def heatmap_height(n_layers: int) -> float:
    """Figure height (inches) of a layer × module heatmap row: titles and rotated module names take about 2.4 in,
    each layer 0.3 in, and the panel at least 1.4 in so that its colour bar label fits (a 2-layer model too)."""
    return 2.4 + max(1.4, 0.3 * n_layers)


def _text_colour(rgba: tuple[float, ...]) -> str:
    """Black on light cells, white on dark ones (relative luminance of the cell colour, as seaborn decides it)."""
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3])
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.408 else "white"


def heatmap(
    ax: Axes,
    layers: list[int],
    modules: list[str],
    grid: np.ndarray,
    *,
    cmap: str | Colormap,
    vmin: float,
    vmax: float,
    label: str | None,
    fontsize: float = 6,
) -> QuadMesh:
    """Layer × module heatmap (rows = layers, layer 0 on top) as one QuadMesh with a colour bar; NaN cells blank.

    grid: ``[len(layers), len(modules)]``. Cells carry their value as text up to MAX_ANNOTATED_CELLS cells.
    label: the colour bar's label; None = no colour bar here (the caller draws a shared one).
    """
    cmap = (mpl.colormaps[cmap] if isinstance(cmap, str) else cmap).with_extremes(bad="white")
    norm = Normalize(vmin, vmax)
    mesh = ax.pcolormesh(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, edgecolors="white", linewidth=0.3)
    if label is not None:
        ax.figure.colorbar(mesh, ax=ax, label=label)
    if grid.size <= MAX_ANNOTATED_CELLS:
        for (i, j), v in np.ndenumerate(grid):
            if np.isfinite(v):
                ax.text(
                    j + 0.5,
                    i + 0.5,
                    f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=fontsize,
                    color=_text_colour(cmap(norm(v))),
                )
    ax.set_xticks(np.arange(len(modules)) + 0.5, modules, rotation=60, ha="right", rotation_mode="anchor")
    shown = thinned(list(range(len(layers))), MAX_LAYER_TICKS)  # 30 layers: every 3rd label, none overlapping
    ax.set_yticks(np.array(shown) + 0.5, [str(layers[i]) for i in shown])
    ax.set_xlim(0, len(modules))
    ax.set_ylim(len(layers), 0)
    ax.grid(False)
    ax.set_xlabel("module")
    ax.set_ylabel("decoder layer")
    return mesh


def _model_order(info: RunInfo, names: Iterable[str]) -> list[str]:
    names = list(dict.fromkeys(names))
    return [m for m in info.models if m in names] + [m for m in names if m not in info.models]


# ------------------------------------------------------------------------------------------- fig. 4 layer cosine
def site_depth(site: str, depth_cell: str | None, n_layers: int) -> float:
    """Depth of a probe site: the table's ``depth`` when present, else embed 0, layers.i -> i + 1, final_norm L + 1."""
    if depth_cell not in (None, ""):
        return float(depth_cell)
    if site == "embed":
        return 0.0
    layer = site_layer(site)
    return float(layer + 1) if layer is not None else float(n_layers + 1)


RELATIVE_TICKS = {0.0: "embed", 0.25: "25 %", 0.5: "50 %", 0.75: "75 %", 1.0: "final norm"}
RELATIVE_XLABEL = "relative depth (each model's sites over its own depth: embedding 0, its deepest site 1)"


def relative_depths(by_model: dict[str, dict[float, float]]) -> dict[str, dict[float, float]] | None:
    """Models of several depths in one figure (a cross-model study's deeper teacher beside its students): each model's
    depth over its own deepest site, so the final norms meet at 1 and a layer index never labels two sites; None when
    every model has one depth (the layer-index axis stays)."""
    tops = {m: max(pts) for m, pts in by_model.items() if pts}
    if len(set(tops.values())) <= 1:
        return None
    return {m: {d / tops[m]: v for d, v in pts.items()} for m, pts in by_model.items() if pts}


def site_label(site: str) -> str:
    layer = site_layer(site)
    return str(layer) if layer is not None else {"embed": "embed", "final_norm": "final norm"}.get(site, site)


@styled
def figure_layer_cosine(run_dir: Path, stat: str = "cos_mean") -> Figure | None:
    """Two-view cosine per site for each model in similarity.csv (one line per model). None without the table.

    stat: the column drawn: "cos_mean" (per-token mean, default), "cos_median" or "cos_example_mean".
    """
    info = run_info(run_dir)
    path = info.root / "probes" / "similarity.csv"
    if not path.is_file():
        missing(COSINE_NAME, path)
        return None
    rows = read_csv(path, ["model", "site", stat])
    n_layers = sum(1 for s in {r["site"] for r in rows} if site_layer(s) is not None)
    by_model: dict[str, dict[float, float]] = {}
    ticks: dict[float, str] = {}
    for r in rows:
        depth = site_depth(r["site"], r.get("depth"), n_layers)
        by_model.setdefault(r["model"], {})[depth] = to_float(r[stat])
        ticks[depth] = site_label(r["site"])
    if not by_model:
        log.info("figure %s skipped: %s has no rows", COSINE_NAME, path)
        return None
    models = _model_order(info, by_model)
    relative = relative_depths(by_model)
    if relative is not None:
        by_model, ticks = relative, dict(RELATIVE_TICKS)
    colours = palette([*info.models, *models])  # the run's order: a model keeps its colour in every figure
    fig = new_figure(7.0, 4.2)
    ax = fig.add_subplot()
    for model in models:
        depths = sorted(by_model[model])
        ax.plot(
            depths,
            [by_model[model][d] for d in depths],
            marker="o",
            markersize=3.5,
            color=colours[model],
            label=info.label(model),
        )
    positions = sorted(ticks)
    shown = thinned(positions, 10)  # "embed" and "final norm" are wide: ~10 labels fit 7 inches
    ax.set_xticks(shown, [ticks[d] for d in shown])
    ax.set_xlabel(RELATIVE_XLABEL if relative is not None else "site (embedding, decoder layer index, final norm)")
    ax.set_ylabel(f"cosine between views (unitless)\n{stat.replace('cos_', '')} over response tokens")
    ax.set_title(f"Hidden-state similarity with vs without context\nper layer — {info.task}")  # clear of the legend
    fig.legend(loc="outside right upper", title="model")
    return fig


def plot_layer_cosine(run_dir: Path, out_dir: Path) -> list[Path]:
    """Fig. 4 to ``out_dir/layer_cosine.{png,pdf}``; [] without ``RUN/probes/similarity.csv``."""
    return save(figure_layer_cosine(run_dir), out_dir, COSINE_NAME)


# ------------------------------------------------------------------------------------- fig. 5 gradient alignment
def _term(name: str) -> str:
    return TERM_LABELS.get(name, name)


@styled
def figure_gradient_alignment(run_dir: Path) -> Figure | None:
    """cos(∇a, ∇b) per layer × module, one heatmap per term pair, the global cosine in the panel title."""
    info = run_info(run_dir)
    path = info.root / "probes" / GRADIENTS_CSV
    if not path.is_file():
        missing(GRADIENT_NAME, path)
        return None
    rows = read_csv(path, GRAD_COLUMNS)
    pairs = list(dict.fromkeys((r["term_a"], r["term_b"]) for r in rows))
    cells = {
        p: {
            (int(r["layer"]), r["module"]): to_float(r["cos"])
            for r in rows
            if (r["term_a"], r["term_b"]) == p and r["scope"] == "layer_module" and r["layer"] not in ("", "None")
        }
        for p in pairs
    }
    pairs = [p for p in pairs if cells[p]]
    if not pairs:
        log.info("figure %s skipped: %s has no layer_module rows", GRADIENT_NAME, path)
        return None
    layers0, modules0, _ = layer_grid(cells[pairs[0]])
    fig = new_figure(len(pairs) * (2.2 + 0.42 * len(modules0)), heatmap_height(len(layers0)))
    axes = fig.subplots(1, len(pairs), squeeze=False)[0]
    cmap = sns.color_palette("vlag", as_cmap=True)
    for ax, (a, b) in zip(axes, pairs):
        layers, modules, grid = layer_grid(cells[(a, b)])
        heatmap(
            ax,
            layers,
            modules,
            grid,
            cmap=cmap,
            vmin=-1.0,
            vmax=1.0,
            label=f"cos(∇{_term(a)}, ∇{_term(b)})\n(unitless)",
        )
        glob = next((r for r in rows if (r["term_a"], r["term_b"]) == (a, b) and r["scope"] == "global"), None)
        head = f"cos(∇L_{_term(a)}, ∇L_{_term(b)})"
        if glob is not None:
            head += (
                f"\nglobal cos = {to_float(glob['cos']):+.3f}, "
                f"‖∇{_term(a)}‖/‖∇{_term(b)}‖ = {to_float(glob['norm_ratio']):.3g}"
            )
        ax.set_title(head, fontsize="medium")
    fig.suptitle(f"Gradient alignment per layer × module — {info.task}")
    return fig


def plot_gradient_alignment(run_dir: Path, out_dir: Path) -> list[Path]:
    """Fig. 5 to ``out_dir/gradient_alignment.{png,pdf}``; [] without ``RUN/probes/gradients.csv``."""
    return save(figure_gradient_alignment(run_dir), out_dir, GRADIENT_NAME)


# ---------------------------------------------------------------------------------------- fig. 6 parameter deltas
def site_and_overall(rows: list[DeltaRow]) -> tuple[list[DeltaRow], list[DeltaRow]]:
    """(per-site rows, one-row-per-model overall rows) from a per-tensor or an already aggregated table."""
    from mechopd.probes.delta_sums import aggregate_deltas

    if all(r.param != "*" for r in rows):
        return aggregate_deltas(rows, "site"), aggregate_deltas(rows, "all")
    return (
        [r for r in rows if r.param == "*" and r.layer is not None and "*" not in r.site],
        [r for r in rows if r.site == "*"],
    )


def delta_panels(rows: list[DeltaRow], info: RunInfo) -> list[tuple[str, str, dict[tuple[int, str], float]]]:
    """[(model, vs, {(layer, module): rel_delta})]: each model vs base (in run order), then each pair (b vs a)."""
    panels: dict[tuple[str, str], dict[tuple[int, str], float]] = {}
    for r in rows:
        if r.metric == "rel_delta" and r.layer is not None and r.vs:
            panels.setdefault((r.model, r.vs), {})[(r.layer, r.module)] = r.value
    solo = [k for k in panels if k[1] == BASE]
    solo = sorted(solo, key=lambda k: _model_order(info, [m for m, _ in solo]).index(k[0]))
    pairs = [k for k in panels if k[1] != BASE]
    return [(m, vs, panels[(m, vs)]) for m, vs in solo + pairs]


@styled
def figure_parameter_deltas(run_dir: Path) -> Figure | None:
    """Relative update norm per layer × module for each model and for each pair's difference, one colour scale."""
    info = run_info(run_dir)
    path = info.root / "probes" / "deltas.csv"
    if not path.is_file():
        missing(DELTAS_NAME, path)
        return None

    sites, overall = site_and_overall(read_table(path))
    panels = delta_panels(sites, info)
    if not panels:
        log.info("figure %s skipped: %s has no rel_delta rows inside decoder layers", DELTAS_NAME, path)
        return None
    grids = [layer_grid(cells) for _, _, cells in panels]
    finite = np.concatenate([g[np.isfinite(g)] for _, _, g in grids])
    vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    n_layers, n_mods = max(len(g[0]) for g in grids), max(len(g[1]) for g in grids)
    # one panel per row, so the figure keeps a README-readable width (~1000 px) whatever the number of panels
    panel = 0.75 + min(DELTA_PANEL_MAX, max(0.7, 0.3 * n_layers))  # a 30-layer model stays ~1700 px tall, not 4600
    fig = new_figure(max(6.5, 1.8 + 0.5 * n_mods), 1.6 + len(panels) * panel)
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for k, (ax, (model, vs, _), (layers, modules, grid)) in enumerate(zip(axes, panels, grids)):
        mesh = heatmap(ax, layers, modules, grid, cmap="viridis", vmin=0.0, vmax=vmax, label=None, fontsize=7)
        if k < len(panels) - 1:  # the module names once, under the last panel (same modules in every panel)
            ax.tick_params(axis="x", labelbottom=False)
            ax.set_xlabel("")
        if vs == BASE:
            head = f"{info.label(model)}: ‖θ − W0‖ / ‖W0‖"
            total = next((r.value for r in overall if (r.model, r.vs, r.metric) == (model, vs, "rel_delta")), None)
            head += "" if total is None else f"\nall tensors: {total:.3g}"
        else:
            head = f"{info.label(model)} − {info.label(vs)}: ‖θ_{model} − θ_{vs}‖ / ‖W0‖"
            cos = next((r.value for r in overall if (r.model, r.vs, r.metric) == (model, vs, "cos")), None)
            head += "" if cos is None else f"\ncos(Δ_{vs}, Δ_{model}) over all tensors = {cos:+.3f}"
        ax.set_title(head, fontsize="medium")
    fig.colorbar(mesh, ax=list(axes), label="‖ΔW‖_F / ‖W0‖_F\n(unitless)")
    fig.suptitle(f"Parameter updates per layer × module (relative Frobenius norm) — {info.task}")
    return fig


def plot_parameter_deltas(run_dir: Path, out_dir: Path) -> list[Path]:
    """Fig. 6 to ``out_dir/parameter_deltas.{png,pdf}``; [] without ``RUN/probes/deltas.csv``."""
    return save(figure_parameter_deltas(run_dir), out_dir, DELTAS_NAME)


# -- this module's figures (`mechopd.plots.registry`)
register_figure(
    "layer_cosine",
    "Two-view hidden-state cosine per layer",
    "Cosine between the hidden states of the same response token with and without the context, per-token mean "
    "over the response tokens, at the embedding, after each decoder layer and after the final norm; one line "
    "per model.",
    plot_layer_cosine,
    group="probe",
    order=10,
)
register_figure(
    "gradient_alignment",
    "Gradient alignment of the OPD and NCA terms",
    "Cosine between the gradients of the two loss terms on the same batch, per decoder layer and module (blue "
    "negative, red positive); the panel title gives the global cosine over all parameters and the ratio of the "
    "gradient norms.",
    plot_gradient_alignment,
    group="probe",
    order=20,
)
register_figure(
    "parameter_deltas",
    "Parameter updates per layer and module",
    "Relative Frobenius norm of the update ‖θ − W0‖/‖W0‖ per decoder layer and module for each trained model, "
    "and of the difference between two trained models (e.g. NCA − OPD, with the cosine between their updates), "
    "on one colour scale.",
    plot_parameter_deltas,
    group="probe",
    order=30,
)
