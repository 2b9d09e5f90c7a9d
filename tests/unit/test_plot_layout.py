"""Figure layout: no title, axis label, tick label or legend of any drawn figure is clipped, and no figure legend or
title sits on top of another panel's data area.

Every figure `draw_all` writes is checked as it is saved (Figure.savefig is wrapped), so a figure a new probe
registers is checked without touching this file. Drawn from the synthetic run of plotting_run.py, once for one run and
once for a three-seed aggregate with labels as long as the demo's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from mechopd import plots

from .plotting_run import make_run

TOL = 0.5  # pixels


def _tick_label_ids(fig: Figure) -> set[int]:
    return {
        id(lab)
        for ax in fig.axes
        for axis in (ax.xaxis, ax.yaxis)
        for tick in axis.get_major_ticks() + axis.get_minor_ticks()
        for lab in (tick.label1, tick.label2)
    }


def _inside(bb: Bbox, outer: Bbox) -> bool:
    return bb.x0 >= outer.x0 - TOL and bb.y0 >= outer.y0 - TOL and bb.x1 <= outer.x1 + TOL and bb.y1 <= outer.y1 + TOL


def _overlap(a: Bbox, b: Bbox) -> bool:
    return a.x0 < b.x1 - TOL and b.x0 < a.x1 - TOL and a.y0 < b.y1 - TOL and b.y0 < a.y1 - TOL


def layout_problems(fig: Figure) -> list[str]:
    """What is clipped or covered in ``fig`` as it will be saved (its layout already executed)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    frame, problems = fig.bbox, []
    ticks = _tick_label_ids(fig)
    for t in fig.findobj(Text):  # titles, axis labels, legend entries, annotations (tick labels: below)
        if id(t) not in ticks and t.get_visible() and t.get_text().strip():
            if not _inside(t.get_window_extent(r), frame):
                problems.append(f"text {t.get_text()[:40]!r} is clipped")
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):  # only the tick labels actually drawn (inside the view limits)
            bb = axis.get_tightbbox(r)
            if bb is not None and not _inside(bb, frame):
                problems.append(f"{axis.axis_name}-axis of the panel {ax.get_title()[:30]!r} is clipped")
    problems += _legends_over_data(fig, r)
    data_areas = [ax.get_window_extent(r) for ax in fig.axes if ax.get_label() != "<colorbar>"]
    titles = [t for t in [fig._suptitle] + [ax.title for ax in fig.axes] if t is not None and t.get_text().strip()]
    for legend in fig.legends:
        bb = legend.get_window_extent(r)
        if any(_overlap(bb, area) for area in data_areas):
            problems.append("a figure legend covers a panel")
        if any(_overlap(bb, t.get_window_extent(r)) for t in titles):
            problems.append("a figure legend covers a title")
    return problems


def _data_points(ax) -> np.ndarray:
    """Display coordinates of every drawn data point of ``ax`` (line vertices, scatter offsets)."""
    pts = [
        ln.get_transform().transform(np.column_stack(ln.get_data()).astype(float))
        for ln in ax.get_lines()
        if ln.get_visible() and len(ln.get_xdata())
    ]
    pts += [
        c.get_offset_transform().transform(c.get_offsets())
        for c in ax.collections
        if isinstance(c, PathCollection) and c.get_visible() and len(c.get_offsets())
    ]
    pts = [p for p in pts if len(p)]
    return np.concatenate(pts) if pts else np.empty((0, 2))


def _legends_over_data(fig: Figure, r) -> list[str]:
    """An axes legend or a figure legend that sits on a drawn data point of any panel."""
    legends = [lg for lg in [ax.get_legend() for ax in fig.axes] + list(fig.legends) if lg is not None]
    out = []
    for lg in legends:
        bb = lg.get_window_extent(r)
        for ax in fig.axes:
            pts = _data_points(ax)
            inside = (pts[:, 0] > bb.x0) & (pts[:, 0] < bb.x1) & (pts[:, 1] > bb.y0) & (pts[:, 1] < bb.y1)
            if np.isfinite(pts).all(1)[inside].any():
                out.append(f"a legend covers data of the panel {ax.get_title()[:30]!r}")
    return out


def edge_ink(png: Path, border: int = 2) -> dict[str, int]:
    """Dark pixels (grey < 200) in the outer ``border`` pixels of a saved PNG, per side: text cut by the canvas edge
    (the check of ../shared/tools/figure_edges.py, as a person sees the file)."""
    from PIL import Image

    a = np.asarray(Image.open(png).convert("L")).astype(int)
    sides = {"top": a[:border], "bottom": a[-border:], "left": a[:, :border], "right": a[:, -border:]}
    return {k: int((v < 200).sum()) for k, v in sides.items() if (v < 200).any()}


@pytest.fixture
def checked(monkeypatch):
    """Wrap Figure.savefig: every figure saved as PNG is checked; returns {file name: problems}."""
    found: dict[str, list[str]] = {}
    original = Figure.savefig

    current: list[str] = []  # the file being written: figures are saved through an atomic writer's file handle
    import mechopd.plots._common as common

    writer = common.atomic_write

    def atomic_write(path, write, *args, **kwargs):
        current.append(Path(path).name)
        try:
            return writer(path, write, *args, **kwargs)
        finally:
            current.pop()

    def savefig(self, fname, *args, **kwargs):
        name = current[-1] if current else Path(str(fname)).name
        if name.endswith(".png"):
            found[name] = layout_problems(self)
        return original(self, fname, *args, **kwargs)

    monkeypatch.setattr(common, "atomic_write", atomic_write)
    monkeypatch.setattr(Figure, "savefig", savefig)
    return found


def test_no_figure_of_a_run_is_clipped(run_dir: Path, tmp_path: Path, checked) -> None:
    written = plots.draw_all(run_dir, tmp_path / "figs")
    names = {p.name for paths in written.values() for p in paths if p.suffix == ".png"}
    assert names and set(checked) == names
    assert {k: v for k, v in checked.items() if v} == {}


def test_no_figure_of_a_seed_aggregate_is_clipped(tmp_path: Path, checked) -> None:
    runs = [make_run(tmp_path / f"seed-{k}", seed=k) for k in range(3)]  # three seeds, as `mechopd demo --seeds 3`
    meta = json.loads((runs[0] / "demo.json").read_text())
    meta["labels"].update({"opd": "OPD", "nca": "NCA (β=0.5, KL gate 0.1)", "ta_opd": "TA-OPD (ρ=0.10, kept 0.11)"})
    agg = runs[0]  # the seed-0 run directory doubles as the aggregate: its demo.json lists the three runs
    (agg / "demo.json").write_text(json.dumps({**meta, "seed_runs": [str(r) for r in runs]}))
    written = plots.draw_all(agg, tmp_path / "figs")
    assert written["training_curves"] and written["gradient_training"]
    assert {k: v for k, v in checked.items() if v} == {}


def test_the_check_finds_a_clipped_label(checked) -> None:
    """The check itself: a y-label longer than the figure is reported."""
    from mechopd.plots._common import new_figure

    fig = new_figure(3.0, 2.0)
    ax = fig.add_subplot()
    ax.set_ylabel("a y-label far too long for a figure two inches tall, which is clipped at both ends")
    fig.get_layout_engine().execute(fig)
    assert any("clipped" in p for p in layout_problems(fig))


DEMO_LABELS = {
    "base": "base",
    "opd": "OPD",
    "nca": "NCA (β=0.5, KL gate 0.1) + follow (w=1)",
    "ta_opd": "TA-OPD (ρ=0.10, kept 0.10)",
}  # as long as `mechopd demo`'s


def test_the_regime_map_with_the_demos_labels(tmp_path: Path, checked) -> None:
    """The regime map as the demo draws it (labels as long as the demo's): no clipped title, no legend on the title
    or on a point, and no ink at the saved PNG's edge."""
    run = make_run(tmp_path / "run")
    meta = json.loads((run / "demo.json").read_text())
    meta["labels"].update(DEMO_LABELS)
    (run / "demo.json").write_text(json.dumps(meta))
    written = plots.plot_regime_map(run, tmp_path / "figs")
    assert checked == {"regime_map.png": []}
    assert edge_ink(next(p for p in written if p.suffix == ".png")) == {}


def test_every_saved_png_of_a_run_has_a_clean_edge(run_dir: Path, tmp_path: Path) -> None:
    written = plots.draw_all(run_dir, tmp_path / "figs")
    pngs = [p for paths in written.values() for p in paths if p.suffix == ".png"]
    assert pngs and {p.name: edge_ink(p) for p in pngs if edge_ink(p)} == {}


def test_the_check_finds_a_legend_over_data(checked) -> None:
    from mechopd.plots._common import new_figure

    fig = new_figure(3.0, 2.0)
    ax = fig.add_subplot()
    ax.plot([0, 1, 2], [0, 1, 0], label="a line")
    ax.scatter([1.0], [0.95], label="a point")
    ax.legend(loc="upper center")
    fig.get_layout_engine().execute(fig)
    assert any("covers data" in p for p in layout_problems(fig))


def test_the_regime_map_of_two_tasks_with_the_demos_labels(tmp_path: Path, checked) -> None:
    runs = [make_run(tmp_path / "rules"), make_run(tmp_path / "lake", task="frozenlake", seed=1)]
    for run in runs:
        meta = json.loads((run / "demo.json").read_text())
        meta["labels"].update(DEMO_LABELS)
        (run / "demo.json").write_text(json.dumps(meta))
    written = plots.plot_regime_map(runs, tmp_path / "figs")
    assert checked == {"regime_map.png": []}
    assert edge_ink(next(p for p in written if p.suffix == ".png")) == {}
