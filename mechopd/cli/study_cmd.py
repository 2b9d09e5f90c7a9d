"""`mechopd figures`, `demo`, `run`, `aggregate` and `explore`: thin around the probes' registry, the
plots, the pipeline and the report. Registered in the command table of `mechopd.cli.common`; `mechopd.cli` builds the
parser."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechopd.cli.common import add_given, command, given
from mechopd.core.errors import ConfigError
from mechopd.core.options import field_facts, option
from mechopd.core.runlock import hold


# --- run ---------------------------------------------------------------------------------------------------------------
def _run_facts() -> list[Any]:
    """`mechopd run`'s declared flags: the pool's ``--workers`` (`PoolOptions`, as the demo's)."""
    from mechopd.core.options import field_facts
    from mechopd.pipeline.pool import PoolOptions

    return [f for f in field_facts(PoolOptions) if f.name == "workers"]


@dataclass
class RunArgs:
    """`mechopd run`'s own arguments (--workers: `PoolOptions`)."""

    study: str = option(
        help="a study file: task, student, runs by role, seeds, eval, probes (README, `mechopd run`; "
        "mechopd/pipeline/spec.py)",
        flag="study",
        metavar="STUDY.yaml",
    )
    out: str | None = option(None, help="output directory (default: the study file's folder / its stem)", metavar="DIR")


def _run_args(p: argparse.ArgumentParser) -> None:
    add_given(p, field_facts(RunArgs) + _run_facts())  # --workers as the demo's


@command(
    "run", "run a study file: train every run per seed, evaluate, probe, draw, aggregate, report (resumable)", _run_args
)
def _run(a: argparse.Namespace) -> int:
    from mechopd.pipeline.run import run_study

    print(f"report: {run_study(a.study, a.out, **given(a, _run_facts(), 'run'))}")
    return 0


# --- figures / demo -----------------------------------------------------------------------------------------------------
@dataclass
class FiguresArgs:
    """`mechopd figures`'s arguments."""

    run_dir: str | None = option(
        None,
        help="a run directory written by `mechopd demo`; its figures/ and report.md are redrawn from its saved "
        "artifacts",
        flag="run_dir",
        metavar="RUN_DIR",
    )
    study: str | None = option(
        None,
        help="a study YAML naming the runs by role (the roles: mechopd/runset/__init__.py): applied to RUN_DIR, or on its "
        "own its root",
        metavar="FILE",
    )


def _figures_args(p: argparse.ArgumentParser) -> None:
    add_given(p, field_facts(FiguresArgs))


@command("figures", "redraw every figure of a run from its saved artifacts (no model is loaded)", _figures_args)
def _figures(a: argparse.Namespace) -> int:
    from mechopd.core.checks import check_out_dir
    from mechopd.core.runcheck import check_no_escape
    from mechopd.plots import redraw
    from mechopd.report import write_report_md
    from mechopd.runset import RunSet, runset_root
    from mechopd.runset.checks import check_study

    if a.run_dir is None and a.study is None:
        raise ConfigError("mechopd figures needs RUN_DIR or --study FILE; e.g. mechopd figures runs/demo")
    if a.run_dir is not None and not Path(a.run_dir).is_dir():
        raise ConfigError(f"run directory {a.run_dir} does not exist; run `mechopd demo --out {a.run_dir}` first")
    run = Path(a.run_dir) if a.run_dir is not None else runset_root(a.study)
    check_no_escape(run, run / "figures", "figures")  # never drawn through a link that leads out of the run
    check_out_dir(run / "figures", "figures")  # writable before anything is drawn
    with hold(run, "figures"):  # not while a demo or another redraw writes into the run (then read the study)
        study = check_study(RunSet.load(a.run_dir, a.study) if a.run_dir is not None else RunSet.load(a.study))
        drawn = redraw(study, run / "figures")  # all or none: a failure leaves the figures drawn before
        if sum(len(v) for v in drawn.values()):
            write_report_md(study)
    n = sum(len(v) for v in drawn.values())
    if n == 0:
        raise ConfigError(f"{run} holds no artifacts to draw (eval/, probes/, train/*/metrics.jsonl)")
    print(f"{n} files in {run / 'figures'}; report: {run / 'report.md'}")
    return 0


DEMO_FLAGS = (
    "out",
    "task",
    "fast",
    "sweep",
    "seed",
    "steps",
    "seeds",
    "workers",
    "job_threads",
    "batch_size",
    "layers",
)
STUDY_FLAGS = ("out", "fast", "steps", "batch_size", "workers")  # what `demo --study NAME` takes


def _demo_facts() -> list[Any]:
    """`mechopd demo`'s declared flags: the `DemoConfig` fields it takes (`DEMO_FLAGS`)."""
    from mechopd.core.options import field_facts
    from mechopd.pipeline.demo import DemoConfig

    facts = {f.name: f for f in field_facts(DemoConfig)}
    return [facts[name] for name in DEMO_FLAGS]


@dataclass
class DemoArgs:
    """`mechopd demo`'s own argument (the rest: `DemoConfig`'s fields, `DEMO_FLAGS`)."""

    study: str | None = option(
        None,
        help="run the built-in study mechopd/data/studies/NAME.yaml (e.g. smollm2-facts) as `mechopd run` does, "
        "into --out (default runs/NAME); takes " + ", ".join("--" + k.replace("_", "-") for k in STUDY_FLAGS),
        metavar="NAME",
    )


def _demo_args(p: argparse.ArgumentParser) -> None:
    add_given(p, field_facts(DemoArgs) + _demo_facts())  # declared once, on DemoConfig: help, range and default


@command("demo", "pretrain the organism, train OPD / NCA / TA-OPD, evaluate, probe, draw, report", _demo_args)
def _demo(a: argparse.Namespace) -> int:
    from mechopd.core.checks import check_out_dir
    from mechopd.pipeline.demo import DemoConfig, demo

    kw = given(a, _demo_facts(), "demo")  # each flag checked against its declaration, one line naming it
    if a.study is not None:
        return _demo_study(a.study, kw)
    check_out_dir(kw.get("out", DemoConfig.out))
    if "seed" in kw and "seeds" not in kw:
        kw["seeds"] = 1  # a chosen seed (0 too) is a one-seed demo
    demo(DemoConfig(**kw))
    return 0


def _demo_study(name: str, kw: dict[str, Any]) -> int:
    """`mechopd demo --study NAME`: the flags that shape an organism demo are refused, one line each."""
    from mechopd.core.checks import check_out_dir
    from mechopd.pipeline.demo import DemoConfig
    from mechopd.pipeline.named import run_named_study, study_file

    study_file(name)  # an unknown name first
    for key in (k for k in DEMO_FLAGS if k in kw and k not in STUDY_FLAGS):
        flag = "--" + key.replace("_", "-")
        raise ConfigError(f"demo --study {name} takes no {flag}: the study file names it; drop {flag}")
    if "out" in kw:
        check_out_dir(kw["out"])
    report = run_named_study(
        name, kw.get("out"), kw.get("fast", DemoConfig.fast), kw.get("workers"), kw.get("steps"), kw.get("batch_size")
    )
    print(f"report: {report}")
    return 0


@dataclass
class AggregateArgs:
    """`mechopd aggregate`'s arguments."""

    run_dirs: list[str] = option(help="demo run directories of one study (one per seed)", flag="run_dirs")
    out: str = option(help="directory for aggregate.json, the seed-band figures and report.md", metavar="OUT")
    study: str | None = option(
        None,
        help="a study YAML naming the runs by role, applied to every run dir (default: each run's study.yaml / "
        "demo.json)",
        metavar="FILE",
    )


def _aggregate_args(p: argparse.ArgumentParser) -> None:
    add_given(p, field_facts(AggregateArgs))


@command(
    "aggregate",
    "mean and 95% interval over seed runs (t over seeds, item floor): tables, bands, claims, report",
    _aggregate_args,
)
def _aggregate(a: argparse.Namespace) -> int:
    from mechopd.report.aggregate import aggregate

    with hold(a.out, "aggregate"):  # (the inputs are checked before anything is written; a refusal leaves no --out)
        print(f"report: {aggregate(a.run_dirs, a.out, study=a.study)}")
    return 0


@dataclass
class ExploreArgs:
    """`mechopd explore`'s arguments."""

    run_dir: str = option(
        help="a run dir with eval/*.json and/or probes/ (lens, patching, attention), its probes/ dir, or a "
        "`mechopd eval --compare` directory",
        flag="run_dir",
        metavar="RUN_DIR",
    )
    out: str | None = option(None, help="the HTML file (default RUN_DIR/explore.html)", metavar="FILE")


def _explore_args(p: argparse.ArgumentParser) -> None:
    add_given(p, field_facts(ExploreArgs))


@command(
    "explore",
    "one self-contained HTML page to read a run item by item: prompt, context, target, each model's "
    "answers in both views (Harm / Help), the probes' per-token views",
    _explore_args,
)
def _explore(a: argparse.Namespace) -> int:
    from mechopd.report.explore import write_explorer

    print(f"explorer: {write_explorer(a.run_dir, a.out)}")
    return 0
