"""Plot tests of the probe figures (layer cosine, gradients, deltas, teachability, budget) and the artifact rules."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import QuadMesh
from matplotlib.colors import to_rgb
from matplotlib.container import ErrorbarContainer

from mechopd import plots
from mechopd.core import sites
from mechopd.core.errors import DataError
from mechopd.probes import delta_rows, delta_sums, deltas, gradients, teachability, teachability_analysis

from .plotting_run import BUDGETS, LABELS, METHODS, MODULES, N_LAYERS, SELECTORS, bar_containers, make_run, panels


def test_layer_cosine_one_line_per_model_over_every_site(run_dir: Path) -> None:
    ax = panels(plots.figure_layer_cosine(run_dir))[0]
    with open(run_dir / "probes" / "similarity.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(ax.get_lines()) == 3
    for line in ax.get_lines():
        model = {v: k for k, v in LABELS.items()}[line.get_label()]
        mine = sorted((int(r["depth"]), float(r["cos_mean"])) for r in rows if r["model"] == model)
        assert list(line.get_xdata()) == [d for d, _ in mine] == list(range(N_LAYERS + 2))
        np.testing.assert_allclose(line.get_ydata(), [c for _, c in mine])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["embed", "0", "1", "2", "final norm"]


def test_gradient_heatmap_matches_layer_module_rows(run_dir: Path) -> None:
    ax = panels(plots.figure_gradient_alignment(run_dir))[0]
    meshes = [c for c in ax.collections if isinstance(c, QuadMesh)]
    assert len(meshes) == 1
    with open(run_dir / "probes" / "gradients.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    cells = {
        (int(r["layer"]), r["module"]): float(r["cos"]) for r in rows if r["scope"] == "layer_module" and r["layer"]
    }
    modules = [t.get_text() for t in ax.get_xticklabels()]
    assert modules == [m for m in sites.MODULE_ORDER if m in MODULES]
    expected = np.array([[cells[(i, m)] for m in modules] for i in range(N_LAYERS)])
    np.testing.assert_allclose(np.asarray(meshes[0].get_array()).reshape(expected.shape), expected)
    glob = next(float(r["cos"]) for r in rows if r["scope"] == "global")
    assert f"global cos = {glob:+.3f}" in ax.get_title()


def _rel(ckpts: dict[str, Path], a: str, b: str, site: str) -> float:
    """Slow reference: ‖θ_b − θ_a‖_F / ‖W0‖_F of one site, straight from the weights."""
    from safetensors.torch import load_file

    w = {k: load_file(str(p / "model.safetensors")) for k, p in ckpts.items()}
    name = next(n for n in w["base"] if n.startswith(f"model.{site}."))
    return float((w[b][name].double() - w[a][name].double()).norm() / w["base"][name].double().norm())


def test_parameter_delta_panels_match_norms_from_the_weights(run_dir: Path) -> None:
    fig = plots.figure_parameter_deltas(run_dir)
    axes = panels(fig)
    assert len(axes) == 3
    assert [ax.get_title().split(":")[0] for ax in axes] == ["OPD", "NCA", "NCA − OPD"]
    ckpts = {k: run_dir.parent / "rules_ckpts" / k for k in ("base", "opd", "nca")}
    modules = [t.get_text() for t in axes[-1].get_xticklabels()]  # named once, under the last panel
    assert modules and all(modules)
    sub = {
        "q_proj": "self_attn",
        "k_proj": "self_attn",
        "v_proj": "self_attn",
        "o_proj": "self_attn",
        "gate_proj": "mlp",
        "up_proj": "mlp",
        "down_proj": "mlp",
    }
    for ax, (a, b) in zip(axes, (("base", "opd"), ("base", "nca"), ("opd", "nca"))):
        grid = np.asarray([c for c in ax.collections if isinstance(c, QuadMesh)][0].get_array())
        grid = grid.reshape(N_LAYERS, len(modules))
        for i, j in ((0, 1), (2, len(modules) - 1), (1, 0)):
            m = modules[j]
            site = f"layers.{i}.{sub[m] + '.' if m in sub else ''}{m}"
            assert grid[i, j] == pytest.approx(_rel(ckpts, a, b, site), rel=1e-9)
    vmax = {ax.collections[0].norm.vmax for ax in axes}
    assert len(vmax) == 1  # one colour scale


def test_teachability_panels_show_buckets_gap_and_regression(run_dir: Path) -> None:
    axes = panels(plots.figure_teachability(run_dir))
    assert len(axes) == 6 and all(len(bar_containers(ax)) == 1 for ax in axes)
    s = json.loads((run_dir / "probes" / teachability.SUMMARY_NAME).read_text())
    for ax, signal in zip(axes, teachability_analysis.BUCKET_SIGNALS):
        heights = [p.get_height() for p in bar_containers(ax)[0].patches]
        np.testing.assert_allclose(heights, [r["mean_gain_abs"] for r in s["buckets"][signal]])
    gap = s["gap"]["gain_abs"]
    gap_bars = bar_containers(axes[4])[0].patches
    assert gap_bars[2].get_height() == pytest.approx(gap["estimate"])
    err = [c for c in axes[4].containers if isinstance(c, ErrorbarContainer)]
    (seg,) = err[0].lines[2][0].get_segments()
    np.testing.assert_allclose(seg[:, 1], [gap["ci_low"], gap["ci_high"]])


def test_budget_curve_one_line_per_selector(run_dir: Path) -> None:
    ax = panels(plots.figure_budget_curve(run_dir))[0]
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["TA-OPD", "random", "entropy"]
    assert all(list(line.get_xdata()) == [100 * b for b in BUDGETS] for line in lines)  # null at ρ=1 left out
    notes = sorted(t.get_text() for t in ax.texts)  # every point says the kept fraction it measured
    assert notes == sorted(f"kept {b + 0.01:.2f}" for _ in SELECTORS for b in BUDGETS)


def test_parameter_deltas_from_an_already_aggregated_table(run_dir: Path, tmp_path: Path) -> None:
    per_tensor = delta_rows.read_table(run_dir / "probes" / "deltas.csv")
    run = tmp_path / "agg"
    (run / "probes").mkdir(parents=True)
    (run / "demo.json").write_text((run_dir / "demo.json").read_text())
    delta_rows.write_table(
        delta_sums.aggregate_deltas(per_tensor, "site") + delta_sums.aggregate_deltas(per_tensor, "all"),
        run / "probes" / "deltas",
    )
    grids = [
        [np.asarray(c.get_array()) for c in ax.collections if isinstance(c, QuadMesh)][0]
        for ax in panels(plots.figure_parameter_deltas(run))
    ]
    expected = [
        [np.asarray(c.get_array()) for c in ax.collections if isinstance(c, QuadMesh)][0]
        for ax in panels(plots.figure_parameter_deltas(run_dir))
    ]
    assert len(grids) == 3
    for got, want in zip(grids, expected):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_method_keeps_its_colour_across_figures(run_dir: Path) -> None:
    curves = {line.get_label(): line.get_color() for line in panels(plots.figure_training_curves(run_dir))[0].lines}
    bars = bar_containers(panels(plots.figure_removability(run_dir))[0])
    budget = {line.get_label(): line.get_color() for line in panels(plots.figure_budget_curve(run_dir))[0].lines}
    for k, method in enumerate(METHODS):
        colour = to_rgb(curves[f"{LABELS[method]}, without context"])
        assert to_rgb(bars[k + 1].patches[0].get_facecolor()) == pytest.approx(colour)
    assert to_rgb(budget["TA-OPD"]) == pytest.approx(to_rgb(curves["TA-OPD, without context"]))
    assert to_rgb(bars[0].patches[0].get_facecolor()) == pytest.approx(to_rgb("#949494"))  # base: the palette's grey
    assert len({to_rgb(c) for c in curves.values()} | {to_rgb(bars[0].patches[0].get_facecolor())}) == 4


def test_column_names_kept_in_plots_match_the_probe_writers() -> None:
    from dataclasses import fields

    from mechopd.plots import layers as plot_layers
    from mechopd.plots import teachability as plot_teach

    assert plot_layers.GRAD_COLUMNS == tuple(f.name for f in fields(gradients.GradRow))
    assert (plot_teach.SUMMARY_NAME, plot_teach.BUCKET_SIGNALS, plot_teach.GAINS) == (
        teachability.SUMMARY_NAME,
        teachability_analysis.BUCKET_SIGNALS,
        teachability_analysis.GAINS,
    )
    assert plot_layers.BASE == deltas.BASE


# ------------------------------------------------------------------------------------------------ absent / broken
def test_missing_artifacts_yield_empty_lists_without_raising(tmp_path: Path, caplog) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with caplog.at_level(logging.INFO, logger="mechopd.plots"):
        result = plots.draw_all(empty)
    assert result == {f.name: [] for f in plots.figure_index()}
    assert not (empty / "figures").exists()
    assert "not found" in caplog.text and "similarity.csv" in caplog.text


def test_one_missing_artifact_skips_only_its_figure(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run / "sweep" / "sweep.json").unlink()
    assert plots.plot_budget_curve(run, tmp_path / "out") == []
    assert plots.figure_budget_curve(run) is None
    assert [p.name for p in plots.plot_training_curves(run, tmp_path / "out")] == [
        "training_curves.png",
        "training_curves.pdf",
    ]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["training_curves.pdf", "training_curves.png"]


def test_malformed_artifacts_raise_data_errors_naming_the_file(tmp_path: Path) -> None:
    run = tmp_path / "bad"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "base.json").write_text("{not json")
    with pytest.raises(DataError, match="base.json"):
        plots.plot_removability(run, tmp_path / "out")
    (run / "probes").mkdir()
    (run / "probes" / "similarity.csv").write_text("model,site\nbase,embed\n")
    with pytest.raises(DataError, match="cos_mean"):
        plots.plot_layer_cosine(run, tmp_path / "out")


def test_plotting_leaves_the_callers_rcparams_alone(run_dir: Path, tmp_path: Path) -> None:
    import matplotlib as mpl

    before = dict(mpl.rcParams)
    plots.plot_budget_curve(run_dir, tmp_path)
    after = dict(mpl.rcParams)
    assert {k for k in before if before[k] != after[k]} <= {"backend"}  # noqa: E501 (backend may resolve lazily)
