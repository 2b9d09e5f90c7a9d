"""Figures of the causal probes, from their tables only (nothing recomputed; the probe modules own the formats):

``RUN/probes/lens.csv``       model, site, depth, kl_c_x, top1_agree        -> ``lens_kl``: KL by depth per model
``RUN/probes/patching.csv``   model, site, component, direction, window, recovered -> ``patching``: site x component
                              heatmap of ``recovered`` (c_to_x, window "all"), one panel per model
``RUN/probes/attention.csv``  model, layer, head, context_share               -> ``attention_context``: layer x head
                              heatmap per model and the NCA − OPD difference (when both are present)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from mechopd.plots._common import (
    RunInfo,
    fitted_legend,
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
from mechopd.plots.layers import RELATIVE_TICKS, RELATIVE_XLABEL, _model_order, relative_depths, site_depth, site_label
from mechopd.plots.registry import register_figure

LENS, PATCHING, ATTENTION = "lens_kl", "patching", "attention_context"
COMPONENT_ORDER = ("resid", "attn", "mlp")


def _table(info: RunInfo, name: str, figure: str, required: list[str]) -> list[dict[str, str]] | None:
    path = info.root / "probes" / name
    if not path.is_file():
        missing(figure, path)
        return None
    rows = read_csv(path, required)
    if not rows:
        log.info("figure %s skipped: %s has no rows", figure, path)
    return rows or None


@styled
def figure_lens_kl(run_dir: Path) -> Figure | None:
    """KL(p_c ‖ p_x) of the lens distributions per site (x: depth), one line per model (log y when it spans > 100x)."""
    info = run_info(run_dir)
    rows = _table(info, "lens.csv", LENS, ["model", "site", "depth", "kl_c_x"])
    if rows is None:
        return None
    n_layers = sum(1 for s in {r["site"] for r in rows} if s.startswith("layers."))
    models = _model_order(info, (r["model"] for r in rows))
    colours = palette([*info.models, *models])  # the run's order: a model keeps its colour in every figure
    fig = new_figure(7.0, 4.8)
    ax = fig.add_subplot()
    ticks = {site_depth(r["site"], r["depth"], n_layers): site_label(r["site"]) for r in rows}
    by_model = {
        m: {site_depth(r["site"], r["depth"], n_layers): to_float(r["kl_c_x"]) for r in rows if r["model"] == m}
        for m in models
    }
    relative = relative_depths(by_model)  # a deeper teacher beside its students: each over its own depth
    if relative is not None:
        by_model, ticks = relative, dict(RELATIVE_TICKS)
    values = []
    for m in models:
        pts = sorted(by_model[m].items())
        ax.plot(
            [d for d, _ in pts], [v for _, v in pts], marker="o", markersize=3.5, color=colours[m], label=info.label(m)
        )
        values += [v for _, v in pts if v > 0 and math.isfinite(v)]
    ax.set_ylabel("KL(p_c ‖ p_x) of the lens, nats per position")
    _kl_scale(ax, values, [to_float(r["kl_c_x"]) for r in rows])
    shown = sorted(ticks)[:: max(1, math.ceil(len(ticks) / 16))]
    ax.set_xticks(shown, [ticks[d] for d in shown])
    ax.set_xlabel(RELATIVE_XLABEL if relative is not None else "site (embedding, decoder layer index, final norm)")
    ax.set_title(f"Logit lens: where the context changes the prediction — {info.task}")
    fitted_legend(fig, 3, loc="outside lower center", title="model")  # below: a long label never meets the title
    return fig


def _kl_scale(ax, positive: list[float], every: list[float]) -> None:
    """Log y when the positive KLs span > 100x. A KL of exactly 0 (e.g. at the embedding, which the context cannot
    reach) has no place on a log axis: then symlog, linear below the smallest positive KL, so 0 sits on the axis
    floor, and the zeros are named in the y-label."""
    if not positive or max(positive) / min(positive) <= 100:
        return
    if any(v == 0 for v in every):
        lo, hi = min(positive), max(positive)
        ax.set_yscale("symlog", linthresh=lo, linscale=0.5)
        ax.set_ylim(0.0, hi * 2.0)
        ax.set_yticks([0.0] + [10.0**k for k in range(math.ceil(math.log10(lo)), math.floor(math.log10(hi)) + 1)])
        ax.set_ylabel(
            f"KL(p_c ‖ p_x) of the lens, nats per position\n(symlog: linear below {min(positive):.1e}; "
            "0 = identical views)"
        )
    else:
        ax.set_yscale("log")


def plot_lens_kl(run_dir: Path, out_dir: Path) -> list[Path]:
    return save(figure_lens_kl(run_dir), out_dir, LENS)


def _heatmap(
    fig: Figure,
    ax,
    grid: np.ndarray,
    xlabels: list[str],
    ylabels: list[str],
    title: str,
    *,
    cmap: str,
    vmin: float,
    vmax: float,
    annotate: bool,
) -> None:
    mesh = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.grid(False)
    ax.set_xticks(range(len(xlabels)), xlabels)
    ax.set_yticks(range(len(ylabels)), ylabels)
    ax.set_title(title, fontsize=9)
    if annotate and grid.size <= 160:
        for (i, j), v in np.ndenumerate(grid):
            if math.isfinite(v):
                r, g, b, _ = mesh.cmap(mesh.norm(v))
                ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color=ink)
    fig.colorbar(mesh, ax=ax, shrink=0.8)


def _panel_row(
    panels: list[tuple],
    ticks: tuple[list[str], list[str]],
    labels: tuple[str, str],
    annotate: bool,
    size: tuple[float, float],
    title: str,
) -> Figure:
    """One row of heatmap panels ``(title, grid [rows, cols], cmap, vmin, vmax)`` sharing tick labels."""
    fig = new_figure(size[0] * len(panels) + 1.0, size[1] * len(ticks[1]) + 2.2)
    for k, (name, grid, cmap, lo, hi) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        _heatmap(fig, ax, grid, ticks[0], ticks[1], name, cmap=cmap, vmin=lo, vmax=hi, annotate=annotate)
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1] if k == 0 else "")
    fig.suptitle(title)
    return fig


@styled
def figure_patching(run_dir: Path) -> Figure | None:
    """recovered (c_to_x, every position) per site (rows, forward order) x component (columns), a panel per model."""
    info = run_info(run_dir)
    rows = _table(info, "patching.csv", PATCHING, ["model", "site", "component", "direction", "recovered"])
    if rows is None:
        return None
    rows = [r for r in rows if r["direction"] == "c_to_x" and r.get("window", "all") == "all"]
    models = _model_order(info, (r["model"] for r in rows))
    sites = sorted(
        dict.fromkeys(r["site"] for r in rows), key=lambda s: to_float(next(r["depth"] for r in rows if r["site"] == s))
    )
    comps = [c for c in COMPONENT_ORDER if any(r["component"] == c for r in rows)]
    lo = min([0.0] + [v for r in rows for v in [to_float(r["recovered"])] if math.isfinite(v)])  # one scale
    panels = []
    for m in models:
        grid = np.full((len(sites), len(comps)), np.nan)
        for r in rows:
            if r["model"] == m:
                grid[sites.index(r["site"]), comps.index(r["component"])] = to_float(r["recovered"])
        panels.append((f"{info.label(m)}: recovered (c→x)", grid, "viridis", lo, 1.0))
    return _panel_row(
        panels,
        (comps, [site_label(s) for s in sites]),
        ("component", "site"),
        True,
        (3.2, 0.35),
        f"Activation patching between the views — {info.task}",
    )


def plot_patching(run_dir: Path, out_dir: Path) -> list[Path]:
    return save(figure_patching(run_dir), out_dir, PATCHING)


@styled
def figure_attention_context(run_dir: Path) -> Figure | None:
    """context_share per layer (rows) x head (columns), a panel per model, then NCA − OPD (when both exist)."""
    info = run_info(run_dir)
    rows = _table(info, "attention.csv", ATTENTION, ["model", "layer", "head", "context_share"])
    if rows is None:
        return None
    models = _model_order(info, (r["model"] for r in rows))
    L = 1 + max(int(r["layer"]) for r in rows)
    H = 1 + max(int(r["head"]) for r in rows)
    grids = {m: np.full((L, H), np.nan) for m in models}
    for r in rows:
        grids[r["model"]][int(r["layer"]), int(r["head"])] = to_float(r["context_share"])
    top = max(1e-6, float(np.nanmax([np.nanmax(g) for g in grids.values()])))  # scaled to the data, one scale
    panels = [(f"{info.label(m)} (scale 0–{top:.2f})", grids[m], "magma", 0.0, top) for m in models]
    if "nca" in grids and "opd" in grids:
        diff = grids["nca"] - grids["opd"]
        lim = max(1e-6, float(np.nanmax(np.abs(diff))))
        panels.append((f"{info.label('nca')} − {info.label('opd')}", diff, "coolwarm", -lim, lim))
    return _panel_row(
        panels,
        ([str(h) for h in range(H)], [str(i) for i in range(L)]),
        ("head", "layer"),
        L * H <= 48,
        (2.6, 0.3),
        f"Attention on the context (context view, share of attention) — {info.task}",
    )


def plot_attention_context(run_dir: Path, out_dir: Path) -> list[Path]:
    return save(figure_attention_context(run_dir), out_dir, ATTENTION)


# -- this module's figures (`mechopd.plots.registry`)
register_figure(
    "lens_kl",
    "Logit lens: KL between the views by depth",
    "Mean over the scored positions (the last prompt token and every response token but the last) of "
    "KL(p_c ‖ p_x) between the context and no-context views' distributions, the residual at each site decoded "
    "through the model's final norm and LM head (at the final norm: the output); one line per model.",
    plot_lens_kl,
    group="probe",
    order=50,
)
register_figure(
    "patching",
    "Activation patching between the views",
    "Recovered share of the output KL between the views when the no-context view's activation at the scored "
    "positions is replaced by the context view's (c→x): 1 − KL(p_c ‖ p_x patched)/KL(p_c ‖ p_x), per site and "
    "component (resid: the residual stream at the site; attn / mlp: that layer's attention / MLP output); one "
    "panel per model.",
    plot_patching,
    group="probe",
    order=60,
)
register_figure(
    "attention_context",
    "Attention on the context per layer and head",
    "In the context view, mean attention weight the scored positions put on the context's tokens, per decoder "
    "layer and head, one panel per model, and the NCA − OPD difference (blue: NCA attends less to the context).",
    plot_attention_context,
    group="probe",
    order=70,
)
