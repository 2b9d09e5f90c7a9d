"""The intervention probes' figures draw exactly the values of their tables (written by the probes' own writers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mechopd.core.artifacts import read_csv
from mechopd.plots.interventions import (
    MODULE_ORDER,
    figure_attribution,
    figure_localization,
    figure_pmi,
    figure_weightpatch,
)

from .intervention_artifacts import HEADS, LAYERS
from .plotting_run import make_run, panels


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("intervention_plots"))


def _rows(run: Path, name: str) -> list[dict]:
    return read_csv(run / "probes" / f"{name}.csv")


def test_weightpatch_heatmaps_are_the_table(run):
    acc, harm = panels(figure_weightpatch(run))
    rows = _rows(run, "weightpatch")
    modules = [m for m in MODULE_ORDER if any(r["module"] == m for r in rows)]
    layers = ["none", *map(str, range(LAYERS)), "all"]
    g_acc, g_harm = acc.get_images()[0].get_array(), harm.get_images()[0].get_array()
    for r in rows:
        if r["module"] == "ctrl_qk" or r["layer"] == "none":
            continue
        i, j = layers.index(r["layer"]), modules.index(r["module"])
        assert g_acc[i, j] == pytest.approx(float(r["acc_x"])) and g_harm[i, j] == pytest.approx(float(r["harm"]))
    ctrl = [float(r["acc_x"]) for r in rows if r["module"] == "ctrl_qk"]
    assert g_acc[layers.index("all"), modules.index("ctrl_qk")] == pytest.approx(np.mean(ctrl))  # mean of draws


def test_localization_line_is_the_table(run):
    ax = panels(figure_localization(run))[0]
    rows = sorted(_rows(run, "localization"), key=lambda r: int(r["depth"]))
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [float(r["harm"]) for r in rows])


def test_attribution_heatmap_is_the_table(run):
    ax = panels(figure_attribution(run))[0]
    grid = ax.get_images()[0].get_array()
    assert grid.shape == (LAYERS, 3 + HEADS)
    rows = [r for r in _rows(run, "attribution") if r["position"] == "all"]
    for r in rows:
        j = ("resid", "attn", "mlp").index(r["component"]) if r["head"] == "" else 3 + int(r["head"])
        assert grid[int(r["layer"]), j] == pytest.approx(float(r["recovered_attr"]))


def test_pmi_scatter_is_the_table(run):
    ax = panels(figure_pmi(run))[0]
    rows = read_csv(run / "probes" / "pmi_tokens.csv")
    other, flip = ax.collections[:2]
    assert len(flip.get_offsets()) == sum(r["flip"] == "True" for r in rows)
    assert len(other.get_offsets()) + len(flip.get_offsets()) == len(rows)


def test_localization_band_over_seeds_is_the_hierarchical_bootstrap_of_the_items(run, tmp_path):
    import json
    import shutil

    from mechopd.core.artifacts import write_jsonl
    from mechopd.probes.mechanism_stats import site_harm_stat

    sites = [r["site"] for r in sorted(_rows(run, "localization"), key=lambda r: int(r["depth"]))]
    seeds = []
    for k in range(2):
        seed = shutil.copytree(run, tmp_path / f"seed-{k}")
        rng = np.random.default_rng(k)
        write_jsonl(
            seed / "probes" / "localization_items.jsonl",
            [
                {
                    "uid": f"u{i}",
                    "prompt_ids_x": [1],
                    "prompt_ids_c": [2],
                    "response_ids": [3],
                    "right_x": i % 4 != 0,
                    "flips_clean": bool(rng.random() < 0.6),
                    "flips": {s: bool(rng.random() < 0.6 - 0.1 * d) for d, s in enumerate(sites)},
                }
                for i in range(30)
            ],
        )
        seeds.append(seed)
    agg = tmp_path / "agg"
    agg.mkdir()
    meta = json.loads((run / "demo.json").read_text())
    (agg / "demo.json").write_text(json.dumps({**meta, "seed_runs": [str(s) for s in seeds]}))
    ax = panels(figure_localization(agg))[0]
    want = [site_harm_stat(seeds, s) for s in sites]
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [w["mean"] for w in want])
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert min(band) == pytest.approx(min(w["low"] for w in want))
    assert max(band) == pytest.approx(max(w["high"] for w in want))
    assert "hierarchical (t over seeds" in [t.get_text() for t in ax.get_legend().get_texts()][1]
