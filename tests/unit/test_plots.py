"""Figure set (mechopd.plots): every figure from a synthetic run directory written by the REAL writers of each artifact
(removability.summarize, view_cosine.CosineAccumulator + artifacts.write_rows, grad_align.aggregate + write_gradients,
delta_sums.parameter_deltas + delta_rows.write_table on tiny safetensors checkpoints, teachability.summarize), so that a format change
in a writer breaks these tests. Drawn values are compared with the artifacts (or, for deltas, with norms computed
directly from the weights); files are checked to be real PNG / PDF and byte-identical when redrawn."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.container import ErrorbarContainer
from PIL import Image

from mechopd import plots
from mechopd.core.errors import DataError
from mechopd.evaluation.removability import RegimeThresholds, summarize

from .plotting_run import EVAL_STEPS, GRAD_STEPS, METHODS, _records, bar_containers, make_run, panels, summary


def test_draw_all_writes_every_figure_as_valid_png_and_pdf(run_dir: Path, drawn: dict[str, list[Path]]) -> None:
    assert list(drawn) == [f.name for f in plots.figure_index()]
    for name, paths in drawn.items():
        assert [p.name for p in paths] == [f"{name}.png", f"{name}.pdf"], name
        assert all(p.parent == run_dir / "figures" for p in paths)
        png, pdf = paths
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(png) as im:
            im.verify()
        with Image.open(png) as im:
            assert im.size[0] > 300 and im.size[1] > 200
        assert pdf.read_bytes()[:5] == b"%PDF-"


def test_redrawing_gives_byte_identical_files(run_dir: Path, drawn: dict[str, list[Path]], tmp_path: Path) -> None:
    again = plots.draw_all(run_dir, tmp_path / "again")
    for name, paths in drawn.items():
        for first, second in zip(paths, again[name]):
            assert first.read_bytes() == second.read_bytes(), f"{first.name} differs when redrawn"


def test_png_has_no_timestamp_or_version_metadata(drawn: dict[str, list[Path]]) -> None:
    with Image.open(drawn["removability"][0]) as im:
        text = " ".join(f"{k}={v}" for k, v in im.info.items())
    assert "Software" not in text and "Creation" not in text
    assert b"CreationDate" not in drawn["removability"][1].read_bytes()


BUILTIN_FIGURES = (
    "training_curves",
    "gradient_training",
    "removability",
    "regime_map",
    "context_following",
    "layer_cosine",
    "gradient_alignment",
    "parameter_deltas",
    "teachability",
    "budget_curve",
)


def test_figure_index_names_title_and_caption_for_each_figure() -> None:
    index = plots.figure_index()  # registered figures: no count pinned (a new figure is one registration)
    names = [f.name for f in index]
    assert len(set(names)) == len(names) and set(BUILTIN_FIGURES) <= set(names)
    for f in index:
        name, title, caption = f
        assert title and len(caption) > 40
    for name in BUILTIN_FIGURES:
        assert hasattr(plots, f"plot_{name}") and hasattr(plots, f"figure_{name}")


# ------------------------------------------------------------------------------------------------------- content
def test_training_curves_two_lines_per_method_with_the_logged_values(run_dir: Path) -> None:
    ax = panels(plots.figure_training_curves(run_dir))[0]
    lines = ax.get_lines()
    assert len(lines) == 2 * len(METHODS)
    by_label = {line.get_label(): line for line in lines}
    recs = [json.loads(s) for s in (run_dir / "train" / "opd" / "metrics.jsonl").read_text().splitlines()]
    solid = by_label["OPD, without context"]
    assert list(solid.get_xdata()) == list(EVAL_STEPS) and solid.get_linestyle() == "-"
    np.testing.assert_allclose(solid.get_ydata(), [100 * r["eval/acc_x"] for r in recs if "eval/acc_x" in r])
    dashed = by_label["OPD, with context"]
    assert dashed.get_linestyle() == "--" and dashed.get_color() == solid.get_color()
    assert list(by_label["TA-OPD, with context"].get_xdata()) == [0, 6]  # the null at step 3 is dropped
    assert len({line.get_color() for line in lines}) == len(METHODS)


def test_gradient_training_cosine_and_norm_ratio_per_run(run_dir: Path) -> None:
    ax_cos, ax_ratio = panels(plots.figure_gradient_training(run_dir))
    recs = [json.loads(s) for s in (run_dir / "train" / "nca" / "metrics.jsonl").read_text().splitlines()]
    grad = [r for r in recs if "grad/cos/opd__nca" in r]
    cos = {ln.get_label(): ln for ln in ax_cos.get_lines() if ln.get_label().startswith("NCA")}["NCA: opd vs nca"]
    assert list(cos.get_xdata()) == list(GRAD_STEPS)
    np.testing.assert_allclose(cos.get_ydata(), [r["grad/cos/opd__nca"] for r in grad])
    ratio = [ln for ln in ax_ratio.get_lines() if ln.get_label() == "NCA: opd vs nca"][0]
    np.testing.assert_allclose(ratio.get_ydata(), [r["grad/norm/opd"] / r["grad/norm/nca"] for r in grad])
    assert ax_ratio.get_yscale() == "log"
    assert {ln.get_label() for ln in ax_cos.get_lines()} >= {"OPD: opd vs nca", "NCA: opd vs nca"}


def test_training_curves_over_seeds_draw_the_mean_and_a_t_band(run_dir: Path, tmp_path: Path) -> None:
    from matplotlib.collections import PolyCollection

    other = make_run(tmp_path / "seed1", seed=1)
    agg = tmp_path / "agg"
    agg.mkdir()
    meta = json.loads((run_dir / "demo.json").read_text())
    (agg / "demo.json").write_text(json.dumps({**meta, "seed_runs": [str(run_dir), str(other)]}))
    ax = panels(plots.figure_training_curves(agg))[0]
    solid = {ln.get_label(): ln for ln in ax.get_lines()}["OPD, without context"]
    vals = [
        [
            json.loads(s)["eval/acc_x"]
            for s in (r / "train" / "opd" / "metrics.jsonl").read_text().splitlines()
            if "eval/acc_x" in json.loads(s)
        ]
        for r in (run_dir, other)
    ]
    np.testing.assert_allclose(solid.get_ydata(), 50 * (np.array(vals[0]) + np.array(vals[1])))
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) >= len(METHODS)  # one band per method and view with a defined interval
    half = 12.7062 * np.abs(100 * np.array(vals[0]) - 100 * np.array(vals[1])) / 2  # t(1) * sd / sqrt(2)
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert ys.max() == pytest.approx(np.minimum(solid.get_ydata() + half, 100.0).max(), rel=1e-4)  # clipped
    assert ys.min() >= 0.0


def test_removability_bars_heights_and_skipped_error_bars(run_dir: Path) -> None:
    left, right = panels(plots.figure_removability(run_dir))
    models = ["base", *METHODS]
    assert len(bar_containers(left)) == len(models) and len(bar_containers(right)) == len(models)
    for name, bars, dl in zip(models, bar_containers(left), bar_containers(right)):
        s = summary(run_dir, name)
        expected = [
            0.0 if s[m]["value"] is None else 100 * s[m]["value"] for m in ("acc_x", "acc_xc", "harm", "both_correct")
        ]
        np.testing.assert_allclose([p.get_height() for p in bars.patches], expected)
        assert dl.patches[0].get_height() == pytest.approx(100 * s["delta_len"]["value"])
    errbars = [c for c in left.containers if isinstance(c, ErrorbarContainer)]
    n_intervals = sum(
        summary(run_dir, n)[m]["low"] is not None for n in models for m in ("acc_x", "acc_xc", "harm", "both_correct")
    )
    assert sum(len(c.lines[2][0].get_segments()) for c in errbars) == n_intervals
    assert summary(run_dir, "ta_opd")["harm"]["value"] is None
    assert "n/a" in [t.get_text() for t in left.texts]


def _offsets(ax) -> list[tuple[float, float]]:
    return [tuple(c.get_offsets()[0]) for c in ax.collections if isinstance(c, PathCollection)]


def test_regime_map_one_point_per_model_with_defined_harm(run_dir: Path) -> None:
    ax = panels(plots.figure_regime_map(run_dir))[0]
    expected = []
    for name in ("base", *METHODS):
        s = summary(run_dir, name)
        if s["harm"]["value"] is not None:
            expected.append((100 * (s["acc_x"]["value"] - s["acc_xc"]["value"]), 100 * s["harm"]["value"]))
    assert len(expected) == 3
    np.testing.assert_allclose(_offsets(ax), expected)
    assert sum(1 for p in ax.patches) == 4  # A (two boxes), B, C
    assert {t.get_text()[0] for t in ax.texts} == {"A", "B", "C"}


def test_regime_map_over_several_runs_marks_tasks(tmp_path: Path, run_dir: Path) -> None:
    other = make_run(tmp_path, task="frozenlake", seed=1)
    fig = plots.figure_regime_map([run_dir, other])
    ax = panels(fig)[0]
    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(points) == 6
    markers = {tuple(np.round(c.get_paths()[0].vertices, 6).ravel()) for c in points}
    assert len(markers) == 2  # one marker per task
    model_legend, task_legend = fig.legends
    assert [t.get_text() for t in task_legend.get_texts()] == ["rules", "frozenlake"]
    assert [t.get_text() for t in model_legend.get_texts()] == ["Base", "OPD", "NCA"]
    paths = plots.plot_regime_map([run_dir, other], tmp_path / "figs")
    assert [p.suffix for p in paths] == [".png", ".pdf"]


def test_regime_thresholds_come_from_demo_json_else_from_the_reports(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "demo.json").write_text(
        json.dumps(
            {"task": "rules", "methods": ["opd"], "thresholds": {"drop_min": 0.07, "harm_high": 0.3, "gain_min": 0.04}}
        )
    )
    recs = _records(rng, 0.8, 0.6)
    own = RegimeThresholds(drop_min=0.05, harm_high=0.2, gain_min=0.01)
    (run / "eval" / "opd.json").write_text(json.dumps({"summary": summarize(recs, n_boot=0, thresholds=own)}))
    ax = panels(plots.figure_regime_map(run))[0]
    assert "drop_min 0.07, harm_high 0.3, gain_min 0.04" in ax.get_title()
    (run / "demo.json").write_text(json.dumps({"task": "rules", "methods": ["opd"]}))
    ax = panels(plots.figure_regime_map(run))[0]
    assert "drop_min 0.05, harm_high 0.2, gain_min 0.01" in ax.get_title()
    boxes = {(round(p.get_x() + p.get_width(), 9), round(p.get_y() + p.get_height(), 9)) for p in ax.patches}
    assert (-1.0, 20.0) in boxes  # region B ends at −gain_min and Harm = harm_high (in %)
    assert (5.0, 20.0) in boxes  # region C ends at drop_min
    (run / "demo.json").write_text(json.dumps({"methods": ["opd"], "thresholds": {"drop_min": 2.0}}))
    with pytest.raises(DataError, match="demo.json"):
        plots.figure_regime_map(run)
