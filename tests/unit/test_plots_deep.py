"""Figures stay legible at 30 layers (#54, a real model's depth): parameter_deltas keeps a readable size, the layer
axis labels every k-th layer, and no tick label of layer_cosine overlaps another."""

from __future__ import annotations

import pytest
from matplotlib.transforms import Bbox

from mechopd.plots import _common
from mechopd.plots.layers import figure_layer_cosine, figure_parameter_deltas

from . import plotting_run
from .test_plot_layout import layout_problems


@pytest.fixture
def deep_run(tmp_path, monkeypatch):
    monkeypatch.setattr(plotting_run, "N_LAYERS", 30)
    return plotting_run.make_run(tmp_path)


def _labels(ax, axis: str) -> list[Bbox]:
    fig = ax.figure
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ticks = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t.get_window_extent(r) for t in ticks if t.get_visible() and t.get_text()]


def _overlapping(boxes: list[Bbox], gap: float = 4.0) -> list[tuple[int, int]]:
    """Pairs of labels closer than ``gap`` pixels (touching labels read as one: "embed1")."""
    wide = [b.padded(gap / 2) for b in boxes]
    return [(i, j) for i in range(len(wide)) for j in range(i + 1, len(wide)) if wide[i].overlaps(wide[j])]


def test_parameter_deltas_at_30_layers_is_a_readable_size(deep_run):
    fig = figure_parameter_deltas(deep_run)
    width, height = (v * _common.DPI for v in fig.get_size_inches())
    assert height < 2000 and width < 1200, (width, height)  # was 975 x 4627 px
    for ax in [a for a in fig.axes if a.get_ylabel() == "decoder layer"]:
        assert len(_labels(ax, "y")) <= 13 and not _overlapping(_labels(ax, "y"))
    assert layout_problems(fig) == []


def test_layer_cosine_at_30_layers_has_no_overlapping_ticks(deep_run):
    fig = figure_layer_cosine(deep_run)
    ax = fig.axes[0]
    assert not _overlapping(_labels(ax, "x"))
    assert layout_problems(fig) == []


def test_layer_cosine_title_clears_the_legend(tmp_path, monkeypatch):
    """The title stays clear of the figure legend (the demo's long NCA label pushed the legend over its end)."""
    monkeypatch.setitem(plotting_run.LABELS, "nca", "NCA (β=0.5, from step 2)")
    fig = figure_layer_cosine(plotting_run.make_run(tmp_path))
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    title = fig.axes[0].title.get_window_extent(r)
    assert not any(title.padded(5).overlaps(leg.get_window_extent(r)) for leg in fig.legends)  # 5 px apart at least
