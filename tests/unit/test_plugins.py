"""A new probe and a new figure are each ONE file: the test writes them into a temporary package (no other file of
mechopd is touched), imports them, and finds the probe's flags in ``mechopd probe toy --help`` (with the defaults and
checks of its options dataclass) and the figure drawn by `draw_all`."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from mechopd.cli import main
from mechopd.plots import draw_all, figure_index
from mechopd.plots.registry import unregister_figure
from mechopd.probes.registry import get_probe, unregister_probe

TOY_PROBE = """
from __future__ import annotations

from dataclasses import dataclass

from mechopd.core.artifacts import write_json
from mechopd.core.options import Range, option
from mechopd.probes.options import Role
from mechopd.probes.registry import ProbeSpec, register_probe


@dataclass(frozen=True)
class ToyOptions:
    models: list[Role] | None = option(None, "models to read", metavar="LABEL")
    scale: float = option(2.0, "a factor of the count", range=Range(0, 10))
    mode: str = option("sum", "how to combine", choices=("sum", "max"))
    loud: bool = option(False, "print more")


def run_toy(setup, out, opts: ToyOptions):
    value = opts.scale * len(setup.examples())
    write_json(out / "toy.json", {"value": value, "mode": opts.mode})
    return [f"toy value {value}"]


register_probe(ProbeSpec("toy", "a toy probe", run_toy, options=ToyOptions, outputs=("toy.json",)))
"""

TOY_FIGURE = """
from __future__ import annotations

from pathlib import Path

from mechopd.plots.registry import register_figure


def plot_toy(run_dir, out_dir: Path) -> list[Path]:
    src = Path(run_dir) / "probes" / "toy.json"
    if not src.is_file():
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "toy_figure.png").write_text(src.read_text())
    return [out_dir / "toy_figure.png"]


register_figure("toy_figure", "Toy figure", "The toy probe's value.", plot_toy, group="probe")
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    pkg = tmp_path / "toyplugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "toy_probe.py").write_text(textwrap.dedent(TOY_PROBE))
    (pkg / "toy_figure.py").write_text(textwrap.dedent(TOY_FIGURE))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "toyplugins"]:  # fresh imports: each test registers
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    importlib.import_module("toyplugins.toy_probe")
    importlib.import_module("toyplugins.toy_figure")
    yield
    unregister_probe("toy")
    unregister_figure("toy_figure")


def test_a_probe_in_one_file_is_a_verb_with_its_flags(plugins, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["probe", "toy", "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--models LABEL [LABEL ...]", "--scale SCALE", "--mode MODE", "--loud", "--run RUN_DIR", "--n N"):
        assert flag in text, flag
    assert get_probe("toy").values() == {"models": None, "scale": 2.0, "mode": "sum", "loud": False}


def test_its_options_are_checked_and_it_runs(plugins, tmp_path, capsys):
    assert main(["probe", "toy", "--task", "rules", "--n", "4", "--scale", "3", "--out", str(tmp_path / "p")]) == 0
    assert "toy value 12.0" in capsys.readouterr().out
    assert main(["probe", "toy", "--task", "rules", "--scale", "11", "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err
    assert "probe toy: --scale 11.0 is invalid: it must be a finite number >= 0 and <= 10" in err
    assert len(err.strip().splitlines()) == 1, err
    assert main(["probe", "toy", "--task", "rules", "--mode", "mean", "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err
    assert "probe toy: --mode 'mean' is unknown; choose one of sum, max" in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_figure_in_one_file_is_drawn_and_indexed(plugins, tmp_path):
    run = tmp_path / "run"
    (run / "probes").mkdir(parents=True)
    (run / "probes" / "toy.json").write_text('{"value": 4}')
    names = [f.name for f in figure_index()]
    assert names.index("layer_cosine") < names.index("toy_figure") < names.index("budget_curve")
    drawn = draw_all(run)
    assert drawn["toy_figure"] == [run / "figures" / "toy_figure.png"]
    assert (run / "figures" / "toy_figure.png").read_text() == '{"value": 4}'
