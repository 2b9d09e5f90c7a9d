"""Figures of the intervention probes, from their tables only (nothing recomputed; the probe modules own the formats):

``RUN/probes/weightpatch.csv``   model, layer, module, draw, acc_x, harm  -> ``weightpatch``: layer x module heatmaps
                                 of Acc_x and Harm per model (ctrl_qk: mean over draws; top row: unpatched)
``RUN/probes/localization.csv``  model, donor, layer, harm, harm_low, harm_high, seed -> ``localization``: Harm
                                 after patching the donor's residual at each layer, with its interval
``RUN/probes/attribution.csv``   model, pair, layer, component, head, attribution -> ``attribution``: layer x
                                 component heatmap of the summed attribution per pair
``RUN/probes/pmi_tokens.csv``    pmi, kl, harm_flip                     -> ``pmi``: PMI distribution by flip status
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from mechopd.plots._common import missing, new_figure, read_csv, run_info, save, styled, to_float
from mechopd.plots.causal import _panel_row, _table
from mechopd.plots.layers import _model_order
from mechopd.plots.registry import register_figure
from mechopd.plots.training import seed_runs
from mechopd.probes.mechanism_stats import localization_arrays, site_harm_stat

WEIGHTPATCH = "weightpatch"
MODULE_ORDER = ("q_proj", "k_proj", "v_proj", "o_proj", "qk", "vo", "attn", "mlp", "norms", "ctrl_qk")


def _mean_grid(rows: list[dict[str, str]], layers: list[str], modules: list[str], key: str) -> np.ndarray:
    sums = np.zeros((len(layers), len(modules)))
    counts = np.zeros_like(sums)
    for r in rows:
        v = to_float(r[key])
        if math.isfinite(v) and r["layer"] in layers:
            col = modules.index(r["module"]) if r["layer"] != "none" else 0
            sums[layers.index(r["layer"]), col] += v
            counts[layers.index(r["layer"]), col] += 1
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


@styled
def figure_weightpatch(run_dir: Path) -> Figure | None:
    """Acc_x and Harm per layer (rows: none, 0..L-1, all) x module group (columns), two panels per model."""
    info = run_info(run_dir)
    rows = _table(info, "weightpatch.csv", WEIGHTPATCH, ["model", "layer", "module", "acc_x", "harm"])
    if rows is None:
        return None
    models = _model_order(info, (r["model"] for r in rows))
    modules = [m for m in MODULE_ORDER if any(r["module"] == m for r in rows)]
    numeric = sorted({r["layer"] for r in rows if r["layer"].isdigit()}, key=int)
    layers = ["none", *numeric, *(["all"] if any(r["layer"] == "all" for r in rows) else [])]
    panels = []
    for m in models:
        mine = [r for r in rows if r["model"] == m]
        donor = mine[0].get("donor", "donor")
        panels.append(
            (f"{info.label(m)} ← {donor}: Acc_x", _mean_grid(mine, layers, modules, "acc_x"), "viridis", 0.0, 1.0)
        )
        panels.append(
            (f"{info.label(m)} ← {donor}: Harm", _mean_grid(mine, layers, modules, "harm"), "rocket_r", 0.0, 1.0)
        )
    ylabels = ["unpatched" if lay == "none" else lay for lay in layers]
    fig = _panel_row(
        panels,
        (modules, ylabels),
        ("module group reverted", "decoder layer"),
        True,
        (4.4, 0.4),
        f"Weight patching: which weights carry the rule and the harm — {info.task}",
    )
    for ax in fig.axes[::2]:  # the heatmaps (every other axis is a colour bar)
        ax.tick_params(axis="x", labelrotation=45)
    return fig


def plot_weightpatch(run_dir: Path, out_dir: Path) -> list[Path]:
    return save(figure_weightpatch(run_dir), out_dir, WEIGHTPATCH)


__all__ = ["figure_weightpatch", "plot_weightpatch"]


LOCALIZATION = "localization"


def _localization_curves(run_dir: Path) -> tuple[list[dict[str, str]], list[list[float]]] | None:
    """The first seed run's rows (sites in depth order) and, per site, the harm of every seed run that has the table
    (an aggregate directory's ``seed_runs``; a run: itself)."""
    tables = [p / "probes" / "localization.csv" for p in seed_runs(run_dir)]
    tables = [t for t in tables if t.is_file()]
    if not tables:
        return None
    first = sorted(read_csv(tables[0], ["site", "depth", "harm", "harm_clean"]), key=lambda r: int(r["depth"]))
    per_site: list[list[float]] = [[] for _ in first]
    for t in tables:
        got = {r["site"]: to_float(r["harm"]) for r in read_csv(t, ["site", "harm"])}
        for k, r in enumerate(first):
            if math.isfinite(got.get(r["site"], math.nan)):
                per_site[k].append(got[r["site"]])
    return first, per_site


def _unpatched_harm(runs: list[Path]) -> float:
    """The unpatched teacher-forced Harm (``harm_clean``), averaged over the seed runs that have the table, so the
    dashed line is on the same footing as the curve (a mean over seeds)."""
    values = []
    for r in runs:
        table = r / "probes" / "localization.csv"
        if table.is_file():
            values += [to_float(row["harm_clean"]) for row in read_csv(table, ["harm_clean"])[:1]]
    values = [v for v in values if math.isfinite(v)]
    return float(np.mean(values)) if values else math.nan


def _band(runs: list[Path], rows: list[dict[str, str]]) -> tuple[list[float], list[float], list[float]] | None:
    """Per site the mean over seeds and the 95 % hierarchical interval over seeds and items (`stats.hier_bootstrap`) of the
    teacher-forced Harm after patching (`mechanism_stats.site_harm_stat`, from ``localization_items.jsonl``, as the
    report's table); None when a seed's items file lacks the per-item flips."""
    with_table = [r for r in runs if (r / "probes" / "localization.csv").is_file()]
    if any(localization_arrays(r) is None for r in with_table):
        return None
    stats = [site_harm_stat(with_table, r["site"]) for r in rows]
    mean, low, high = ([math.nan if s[k] is None else s[k] for s in stats] for k in ("mean", "low", "high"))
    return mean, low, high


@styled
def figure_localization(run_dir: Path) -> Figure | None:
    """Teacher-forced Harm after patching, by depth: the mean over seeds (one run: its value) with the 95 %
    hierarchical interval over seeds and items (one run: over items) from the items files; without per-item
    flips, the tables' own values and no band. The unpatched Harm dashed."""
    info = run_info(run_dir)
    got = _localization_curves(info.root)
    if got is None:
        missing(LOCALIZATION, info.root / "probes" / "localization.csv")
        return None
    rows, per_site = got
    seeds = max(len(v) for v in per_site)
    x = [int(r["depth"]) for r in rows]
    band = _band(seed_runs(info.root), rows)
    if band is not None:
        y, lo, hi = band
    elif seeds == 1:  # one run whose items lack the flips: the table's own item-bootstrap interval
        y, lo, hi = ([to_float(r.get(k)) for r in rows] for k in ("harm", "harm_low", "harm_high"))
    else:
        y, lo, hi = [float(np.mean(v)) if v else math.nan for v in per_site], [math.nan] * len(x), [math.nan] * len(x)
    fig = new_figure(7.0, 4.2)
    ax = fig.add_subplot()
    ax.plot(x, y, marker="o", label=f"{info.label(rows[0]['model'])} ← {rows[0].get('donor', 'donor')}")
    if all(math.isfinite(v) for v in lo + hi):
        ax.fill_between(
            x,
            lo,
            hi,
            alpha=0.25,
            label="95 % hierarchical (t over seeds, item floor)" if seeds > 1 else "95 % item bootstrap",
        )
    clean = _unpatched_harm(seed_runs(info.root))
    ax.axhline(
        clean, linestyle="--", color="grey", label="unpatched" + (f" (mean of {seeds} seeds)" if seeds > 1 else "")
    )
    ax.set_xticks(x, [r["site"].replace(".resid_post", "") for r in rows], rotation=45, ha="right")
    ax.set_ylim(-0.02, 1.3)  # a band above Harm = 1 for the legend: the curve sits at 1 wherever nothing is removed
    ax.set_yticks(np.linspace(0.0, 1.0, 6))
    ax.set_xlabel("site whose residual is patched (all response positions)")
    ax.set_ylabel("teacher-forced Harm after patching")
    ax.set_title(f"Where the harm lives — {info.task}" + (f", {seeds} seeds" if seeds > 1 else ""))
    ax.legend(loc="upper center", ncol=3, fontsize="small")
    return fig


def plot_localization(run_dir: Path, out_dir: Path) -> list[Path]:
    return save(figure_localization(run_dir), out_dir, LOCALIZATION)


ATTRIBUTION = "attribution"


@styled
def figure_attribution(run_dir: Path) -> Figure | None:
    """recovered_attr (position all) per layer (rows) x component / head (columns), one panel per model and pair."""
    info = run_info(run_dir)
    rows = _table(
        info,
        "attribution.csv",
        ATTRIBUTION,
        ["model", "pair", "layer", "component", "head", "position", "recovered_attr", "recovered_exact"],
    )
    if rows is None:
        return None
    rows = [r for r in rows if r["position"] == "all"]
    cols = [c for c in ("resid", "attn", "mlp") if any(r["component"] == c for r in rows)]
    heads = sorted({int(r["head"]) for r in rows if r["head"] != ""})
    cols += [f"head {h}" for h in heads]
    layers = sorted({int(r["layer"]) for r in rows})
    panels = []
    for key in dict.fromkeys((r["model"], r["pair"]) for r in rows):
        grid = np.full((len(layers), len(cols)), np.nan)
        mine = [r for r in rows if (r["model"], r["pair"]) == key]
        for r in mine:
            col = r["component"] if r["head"] == "" else f"head {r['head']}"
            grid[layers.index(int(r["layer"])), cols.index(col)] = to_float(r["recovered_attr"])
        a = [to_float(r["recovered_attr"]) for r in mine if math.isfinite(to_float(r["recovered_exact"]))]
        b = [to_float(r["recovered_exact"]) for r in mine if math.isfinite(to_float(r["recovered_exact"]))]
        ok = len(a) >= 3 and np.std(a) > 0 and np.std(b) > 0
        corr = f", r = {np.corrcoef(a, b)[0, 1]:.2f} vs exact" if ok else ""
        lim = max(1e-6, float(np.nanmax(np.abs(grid)))) if np.isfinite(grid).any() else 1.0
        panels.append((f"{info.label(key[0])} {key[1]}{corr}", grid, "coolwarm", -lim, lim))
    return _panel_row(
        panels,
        (cols, [str(i) for i in layers]),
        ("component / head", "decoder layer"),
        True,
        (0.5 * len(cols) + 1.5, 0.45),
        f"Attribution patching (estimated recovered share) — {info.task}",
    )


def plot_attribution(run_dir: Path, out_dir: Path) -> list[Path]:
    return save(figure_attribution(run_dir), out_dir, ATTRIBUTION)


PMI = "pmi"


@styled
def figure_pmi(run_dir: Path) -> Figure | None:
    """Scatter of pmi against the per-token OPD KL; flip tokens in red."""
    info = run_info(run_dir)
    rows = _table(info, "pmi_tokens.csv", PMI, ["pmi", "opd", "flip"])
    if rows is None:
        return None
    fig = new_figure(6.5, 4.2)
    ax = fig.add_subplot()
    for flip, colour, label in ((False, "tab:blue", "other tokens"), (True, "tab:red", "flip under Harm")):
        mine = [r for r in rows if (r["flip"] == "True") == flip]
        ax.scatter(
            [to_float(r["pmi"]) for r in mine],
            [to_float(r["opd"]) for r in mine],
            s=10,
            alpha=0.6,
            color=colour,
            label=f"{label} ({len(mine)})",
        )
    ax.axvline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("teacher PMI with the context, log f(y|c,x) − log f(y|x) (nats)")
    ax.set_ylabel("OPD loss at the token, KL(q_x ‖ f_c) (nats)")
    ax.set_title(f"Where the teacher's signal comes from — {info.task}")
    ax.legend()
    return fig


def plot_pmi(run_dir: Path, out_dir: Path) -> list[Path]:
    return save(figure_pmi(run_dir), out_dir, PMI)


# -- this module's figures (`mechopd.plots.registry`)
register_figure(
    "weightpatch",
    "Weight patching: Acc_x and Harm by layer and module group",
    "Each trained model with one module group of one decoder layer (row 'all': of every layer) reverted to the "
    "donor's weights (default: the base W0), both views decoded greedily on the same held-out items. Left: "
    "Acc_x (a drop: the group carries internalised rule); right: Harm (a drop: the group carries the harm). "
    "ctrl_qk: random rows of the other matrices with q_proj+k_proj's parameter count (mean over draws); the "
    "top row is the unpatched model.",
    plot_weightpatch,
    group="probe",
    order=90,
)
register_figure(
    "localization",
    "Localization: Harm after patching the donor's residual, by depth",
    "The model's context view fed its own correct no-context reply, the residual stream at one site replaced at "
    "every response position by the donor's (its own no-context view, or another model's context view); "
    "teacher-forced Harm = share of the items right without c whose greedy choice leaves the reply, with its "
    "95 % item-bootstrap interval; dashed: unpatched.",
    plot_localization,
    group="probe",
    order=100,
)
register_figure(
    "attribution",
    "Attribution patching by layer, component and head",
    "Estimated recovered share of the output KL between the views (c→x) when one site's activation at every "
    "scored position takes the context view's value: −(a_c − a_x)·∂KL/∂a / KL, per decoder layer and component "
    "(resid, attn, mlp) and per query head (o_proj's input); the panel title gives its Pearson correlation with "
    "exact patching on the same sites.",
    plot_attribution,
    group="probe",
    order=110,
)
register_figure(
    "pmi",
    "The teacher's pointwise mutual information with the context",
    "Per response token of the trained student's reply: the teacher's log f(y|c,x) − log f(y|x) against the OPD "
    "loss KL(q_x ‖ f_c) at that token; red: the token where the context view of a student right without c first "
    "leaves its reply (Harm's token).",
    plot_pmi,
    group="probe",
    order=120,
)
