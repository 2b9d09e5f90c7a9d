"""A new probe is one registration: the CLI verb, its flags (plus every setup flag), the demo, the figure table and the
report all come from `register_probe`."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from mechopd.cli.probe_cmd import add_probe_parsers
from mechopd.core.artifacts import read_json, write_json
from mechopd.core.errors import ConfigError
from mechopd.core.options import GE0, GE1, UNIT, option
from mechopd.plots.registry import register_figure, unregister_figure
from mechopd.probes.registry import ProbeSpec, get_probe, probes, register_probe, unregister_probe

SETUP_FLAGS = (
    "--run",
    "--task",
    "--option",
    "--placement",
    "--no-context-system",
    "--chat-template-kwarg",
    "--temperature",
    "--max-new-tokens",
    "--n",
    "--seed",
    "--batch-size",
    "--responses-from",
    "--out",
)


def run_toy(setup, out: Path, opts: ToyOptions) -> list[str]:
    """The toy probe's run function: it takes its options instance, as every probe's does."""
    assert isinstance(opts, ToyOptions)
    label, path = setup.model(opts.model, "trained")
    task = setup.make_task()
    value = opts.scale * len(setup.examples(task))
    write_json(
        out / "toy.json",
        {
            "value": value,
            "model": label,
            "path": path,
            "task": setup.task,
            "options": setup.task_options,
            "placement": setup.spec(task).placement,
            "kwargs": setup.chat_template_kwargs,
        },
    )
    return [f"toy value {value}"]


def toy_lines(probes_dir: Path) -> list[str]:
    p = probes_dir / "toy.json"
    return [f"- **Toy probe**: {read_json(p)['value']:g}."] if p.is_file() else []


def plot_toy(run_dir: Path, out_dir: Path) -> list[Path]:
    src = run_dir / "probes" / "toy.json"
    if not src.is_file():
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "toy.png").write_bytes(b"not really a png")
    return [out_dir / "toy.png"]


@dataclass(frozen=True)
class ToyOptions:
    scale: float = option(2.0, "a factor", range=GE0)
    model: str | None = option(None, "a model")


@dataclass(frozen=True)
class ClashOptions:
    n: int = option(1, "clashes with the setup's --n")


@dataclass(frozen=True)
class DestClashOptions:
    seed: int = option(1, "its own flag, but the setup's field name (the parsed value's dest)", flag="--probe-seed")


TOY = ProbeSpec(
    "toy",
    "a toy probe",
    run_toy,
    options=ToyOptions,
    outputs=("toy.json",),
    demo={"model": "nca", "scale": 0.5},
    report=toy_lines,
)


@pytest.fixture
def toy():
    register_probe(TOY)
    register_figure("toy", "Toy figure", "The toy probe's value.", plot_toy, group="probe")
    yield TOY
    unregister_probe("toy")
    unregister_figure("toy")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_probe_parsers(p)
    return p


def test_builtin_probes_are_registered_with_figures_and_report():
    names = [p.name for p in probes()]
    assert names[:4] == ["similarity", "gradients", "deltas", "teachability"]
    for spec in probes()[:4]:
        assert spec.summary is not None and spec.demo is not None and spec.outputs
        assert set(spec.role_options) <= set(spec.demo)  # the demo's models are roles of the study
    from mechopd.plots import figure_index

    assert {"layer_cosine", "gradient_alignment", "parameter_deltas", "teachability"} <= {
        f.name for f in figure_index()
    }  # their figures register in their plot modules


def test_every_probe_registers_its_run_function_taking_its_options():
    """No adapter between the CLI and a probe: the registration's ``run`` is the probe's Python function
    ``run_X(setup, out_dir, opts: XOptions)``, and no probe module defines a ``cli_run``."""
    import inspect
    import typing

    from mechopd.probes.registry import resolve

    for spec in probes():
        run = resolve(spec.run)
        assert run.__name__.startswith("run_") and run.__name__ != "cli_run", spec.name
        params = list(inspect.signature(run).parameters.values())
        assert params[2].name == "opts" and params[2].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, spec.name
        hint = typing.get_type_hints(run)["opts"]
        assert spec.options in typing.get_args(hint), (spec.name, hint)  # `XOptions | None`
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params), spec.name
    package = Path(resolve("mechopd.probes.registry:probes").__code__.co_filename).parent
    assert not [p.name for p in package.glob("*.py") if "def cli_run" in p.read_text()]


def test_a_probe_gets_its_options_instance_parsed_once():
    """`ProbeSpec` builds the options instance (defaults, given values, checks); its comma-separated text fields are
    parsed there once, so the run function reads typed values; a Python list gives the same value as the text."""
    spec = get_probe("patching")
    opts = spec.options_of(layers="0,final_norm", cross="nca,opd", components="resid")
    assert (opts.layers, opts.cross, opts.components) == ([0, "final_norm"], ("nca", "opd"), ["resid"])
    assert spec.options_of(layers=[0, "final_norm"], cross=["nca", "opd"]) == spec.options_of(
        layers="0,final_norm", cross="nca,opd"
    )
    assert get_probe("gradients").options_of().terms == ("opd", "nca")
    with pytest.raises(ConfigError, match="--cross 'opd,opd' names one model twice"):
        spec.options_of(cross="opd,opd")
    with pytest.raises(ConfigError, match="--components 'resid,nope': 'nope' is unknown"):
        spec.options_of(components="resid,nope")


def test_every_verb_has_every_setup_flag(toy):
    parser = _parser()
    for spec in probes():
        sub = parser._subparsers._group_actions[0].choices[spec.name]  # the verb's own parser
        flags = {s for a in sub._actions for s in a.option_strings}
        assert set(SETUP_FLAGS) <= flags, spec.name


def test_setup_flags_are_generated_from_the_probe_setup_fields(monkeypatch):
    """The setup flags come from `ProbeSetup`'s declarations (the options' flag generator), not from a hand-written
    list: a field added to the setup is a flag of every verb, with its help, unset (None) unless given, and it reaches
    the setup the verb builds."""
    from dataclasses import dataclass as dc

    from mechopd.cli import probe_cmd
    from mechopd.core.options import option as declare
    from mechopd.probes import setup as setup_module

    @dc
    class Wider(setup_module.ProbeSetup):
        knob: int = declare(3, help="a new setup knob")

    monkeypatch.setattr(setup_module, "ProbeSetup", Wider)
    verbs = _parser()._subparsers._group_actions[0].choices
    for name in ("similarity", "lens"):
        knob = next(a for a in verbs[name]._actions if "--knob" in a.option_strings)
        assert (knob.help, knob.default, knob.type) == ("a new setup knob (default 3)", None, int)
        assert "--placement" in {s for a in verbs[name]._actions for s in a.option_strings}
    a = _parser().parse_args(["similarity", "--knob", "5", "--task", "rules"])
    assert probe_cmd.setup_from_args(a).knob == 5
    assert probe_cmd.setup_from_args(_parser().parse_args(["similarity"])).knob == 3  # unset: the field's default


def test_a_registered_probe_is_a_cli_verb_with_its_flags(toy, tmp_path, capsys):
    from mechopd.cli import main

    a = _parser().parse_args(["toy", "--scale", "3", "--option", "rule=reverse"])
    assert (a.probe, a.scale, a.task_options) == ("toy", 3.0, ["rule=reverse"])  # dest: the setup field
    opd = tmp_path / "o"
    code = main(
        [
            "probe",
            "toy",
            "--task",
            "rules",
            "--n",
            "4",
            "--scale",
            "3",
            "--option",
            "rule=reverse",
            "--placement",
            "user",
            "--chat-template-kwarg",
            "enable_thinking=false",
            "--out",
            str(tmp_path / "p"),
            "--model",
            str(opd),
        ]
    )
    assert code == 0 and "toy value 12.0" in capsys.readouterr().out
    doc = read_json(tmp_path / "p" / "toy.json")
    assert doc["options"] == {"rule": "reverse"} and doc["placement"] == "user"
    assert doc["kwargs"] == {"enable_thinking": False} and doc["path"] == str(opd)


def test_options_are_checked_against_the_registration(toy):
    assert toy.values() == {"scale": 2.0, "model": None}
    with pytest.raises(ConfigError, match="unknown option"):
        toy.values(sclae=1.0)
    with pytest.raises(ConfigError, match="probe toy: --scale -1.0 is invalid: it must be a finite number >= 0"):
        toy.values(scale=-1.0)
    with pytest.raises(ConfigError, match="already registered"):
        register_probe(ProbeSpec("toy", "another", run_toy))
    with pytest.raises(ConfigError, match="--n is a setup flag"):
        register_probe(ProbeSpec("toy2", "clashes", run_toy, options=ClashOptions))
    with pytest.raises(ConfigError, match="flag seed is a setup flag"):
        register_probe(ProbeSpec("toy3", "clashes", run_toy, options=DestClashOptions))
    with pytest.raises(ConfigError, match="unknown probe"):
        get_probe("no-such-probe")


@dataclass(frozen=True)
class CheckedOptions:
    share: float = option(0.5, "a share", flag="--kept-share", range=UNIT)
    how: str = option("sum", "how to combine", choices=("sum", "max"))
    draws: int = option(3, "draws", range=GE1)


def test_probe_options_are_core_facts_checked_by_the_one_checker(monkeypatch):
    """A probe's options are `mechopd.core.options` facts (one format); a value out of range or an unknown choice is
    refused by its one checker, `check_value`, in one line naming the probe, the flag and the fix."""
    from mechopd.core import options as core
    from mechopd.probes import options as probe_options

    facts = {f.name: f for f in core.field_facts(CheckedOptions)}
    assert facts["share"].range == core.Range(0.0, 1.0) and facts["share"].flag == "--kept-share"
    assert facts["how"].choices == ("sum", "max") and facts["draws"].range == core.Range(1)
    assert facts["how"].help == "how to combine" and facts["draws"].flag == "--draws"
    checked = []

    def spy(f, value, subject=""):
        checked.append(f.name)
        return core.check_value(f, value, subject)

    monkeypatch.setattr(probe_options, "check_value", spy)
    spec = ProbeSpec("checked", "a checked probe", run_toy, options=CheckedOptions)
    assert spec.values(share=1.0, how="max", draws=1) == {"share": 1.0, "how": "max", "draws": 1}
    assert sorted(checked) == ["draws", "how", "share"]
    cases = [
        ({"share": 1.5}, "probe checked: --kept-share 1.5 is invalid: it must be a finite number >= 0 and <= 1"),
        ({"share": float("nan")}, "probe checked: --kept-share nan is invalid: it must be a finite number >= 0"),
        ({"draws": 0}, "probe checked: --draws 0 is invalid: it must be an integer >= 1"),
        ({"draws": 2.5}, "probe checked: --draws 2.5 is invalid: it must be an integer >= 1"),
        ({"how": "mean"}, "probe checked: --how 'mean' is unknown; choose one of sum, max"),
    ]
    for given, message in cases:
        with pytest.raises(ConfigError) as err:
            spec.values(**given)
        assert str(err.value).startswith(message) and "\n" not in str(err.value), (given, str(err.value))
        assert str(err.value).endswith((">= 1", "<= 1", "sum, max")), str(err.value)  # the whole line: no more


def test_a_probe_field_without_option_is_refused():
    @dataclass(frozen=True)
    class Bare:
        scale: float = 1.0

    with pytest.raises(ConfigError, match="Bare: field.s. scale carry no help; declare each with"):
        ProbeSpec("bare", "bare", run_toy, options=Bare).values()


def test_the_demo_figures_and_report_read_the_registry(toy, tmp_path, monkeypatch):
    """stages.run_probes runs the toy with its demo options; draw_all draws its figure; report.md has its line."""
    from dataclasses import replace

    from mechopd import plots
    from mechopd.pipeline import demo, stages
    from mechopd.probes import registry
    from mechopd.report import write_report_md

    probes()  # built-ins loaded; then only the toy runs in the demo (the built-ins need real checkpoints; they stay
    # registered, out of the demo, since the built-in study names them)
    monkeypatch.setattr(
        registry, "_REGISTRY", {**{k: replace(v, demo=None) for k, v in registry._REGISTRY.items()}, "toy": TOY}
    )
    run = tmp_path / "run"
    models = {"base": tmp_path / "base", "opd": tmp_path / "opd", "nca": tmp_path / "nca"}
    stages.run_probes(demo.DemoConfig(fast=True), models, run)
    doc = read_json(run / "probes" / "toy.json")
    assert doc["model"] == "nca" and doc["value"] == 0.5 * 8  # demo options; DemoConfig(fast) has probe_n 8
    names = [f.name for f in plots.figure_index()]  # the run's figures, the probes', the tail: no count pinned
    assert names.index("regime_map") < names.index("toy") < names.index("budget_curve")
    assert plots.draw_all(run)["toy"] == [run / "figures" / "toy.png"]
    text = write_report_md(run).read_text()
    assert "- **Toy probe**: 4." in text and "### Toy figure" in text
    (run / "probes" / "toy.json").write_text(json.dumps({"value": 1}))
    stages.run_probes(demo.DemoConfig(fast=True), models, run)  # its output exists: skipped
    assert read_json(run / "probes" / "toy.json") == {"value": 1}


def test_a_study_probe_without_models_reads_every_run_of_the_study():
    """``similarity: {}`` in a study: the demo's three roles are not imposed (the option's default, None, is every model
    of the run, as its help says); a study's own ``models`` and a role option with a default of its own are kept."""
    from mechopd.probes.registry import get_probe, study_options

    sim, teach = get_probe("similarity"), get_probe("teachability")
    assert sim.demo and "models" in sim.demo  # the demo names base, opd, nca
    assert "models" not in study_options(sim, {})
    assert study_options(sim, {"models": ["opd", "ta_opd"]})["models"] == ["opd", "ta_opd"]
    kept = {k: v for k, v in (teach.demo or {}).items() if k in teach.role_options}
    assert kept and all(study_options(teach, {})[k] == v for k, v in kept.items())


def test_a_study_probe_takes_its_documented_defaults_not_the_demos():
    """``deltas: {}`` in a study runs no SVD: the option left out takes the flag's default (False), not the demo's
    ``svd: true`` (#54); asked for, it runs; the demo's role options stay."""
    from mechopd.probes.registry import get_probe, study_options

    deltas = get_probe("deltas")
    assert deltas.demo["svd"] is True
    assert "svd" not in study_options(deltas, {}) and study_options(deltas, {})["pair"] == deltas.demo["pair"]
    assert study_options(deltas, {"svd": True})["svd"] is True


def test_a_study_s_own_models_drop_the_demo_s_pair_unless_it_lists_both():
    """``deltas: {models: [trl, opd]}`` in a study without an nca run: the demo's ``pair: opd,nca`` named a run the
    study does not have and refused the study; the study's own list takes the probe's default pair (its first two)."""
    from mechopd.probes.registry import get_probe, study_options

    deltas, patching = get_probe("deltas"), get_probe("patching")
    assert "pair" not in study_options(deltas, {"models": ["trl", "opd"]})
    assert study_options(deltas, {"models": ["opd", "nca", "trl"]})["pair"] == deltas.demo["pair"]
    assert study_options(deltas, {"models": ["trl", "opd"], "pair": "opd,trl"})["pair"] == "opd,trl"
    assert "cross" not in study_options(patching, {"models": ["base", "opd"]})
