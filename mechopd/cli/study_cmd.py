"""`mechopd figures`, `demo`, `run`, `aggregate` and `explore`: thin around the probes' registry, the
plots, the pipeline and the report. Registered in the command table of `mechopd.cli.common`; `mechopd.cli` builds the
parser."""

from __future__ import annotations

import argparse
from pathlib import Path

from mechopd.cli.common import command
from mechopd.core.errors import ConfigError
from mechopd.core.runlock import hold


# --- figures / demo -----------------------------------------------------------------------------------------------------
def _figures_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        nargs="?",
        default=None,
        help="a run directory written by `mechopd "
        "demo`; its figures/ and report.md are redrawn from its saved artifacts",
    )
    p.add_argument(
        "--study",
        default=None,
        metavar="FILE",
        help="a study YAML naming the runs by role (base, opd, "
        "nca, nca_const, ta_opd, ...; see mechopd/study/__init__.py): applied to RUN_DIR, or on its own its root",
    )


@command("figures", "redraw every figure of a run from its saved artifacts (no model is loaded)")
def _figures(a: argparse.Namespace) -> int:
    from mechopd.core.checks import check_out_dir
    from mechopd.core.runcheck import check_no_escape
    from mechopd.plots import redraw
    from mechopd.report import write_report_md
    from mechopd.study import Study, study_root
    from mechopd.study.checks import check_study

    if a.run_dir is None and a.study is None:
        raise ConfigError("mechopd figures needs RUN_DIR or --study FILE; e.g. mechopd figures runs/demo")
    if a.run_dir is not None and not Path(a.run_dir).is_dir():
        raise ConfigError(f"run directory {a.run_dir} does not exist; run `mechopd demo --out {a.run_dir}` first")
    run = Path(a.run_dir) if a.run_dir is not None else study_root(a.study)
    check_no_escape(run, run / "figures", "figures")  # never drawn through a link that leads out of the run
    check_out_dir(run / "figures", "figures")  # writable before anything is drawn
    with hold(run, "figures"):  # not while a demo or another redraw writes into the run (then read the study)
        study = check_study(Study.load(a.run_dir, a.study) if a.run_dir is not None else Study.load(a.study))
        drawn = redraw(study, run / "figures")  # all or none: a failure leaves the figures drawn before
        if sum(len(v) for v in drawn.values()):
            write_report_md(study)
    n = sum(len(v) for v in drawn.values())
    if n == 0:
        raise ConfigError(f"{run} holds no artifacts to draw (eval/, probes/, train/*/metrics.jsonl)")
    print(f"{n} files in {run / 'figures'}; report: {run / 'report.md'}")
    return 0


def _demo_args(p: argparse.ArgumentParser) -> None:
    _demo_what_args(p)
    _demo_size_args(p)


def _demo_what_args(p: argparse.ArgumentParser) -> None:
    """What the demo runs and where: --out, --task, --study, --fast, --sweep, --seed."""
    p.add_argument(
        "--out", default=None, metavar="DIR", help="demo directory (default runs/demo; with --study NAME: runs/NAME)"
    )
    p.add_argument("--task", default=None, metavar="TASK", help="rules (default) | frozenlake | sokoban")
    p.add_argument(
        "--study",
        default=None,
        metavar="NAME",
        help="run the built-in study mechopd/data/studies/NAME.yaml (e.g. smollm2-facts) as `mechopd run` does; "
        "takes --out, --fast, --steps, --batch-size, --workers",
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help="tiny organism and a few steps (for tests; <= 2 min); with --study: one seed, a few steps (a smoke run)",
    )
    p.add_argument("--sweep", action="store_true", help="also the TA-OPD budget sweep (figure 8)")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="INT",
        help="one training seed (a one-seed demo; the organism always uses seed 0)",
    )


def _demo_size_args(p: argparse.ArgumentParser) -> None:
    """How large and on how many processes: --steps, --seeds, --workers, --job-threads, --batch-size, --layers."""
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="INT",
        help="training steps per method, >= 1 (default: the task's demo budget, rules 100)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="N",
        help="N training seeds 0..N-1 into OUT/seed-k, "
        "then aggregated (95%% intervals made for few seeds: Student-t over the seeds' values, "
        "each seed's item noise as a floor, docs/method.md §8; default 6 for rules, 1 for a game or --fast)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="worker processes, each job on one thread "
        "(default: the intra-op thread count; the numbers do not depend on it)",
    )
    p.add_argument(
        "--job-threads",
        type=int,
        default=1,
        metavar="N",
        help="intra-op threads per job (default 1; "
        "another count changes the float order, hence the numbers: a robustness check)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="INT",
        help="prompts (games) per step (default: the task's demo budget)",
    )
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        metavar="INT",
        help="decoder layers of the organism (default 3; "
        "e.g. 8 for the shallow-vs-deep claim; pretrained once into runs/organisms/<task>-L<n>)",
    )


@command("demo", "pretrain the organism, train OPD / NCA / TA-OPD, evaluate, probe, draw, report")
def _demo(a: argparse.Namespace) -> int:
    from mechopd.core.checks import check_out_dir
    from mechopd.pipeline.demo import DemoConfig, demo

    if a.steps is not None and a.steps < 1:
        raise ConfigError(f"--steps {a.steps} is invalid: pass 1 or more (omit --steps for the recipe's)")
    if a.study is not None:
        return _demo_study(a)
    a.out = a.out or "runs/demo"
    check_out_dir(a.out)
    kw = {k: getattr(a, k) for k in ("steps", "batch_size") if getattr(a, k) is not None}  # 0 is refused, not dropped
    kw.update({"layers": a.layers} if a.layers is not None else {})
    seeds = 1 if a.seed is not None and a.seeds is None else a.seeds  # a chosen seed (0 too) is a one-seed demo
    demo(
        DemoConfig(
            task=a.task or "rules",
            out=a.out,
            fast=a.fast,
            sweep=a.sweep,
            seed=a.seed or 0,
            seeds=seeds,
            workers=a.workers,
            job_threads=a.job_threads,
            **kw,
        )
    )
    return 0


def _demo_study(a: argparse.Namespace) -> int:
    """`mechopd demo --study NAME`: the flags that shape an organism demo are refused, one line each."""
    from mechopd.core.checks import check_out_dir
    from mechopd.pipeline.named import run_named_study, study_file

    study_file(a.study)  # an unknown name first
    for flag, value in (("--task", a.task), ("--seed", a.seed), ("--seeds", a.seeds), ("--layers", a.layers)):
        if value is not None:
            raise ConfigError(f"demo --study {a.study} takes no {flag}: the study file names it; drop {flag}")
    if a.sweep or a.job_threads != 1:
        flag = "--sweep" if a.sweep else "--job-threads"
        raise ConfigError(f"demo --study {a.study} takes no {flag}; drop it (or `mechopd demo --task TASK {flag}`)")
    if a.out is not None:
        check_out_dir(a.out)
    report = run_named_study(a.study, a.out, a.fast, a.workers, a.steps, a.batch_size)
    print(f"report: {report}")
    return 0


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "study",
        metavar="STUDY.yaml",
        help="a study file: task, student, runs by role, seeds, eval, probes "
        "(README, `mechopd run`; mechopd/pipeline/spec.py)",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="output directory (default: the study file's folder / its stem)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="worker processes, each job on one thread (default: the intra-op thread count)",
    )


@command("run", "run a study file: train every run per seed, evaluate, probe, draw, aggregate, report (resumable)")
def _run(a: argparse.Namespace) -> int:
    from mechopd.pipeline.run import run_study

    print(f"report: {run_study(a.study, a.out, a.workers)}")
    return 0


def _aggregate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", help="demo run directories of one study (one per seed)")
    p.add_argument("--out", required=True, help="directory for aggregate.json, the seed-band figures and report.md")
    p.add_argument(
        "--study",
        default=None,
        metavar="FILE",
        help="a study YAML naming the runs by role, applied to "
        "every run dir (default: each run's study.yaml / demo.json)",
    )


@command("aggregate", "mean and 95% interval over seed runs (t over seeds, item floor): tables, bands, claims, report")
def _aggregate(a: argparse.Namespace) -> int:
    from mechopd.report.aggregate import aggregate

    with hold(a.out, "aggregate"):  # (the inputs are checked before anything is written; a refusal leaves no --out)
        print(f"report: {aggregate(a.run_dirs, a.out, study=a.study)}")
    return 0


def _explore_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run dir with eval/*.json and/or probes/ (lens, patching, "
        "attention), its probes/ dir, or a `mechopd eval --compare` directory",
    )
    p.add_argument("--out", default=None, metavar="FILE", help="the HTML file (default RUN_DIR/explore.html)")


@command(
    "explore",
    "one self-contained HTML page to read a run item by item: prompt, context, target, each model's "
    "answers in both views (Harm / Help), the probes' per-token views",
)
def _explore(a: argparse.Namespace) -> int:
    from mechopd.report.explore import write_explorer

    print(f"explorer: {write_explorer(a.run_dir, a.out)}")
    return 0
