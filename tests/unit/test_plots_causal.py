"""The causal probes' figures draw exactly the values of their tables (written by the probes' own writer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mechopd.plots.causal import figure_attention_context, figure_lens_kl, figure_patching

from .causal_artifacts import HEADS, LAYERS, MODELS
from .plotting_run import make_run, panels


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("causal_plots"))


def _rows(run: Path, name: str) -> list[dict]:
    from mechopd.core.artifacts import read_csv

    return read_csv(run / "probes" / f"{name}.csv")


def test_lens_lines_are_the_table(run):
    ax = panels(figure_lens_kl(run))[0]
    lines = ax.get_lines()
    assert len(lines) == len(MODELS)
    rows = _rows(run, "lens")
    for line, m in zip(lines, MODELS):
        want = [float(r["kl_c_x"]) for r in sorted((r for r in rows if r["model"] == m), key=lambda r: int(r["depth"]))]
        np.testing.assert_allclose(line.get_ydata(), want)
        assert list(line.get_xdata()) == list(range(LAYERS + 2))


def test_patching_heatmap_is_the_c_to_x_recovered(run):
    axes = panels(figure_patching(run))
    assert len(axes) == len(MODELS)
    rows = [r for r in _rows(run, "patching") if r["direction"] == "c_to_x"]
    for ax, m in zip(axes, MODELS):
        grid = ax.get_images()[0].get_array()
        for r in (r for r in rows if r["model"] == m):
            i, j = int(r["depth"]), ("resid", "attn", "mlp").index(r["component"])
            assert grid[i, j] == pytest.approx(float(r["recovered"]))
        assert np.ma.is_masked(grid[0, 1])  # embed has no attention component


def test_attention_heatmaps_and_the_nca_minus_opd_panel(run):
    axes = panels(figure_attention_context(run))
    assert len(axes) == len(MODELS) + 1
    share = {(r["model"], int(r["layer"]), int(r["head"])): float(r["context_share"]) for r in _rows(run, "attention")}
    grids = [ax.get_images()[0].get_array() for ax in axes]
    for g, m in zip(grids, MODELS):
        assert g.shape == (LAYERS, HEADS) and g[1, 2] == pytest.approx(share[(m, 1, 2)])
    assert grids[-1][2, 3] == pytest.approx(share[("nca", 2, 3)] - share[("opd", 2, 3)])
