"""A new probe, selector or figure is one file plus one registration: this file alone adds a toy of each (one
registration each, nothing else edited) and shows the CLI, the trainer, the demo's probe stage, the figures, the report
and the claims' reader (`probe_result`) picking them up."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import yaml

from mechopd.cli import main
from mechopd.core.artifacts import Summary, read_json
from mechopd.core.options import option
from mechopd.objectives.select import make_selector, register_selector, unregister_selector
from mechopd.plots import draw_all, figure_index, register_figure, unregister_figure
from mechopd.probes.registry import ProbeSpec, probe_result, register_probe, unregister_probe
from mechopd.runset import RunSet
from tests.unit.plotting_run import make_run


# -- the toy probe: its quantity, its typed summary, its figure --------------------------------------------------------
@dataclass
class ToySummary(Summary):
    FILE: ClassVar[str] = "toy.json"
    PROBE: ClassVar[str] = "toy"

    model: str
    value: float

    def lines(self) -> list[str]:
        return [f"- **Toy probe** on {self.model}: {self.value:g}."]


def run_toy(setup, out: Path, opts: ToyOptions) -> list[str]:
    """A probe's run function: the setup, its output dir and its options instance (built by the registry)."""
    label, _ = setup.model(opts.model, "trained")
    ToySummary(label, opts.scale * len(setup.examples(setup.make_task()))).save(out)
    return [f"toy {label}"]


def plot_toy(run_dir, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "toy.png").write_bytes(b"png")
    return [out_dir / "toy.png"]


@dataclass(frozen=True)
class ToyOptions:
    model: str | None = option(None, "a model")
    scale: float = option(2.0, "a factor")


TOY_PROBE = ProbeSpec(
    "toy",
    "a toy probe",
    run_toy,
    options=ToyOptions,
    outputs=("toy.json",),
    demo={"model": "nca", "scale": 0.5},
    role_options=("model",),
    summary=ToySummary,
)


# -- the toy selector: keep the LAST positions of each response -------------------------------------------------------
def toy_last(normed, mask: torch.Tensor, generator) -> torch.Tensor:
    return torch.arange(mask.shape[1], dtype=torch.float32).expand(mask.shape).clone()


# -- the toy figure: the number of evaluated models -----------------------------------------------------------------
def plot_count(run_dir, out_dir: Path) -> list[Path]:
    root = run_dir.root if isinstance(run_dir, RunSet) else Path(run_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval_count.png").write_bytes(str(len(list((root / "eval").glob("*.json")))).encode())
    return [out_dir / "eval_count.png"]


@pytest.fixture
def toys():
    register_probe(TOY_PROBE)
    register_figure("toy", "Toy probe figure", "The toy probe's value, drawn.", plot_toy, group="probe")
    register_selector("toy_last", needs_stats=False)(toy_last)
    register_figure(
        "eval_count", "Evaluated models", "How many evaluation reports the run holds (a toy figure).", plot_count
    )
    yield
    unregister_probe("toy")
    unregister_selector("toy_last")
    unregister_figure("eval_count")
    unregister_figure("toy")


def test_a_toy_probe_selector_and_figure_are_picked_up(toys, tmp_path, tiny_rules_organism, capsys):
    out = _train_with_the_toy_selector(tmp_path, tiny_rules_organism, capsys)
    # probe: a CLI verb with its flags; the demo resolves its ROLE through the study (nca -> my_nca)
    run = make_run(tmp_path / "study")
    _run_the_toy_probe(run, out, tmp_path)
    # figures and report: the toy figure and the toy probe's figure are drawn and shown, the summary line reported
    names = [f.name for f in figure_index()]
    assert {"toy", "eval_count"} <= set(names)
    drawn = draw_all(run)
    assert drawn["toy"] == [run / "figures" / "toy.png"] and (run / "figures" / "eval_count.png").read_text() == "4"
    assert main(["figures", str(run)]) == 0
    text = (run / "report.md").read_text()
    assert "- **Toy probe** on my_nca: 4." in text and "### Evaluated models" in text and "### Toy probe figure" in text


def _train_with_the_toy_selector(tmp_path: Path, organism, capsys) -> Path:
    """The selector part of the test above; returns the trained run directory."""
    # selector: the config / CLI accept it, it selects what its score says, the trainer trains with it
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    keep = make_selector("toy_last")(None, None, mask, 0.5).keep
    assert keep.tolist() == [[False, True, True, True], [False, False, False, False]]  # ⌈0.5·6⌉ = 3 latest; tie: row 0
    out = tmp_path / "train"
    assert (
        main(
            [
                "train",
                "--student",
                str(organism),
                "--selector",
                "toy_last",
                "--budget",
                "0.5",
                "--steps",
                "1",
                "--batch-size",
                "2",
                "--set",
                "max_new_tokens=4",
                "--set",
                "pool_size=8",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    ), capsys.readouterr().err
    kept = [
        json.loads(x)["kept_fraction"]
        for x in (out / "metrics.jsonl").read_text().splitlines()
        if "kept_fraction" in json.loads(x)
    ]
    assert kept and all(0 < k <= 0.5 + 1e-9 or math.isclose(k, 0.5) for k in kept)
    return out


def _run_the_toy_probe(run: Path, out: Path, tmp_path: Path) -> None:
    """The probe part of the test above: `mechopd probe toy` on the trained model, then the demo's probe stage on
    the study `run` whose nca role is the run my_nca."""
    from mechopd.pipeline import demo, stages

    assert (
        main(
            [
                "probe",
                "toy",
                "--task",
                "rules",
                "--n",
                "4",
                "--scale",
                "3",
                "--model",
                str(out / "final"),
                "--out",
                str(tmp_path / "cli"),
            ]
        )
        == 0
    )
    assert read_json(tmp_path / "cli" / "toy.json")["value"] == 12.0
    for old, new in (
        (run / "train" / "nca", run / "train" / "my_nca"),
        (run / "eval" / "nca.json", run / "eval" / "my_nca.json"),
    ):
        if old.exists():  # the role's run lives under its own name (a study naming a missing run is refused)
            old.rename(new)
    (run / "study.yaml").write_text(
        yaml.safe_dump({"runs": {"base": "base", "opd": "opd", "nca": "my_nca"}}, sort_keys=False)
    )
    models = {"base": tmp_path / "b", "opd": tmp_path / "o", "my_nca": tmp_path / "n"}
    from dataclasses import replace

    from mechopd.probes import registry

    registry.probes()  # the built-ins stay registered (the built-in study names them) but out of the demo
    only_toy = {**{k: replace(v, demo=None) for k, v in registry._REGISTRY.items()}, "toy": TOY_PROBE}
    saved, registry._REGISTRY = registry._REGISTRY, only_toy  # the built-ins need real checkpoints
    try:
        stages.run_probes(demo.DemoConfig(fast=True), models, run)
    finally:
        registry._REGISTRY = saved
    assert probe_result("toy", RunSet.load(run).probes_dir) == ToySummary("my_nca", 0.5 * 8)  # as claims read it


def test_the_selection_signals_travel_between_processes_by_field_name():
    """What the trainer gathers across processes (`pack_stats` / `unpack_stats`) is every TeachabilityStats field,
    matched by name, not a hand-kept column list."""
    from dataclasses import fields

    from mechopd.objectives.select import pack_stats, unpack_stats
    from mechopd.objectives.signals import TeachabilityStats

    mask = torch.tensor([[True, False], [True, True]])
    stats = TeachabilityStats(**{f.name: torch.rand(2, 2) + i for i, f in enumerate(fields(TeachabilityStats))})
    back_mask, back = unpack_stats(pack_stats(mask, stats))
    assert torch.equal(back_mask, mask)
    for f in fields(TeachabilityStats):
        assert torch.equal(getattr(back, f.name), getattr(stats, f.name)), f.name
    assert unpack_stats(pack_stats(mask, None))[1] is None
    partial = TeachabilityStats(C=stats.C, D=stats.D, H=stats.H)  # kl_full not asked for (the trainer's selection)
    back = unpack_stats(pack_stats(mask, partial))[1]
    assert back is not None and back.kl_full is None and torch.equal(back.D, stats.D)
    with pytest.raises(ValueError, match="signal columns"):
        unpack_stats(torch.zeros(2, 2, 3))
