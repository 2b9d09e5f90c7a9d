"""Figure set (mechopd.plots): every figure from a synthetic run directory written by the REAL writers of each artifact
(removability.summarize, similarity.CosineAccumulator + write_rows, gradients.aggregate + write_gradients,
deltas.parameter_deltas + write_table on tiny safetensors checkpoints, teachability.summarize), so that a format change
in a writer breaks these tests. Drawn values are compared with the artifacts (or, for deltas, with norms computed
directly from the weights); files are checked to be real PNG / PDF and byte-identical when redrawn."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.collections import PathCollection, QuadMesh
from matplotlib.colors import to_rgb
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure
from PIL import Image
from safetensors.torch import save_file

from mechopd import plots
from mechopd.artifacts import json_safe
from mechopd.errors import DataError
from mechopd.probes import deltas, gradients, similarity, teachability
from mechopd.probes.capture import sites_for
from mechopd.removability import RegimeThresholds, summarize

METHODS = ("opd", "nca", "ta_opd")
LABELS = {"base": "Base", "opd": "OPD", "nca": "NCA", "ta_opd": "TA-OPD"}
THRESHOLDS = {"drop_min": 0.02, "harm_high": 0.10, "gain_min": 0.02}
N_LAYERS = 3
MODULES = ("input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SELECTORS = ("ta_opd", "random", "entropy")
BUDGETS = (0.05, 0.1, 0.3, 0.5)
EVAL_STEPS = (0, 3, 6)
GRAD_METHODS = ("opd", "nca")
GRAD_STEPS = (1, 4)


# --------------------------------------------------------------------------------------------- synthetic run dir
def _param_names() -> list[str]:
    names = ["model.embed_tokens.weight"]
    for i in range(N_LAYERS):
        for m in MODULES:
            part = "self_attn" if m.endswith("proj") and m[0] in "qkvo" else "mlp" if m.endswith("proj") else ""
            names.append(f"model.layers.{i}.{part + '.' if part else ''}{m}.weight")
    return names + ["model.norm.weight"]


def _records(rng: np.random.Generator, p_x: float, p_xc: float, n: int = 40) -> list[dict]:
    cx, cxc = rng.random(n) < p_x, rng.random(n) < p_xc
    return [{"correct_x": bool(a), "correct_xc": bool(b), "len_x": float(rng.integers(5, 15)),
             "len_xc": float(rng.integers(5, 20))} for a, b in zip(cx, cxc)]


def _write_eval(run: Path, rng: np.random.Generator) -> None:
    probs = {"base": (0.5, 0.7), "opd": (0.8, 0.6), "nca": (0.8, 0.8), "ta_opd": (0.0, 0.3)}  # ta_opd: Harm undefined
    (run / "eval").mkdir(parents=True)
    for name, (px, pxc) in probs.items():
        recs = _records(rng, px, pxc)
        report = {"summary": summarize(recs, n_boot=40, seed=0), "records": recs, "settings": {"task": "rules"}}
        (run / "eval" / f"{name}.json").write_text(json.dumps(report))


def _write_metrics(run: Path, rng: np.random.Generator) -> None:
    for method in METHODS:
        d = run / "train" / method
        d.mkdir(parents=True)
        lines = []
        for step in range(7):
            rec = {"step": step, "loss": float(rng.random())} if step else {"step": 0}
            if step in EVAL_STEPS:
                rec.update({"eval/acc_x": float(rng.random()), "eval/acc_xc": float(rng.random()), "eval/harm": None})
            if method == "ta_opd" and step == 3:
                rec["eval/acc_xc"] = None  # undefined: dropped from the dashed curve
            if method in GRAD_METHODS and step in GRAD_STEPS:
                rec.update({"grad/norm/opd": float(rng.random()) + 0.1, "grad/norm/nca": float(rng.random()) + 0.1,
                            "grad/cos/opd__nca": float(rng.random() * 2 - 1)})
            lines.append(json.dumps(rec))
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _write_similarity(probes: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    sites, rows = sites_for(N_LAYERS), []
    for k, model in enumerate(("base", "opd", "nca")):
        acc = similarity.CosineAccumulator(sites, N_LAYERS)
        for site in sites:
            hx = torch.randn(2, 5, 8, generator=gen)
            acc.add(site, hx, hx + (0.6 / (k + 1)) * torch.randn(2, 5, 8, generator=gen), torch.ones(2, 5, dtype=bool))
        rows += acc.site_rows(model)
    similarity.write_rows(rows, probes / "similarity.csv")


def _write_gradients(probes: Path, rng: np.random.Generator) -> None:
    names = _param_names()
    sq_a, sq_b = rng.random(len(names)) + 0.1, rng.random(len(names)) + 0.1
    dots = (rng.random(len(names)) * 2 - 1) * np.sqrt(sq_a * sq_b)
    sums = [(float(d), float(a), float(b)) for d, a, b in zip(dots, sq_a, sq_b)]
    rows = gradients.aggregate(names, sums, [16] * len(names), "opd", "nca", (0.5, 0.1))
    gradients.write_gradients(rows, probes, {"synthetic": True})


def _checkpoints(root: Path) -> dict[str, Path]:
    """base / opd / nca: tiny safetensors checkpoints (4 x 4 tensors, tied embeddings)."""
    gen = torch.Generator().manual_seed(1)
    base = {n: torch.randn(4, 4, generator=gen) for n in _param_names()}
    out = {}
    for label, scale in (("base", 0.0), ("opd", 0.05), ("nca", 0.08)):
        d = root / label
        d.mkdir(parents=True)
        save_file({n: (w + scale * torch.randn(4, 4, generator=gen)).contiguous() for n, w in base.items()},
                  str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
        out[label] = d
    return out


def _write_deltas(probes: Path, ckpts: dict[str, Path]) -> None:
    rows = deltas.parameter_deltas(ckpts["base"], {"opd": ckpts["opd"], "nca": ckpts["nca"]}, pair=("opd", "nca"),
                                   progress=False)
    deltas.write_table(rows, probes / "deltas")


def _write_teachability(probes: Path, rng: np.random.Generator) -> None:
    n = 240
    table = {c: rng.random(n) for c in teachability.COLUMNS}
    table["seq"] = np.repeat(np.arange(12), 20)
    table["pos"] = np.tile(np.arange(20), 12)
    summary = teachability.summarize(table, n_boot=20, seed=0)
    (probes / teachability.SUMMARY_NAME).write_text(json.dumps(json_safe(summary)))


def _write_sweep(run: Path, rng: np.random.Generator) -> None:
    rows = [{"selector": s, "budget": b, "acc_x": float(rng.random()), "acc_xc": float(rng.random()),
             "kept": b + 0.01} for s in SELECTORS for b in BUDGETS]
    rows.append({"selector": "random", "budget": 1.0, "acc_x": None, "acc_xc": None})  # null: left out
    (run / "sweep").mkdir()
    (run / "sweep" / "sweep.json").write_text(json.dumps({"rows": rows}))


def make_run(root: Path, task: str = "rules", seed: int = 0) -> Path:
    """A complete synthetic run directory (every artifact of every figure)."""
    rng = np.random.default_rng(seed)
    run = root / task
    run.mkdir(parents=True)
    (run / "demo.json").write_text(json.dumps({"task": task, "methods": list(METHODS), "labels": LABELS,
                                               "thresholds": THRESHOLDS}))
    _write_metrics(run, rng)
    _write_eval(run, rng)
    probes = run / "probes"
    probes.mkdir()
    _write_similarity(probes)
    _write_gradients(probes, rng)
    _write_deltas(probes, _checkpoints(root / f"{task}_ckpts"))
    _write_teachability(probes, rng)
    _write_sweep(run, rng)
    return run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("plots_run"))


@pytest.fixture(scope="module")
def drawn(run_dir: Path) -> dict[str, list[Path]]:
    return plots.draw_all(run_dir)


# ------------------------------------------------------------------------------------------------------- helpers
def panels(fig: Figure) -> list:
    """The data axes of a figure (colour-bar axes excluded)."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def bar_containers(ax) -> list[BarContainer]:
    return [c for c in ax.containers if isinstance(c, BarContainer)]


def summary(run: Path, name: str) -> dict:
    return json.loads((run / "eval" / f"{name}.json").read_text())["summary"]


# ---------------------------------------------------------------------------------------------------------- files
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


def test_figure_index_names_title_and_caption_for_each_figure() -> None:
    index = plots.figure_index()
    assert len(index) == 9 and len({f.name for f in index}) == 9
    for f in index:
        name, title, caption = f
        assert hasattr(plots, f"plot_{name}") and hasattr(plots, f"figure_{name}")
        assert title and len(caption) > 40


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
    vals = [[json.loads(s)["eval/acc_x"] for s in (r / "train" / "opd" / "metrics.jsonl").read_text().splitlines()
             if "eval/acc_x" in json.loads(s)] for r in (run_dir, other)]
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
        expected = [0.0 if s[m]["value"] is None else 100 * s[m]["value"]
                    for m in ("acc_x", "acc_xc", "harm", "both_correct")]
        np.testing.assert_allclose([p.get_height() for p in bars.patches], expected)
        assert dl.patches[0].get_height() == pytest.approx(100 * s["delta_len"]["value"])
    errbars = [c for c in left.containers if isinstance(c, ErrorbarContainer)]
    n_intervals = sum(summary(run_dir, n)[m]["low"] is not None for n in models
                      for m in ("acc_x", "acc_xc", "harm", "both_correct"))
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
    (run / "demo.json").write_text(json.dumps({"task": "rules", "methods": ["opd"],
                                               "thresholds": {"drop_min": 0.07, "harm_high": 0.3, "gain_min": 0.04}}))
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
    cells = {(int(r["layer"]), r["module"]): float(r["cos"]) for r in rows
             if r["scope"] == "layer_module" and r["layer"]}
    modules = [t.get_text() for t in ax.get_xticklabels()]
    assert modules == [m for m in deltas.MODULE_ORDER if m in MODULES]
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
    modules = [t.get_text() for t in axes[0].get_xticklabels()]
    sub = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
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
    for ax, signal in zip(axes, teachability.BUCKET_SIGNALS):
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
    per_tensor = deltas.read_table(run_dir / "probes" / "deltas.csv")
    run = tmp_path / "agg"
    (run / "probes").mkdir(parents=True)
    (run / "demo.json").write_text((run_dir / "demo.json").read_text())
    deltas.write_table(deltas.aggregate_deltas(per_tensor, "site") + deltas.aggregate_deltas(per_tensor, "all"),
                       run / "probes" / "deltas")
    grids = [[np.asarray(c.get_array()) for c in ax.collections if isinstance(c, QuadMesh)][0]
             for ax in panels(plots.figure_parameter_deltas(run))]
    expected = [[np.asarray(c.get_array()) for c in ax.collections if isinstance(c, QuadMesh)][0]
                for ax in panels(plots.figure_parameter_deltas(run_dir))]
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
    assert (plot_teach.SUMMARY_NAME, plot_teach.BUCKET_SIGNALS, plot_teach.GAINS) == \
        (teachability.SUMMARY_NAME, teachability.BUCKET_SIGNALS, teachability.GAINS)
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
    assert [p.name for p in plots.plot_training_curves(run, tmp_path / "out")] == ["training_curves.png",
                                                                                    "training_curves.pdf"]
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
