"""One colour per model across the figures and the explorer (#54): a figure drawing a subset of the run's models
gives each the colour it has in the others, and the explorer's page carries the figures' colours."""

from __future__ import annotations

from matplotlib.colors import to_hex

from mechopd.plots._common import palette
from mechopd.plots.layers import figure_layer_cosine
from mechopd.report.explore import colours_of

from .plotting_run import make_run


def _line_colours(fig) -> dict[str, str]:
    ax = fig.axes[0]
    return {
        line.get_label(): to_hex(line.get_color()) for line in ax.get_lines() if not line.get_label().startswith("_")
    }


def test_a_model_keeps_its_colour_in_a_figure_of_fewer_models_and_in_the_explorer(tmp_path):
    run = make_run(tmp_path)
    order = ["base", "opd", "nca", "ta_opd"]  # plotting_run's demo.json: base, then the methods
    want = {m: to_hex(c) for m, c in palette(order).items()}
    rows = (run / "probes" / "similarity.csv").read_text().splitlines()
    kept = [rows[0], *(r for r in rows[1:] if r.split(",")[0] in ("base", "nca"))]  # NCA without OPD beside it
    (run / "probes" / "similarity.csv").write_text("\n".join(kept) + "\n")
    got = _line_colours(figure_layer_cosine(run))
    assert got == {"Base": want["base"], "NCA": want["nca"]}, got
    assert colours_of(run, ["nca", "base"]) == {"nca": want["nca"], "base": want["base"]}  # the explorer's data
