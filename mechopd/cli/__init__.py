"""`mechopd` command: thin parsing around library calls. Bad input -> one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mechopd.cli.common import COMMANDS, command, kv_raw as _kv_raw
from mechopd.cli.eval_cmd import _eval_args
from mechopd.core.errors import ConfigError, MechopdError
from mechopd.core.runlock import hold, lockable


# --- pretrain -----------------------------------------------------------------------------------------------------------
def _pretrain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, metavar="TASK", help="organism task: rules | frozenlake | sokoban")
    p.add_argument("--out", default=None, metavar="DIR", help="organism directory (default runs/organisms/<task>); "
                   "an organism already there with the same config is reused")
    p.add_argument("--seed", type=int, default=0, metavar="INT", help="seed of the corpus, the initial weights and "
                   "the held-out check (default 0)")
    p.add_argument("--arch", default="qwen3", metavar="ARCH", help="decoder architecture: qwen3 (default) | llama")
    p.add_argument("--steps", type=int, default=None, metavar="INT", help="pretraining steps, >= 1 (default: the "
                   "organism's measured schedule)")
    p.add_argument("--n", type=int, default=200, metavar="INT", help="held-out items of the with/without-context "
                   "accuracy check, >= 1 (default 200)")
    p.add_argument("--layers", type=int, default=None, metavar="INT", help="decoder layers (default 3; e.g. 8 for "
                   "layer studies; cached as runs/organisms/<task>-L<n>)")
    p.add_argument("--num-heads", type=int, default=None, metavar="INT", help="attention heads (default 4: head_dim "
                   "24; 3 gives head_dim 32, a size vLLM's CPU attention accepts)")
    p.add_argument("--num-kv-heads", type=int, default=None, metavar="INT", help="key/value heads (default 2; must "
                   "divide --num-heads)")


@command("pretrain", "pretrain (or reuse) an embedded model organism and report its accuracy with/without context")
def _pretrain(a: argparse.Namespace) -> int:
    import time

    from mechopd.pipeline.pretrain import pretrain_organism

    t0 = time.time()
    path, acc = pretrain_organism(a.task, a.out, seed=a.seed, arch=a.arch, steps=a.steps, n=a.n, layers=a.layers,
                                  num_heads=a.num_heads, num_kv_heads=a.num_kv_heads)
    print(f"organism {a.task}: {path} ({time.time() - t0:.0f} s)")
    print(f"accuracy with context {acc['acc_xc']:.3f}, without context {acc['acc_x']:.3f} (n={acc['n']} held-out "
          "items, greedy)")
    return 0


# --- train --------------------------------------------------------------------------------------------------------------
def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=None, metavar="CONFIG.yaml", help="YAML config (see training/*.yaml); "
                   "flags override its keys")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key, "
                   "repeatable (e.g. --set lr=1e-4 --set task_options.rule=shift:2)")
    p.add_argument("--out", default=None, metavar="DIR", help="run directory, new or empty unless --resume (default "
                   "runs/<config name or task-method-selector>)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="task option, repeatable (e.g. "
                   "rule=shift:2); same as --set task_options.KEY=VALUE, and as eval's and probe's --option")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (metrics.jsonl is written either way)")
    p.add_argument("--verbose", action="store_true", help="print the full resolved config (default: one line and the "
                   "path of the run's config.yaml)")
    from mechopd.config import train_facts
    from mechopd.core.options import add_flags

    add_flags(p, train_facts())  # one flag per config key (mechopd.config: help, range and choices declared once)


def run_name(config: str | None, task: str, method: str, selector: str) -> str:
    """Default run directory name: the config's stem, except for a per-task organism recipe
    (``training/organisms/<task>.yaml``, method as a flag) or no config: ``<task>-<method>-<selector>``."""
    stem = Path(config).stem if config else None
    return stem if stem not in (None, task) else f"{task}-{method}-{selector}"


@command("train", "train one OPD / NCA / TA-OPD / ablation run")
def _train(a: argparse.Namespace) -> int:
    if a.out and lockable(a.out) and os.environ.get("RANK", "0") == "0":  # lock first (torchrun: rank 0):
        # a second job on this --out refuses before torch loads
        with hold(a.out, "train"):
            return _train_locked(a)
    return _train_locked(a)


def _train_locked(a: argparse.Namespace) -> int:
    from mechopd.core.checks import check_out_dir
    from mechopd.config import load_train_config, merge, parse_overrides, train_facts
    from mechopd.core.options import flag_values
    from mechopd.train.trainer import train

    flags = merge(flag_values(a, train_facts()), parse_overrides([f"task_options.{kv}" for kv in a.option], "--option"))
    over = merge(flags, _kv_raw(a.set, "--set"))  # values still text: read once, by each field's type
    cfg = load_train_config(a.config, over)
    out = check_out_dir(a.out or f"runs/{run_name(a.config, cfg.task, cfg.method, cfg.selector)}")
    if (out / "config.json").is_file():
        raise ConfigError(f"--out {out} is a model directory (config.json), not a training run; a run writes its own "
                          "directory: choose another --out (the model is not touched)")
    final = train(cfg, out, resume=a.resume, progress=not a.no_progress, verbose=a.verbose)
    if os.environ.get("RANK", "0") == "0":  # torchrun: said once, by rank 0
        print(f"final checkpoint: {final}")
    return 0


# --- probe --------------------------------------------------------------------------------------------------------------
def _probe_args(p: argparse.ArgumentParser) -> None:
    from mechopd.probes.registry import add_probe_parsers

    add_probe_parsers(p)  # one verb per registered probe (mechopd.probes.registry)


@command("probe", "mechanistic probes (mechopd probe NAME --run RUN_DIR; NAME: see mechopd probe --help)")
def _probe(a: argparse.Namespace) -> int:
    from mechopd.probes.registry import run_from_args

    for line in run_from_args(a):
        print(line)
    return 0


# --- figures / demo -----------------------------------------------------------------------------------------------------
def _figures_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?", default=None, help="a run directory written by `mechopd "
                   "demo`; its figures/ and report.md are redrawn from its saved artifacts")
    p.add_argument("--study", default=None, metavar="FILE", help="a study YAML naming the runs by role (base, opd, "
                   "nca, nca_const, ta_opd, ...; see mechopd/study/__init__.py): applied to RUN_DIR, or on its own its root")


@command("figures", "redraw every figure of a run from its saved artifacts (no model is loaded)")
def _figures(a: argparse.Namespace) -> int:
    from mechopd.core.checks import check_out_dir
    from mechopd.plots import draw_all
    from mechopd.report import write_report_md
    from mechopd.study import Study, study_root
    from mechopd.study.checks import check_study

    if a.run_dir is None and a.study is None:
        raise ConfigError("mechopd figures needs RUN_DIR or --study FILE; e.g. mechopd figures runs/demo")
    if a.run_dir is not None and not Path(a.run_dir).is_dir():
        raise ConfigError(f"run directory {a.run_dir} does not exist; run `mechopd demo --out {a.run_dir}` first")
    run = Path(a.run_dir) if a.run_dir is not None else study_root(a.study)
    check_out_dir(run / "figures", "figures")  # writable before anything is drawn
    with hold(run, "figures"):  # not while a demo or another redraw writes into the run (then read the study)
        study = check_study(Study.load(a.run_dir, a.study) if a.run_dir is not None else Study.load(a.study))
        drawn = draw_all(study)
        if sum(len(v) for v in drawn.values()):
            write_report_md(study)
    n = sum(len(v) for v in drawn.values())
    if n == 0:
        raise ConfigError(f"{run} holds no artifacts to draw (eval/, probes/, train/*/metrics.jsonl)")
    print(f"{n} files in {run / 'figures'}; report: {run / 'report.md'}")
    return 0


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="demo directory (default runs/demo)")
    p.add_argument("--task", default="rules", metavar="TASK", help="rules (default) | frozenlake | sokoban")
    p.add_argument("--fast", action="store_true", help="tiny organism and a few steps (for tests; <= 2 min)")
    p.add_argument("--sweep", action="store_true", help="also the TA-OPD budget sweep (figure 8)")
    p.add_argument("--seed", type=int, default=None, metavar="INT", help="one training seed (a one-seed demo; the organism always uses seed 0)")
    p.add_argument("--steps", type=int, default=None, metavar="INT", help="training steps per method, >= 1 (default: "
                   "the task's demo budget, rules 100)")
    p.add_argument("--seeds", type=int, default=None, metavar="N", help="N training seeds 0..N-1 into OUT/seed-k, "
                   "then aggregated (95%% t-interval over seeds; default 3 for rules, 1 for a game or --fast)")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="worker processes, each job on one thread "
                   "(default: the intra-op thread count; the numbers do not depend on it)")
    p.add_argument("--job-threads", type=int, default=1, metavar="N", help="intra-op threads per job (default 1; "
                   "another count changes the float order, hence the numbers: a robustness check)")
    p.add_argument("--batch-size", type=int, default=None, metavar="INT", help="prompts (games) per step (default: the "
                   "task's demo budget)")
    p.add_argument("--layers", type=int, default=None, metavar="INT", help="decoder layers of the organism (default 3; "
                   "e.g. 8 for the shallow-vs-deep claim; pretrained once into runs/organisms/<task>-L<n>)")


@command("demo", "pretrain the organism, train OPD / NCA / TA-OPD, evaluate, probe, draw, report")
def _demo(a: argparse.Namespace) -> int:
    from mechopd.pipeline.demo import DemoConfig, demo

    from mechopd.core.checks import check_out_dir

    if a.steps is not None and a.steps < 1:
        raise ConfigError(f"--steps {a.steps} is invalid: pass 1 or more (omit --steps for the recipe's)")
    check_out_dir(a.out)
    kw = {k: getattr(a, k) for k in ("steps", "batch_size") if getattr(a, k) is not None}  # 0 is refused, not dropped
    kw.update({"layers": a.layers} if a.layers is not None else {})
    seeds = 1 if a.seed is not None and a.seeds is None else a.seeds  # a chosen seed (0 too) is a one-seed demo
    demo(DemoConfig(task=a.task, out=a.out, fast=a.fast, sweep=a.sweep, seed=a.seed or 0, seeds=seeds,
                    workers=a.workers, job_threads=a.job_threads, **kw))
    return 0


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("study", metavar="STUDY.yaml", help="a study file: task, student, runs by role, seeds, eval, probes "
                   "(README, `mechopd run`; mechopd/pipeline/spec.py)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default: the study file's folder / "
                   "its stem)")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="worker processes, each job on one thread "
                   "(default: the intra-op thread count)")


@command("run", "run a study file: train every run per seed, evaluate, probe, draw, aggregate, report (resumable)")
def _run(a: argparse.Namespace) -> int:
    from mechopd.pipeline.run import run_study

    print(f"report: {run_study(a.study, a.out, a.workers)}")
    return 0


def _aggregate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", help="demo run directories of one study (one per seed)")
    p.add_argument("--out", required=True, help="directory for aggregate.json, the seed-band figures and report.md")
    p.add_argument("--study", default=None, metavar="FILE", help="a study YAML naming the runs by role, applied to "
                   "every run dir (default: each run's study.yaml / demo.json)")


@command("aggregate", "mean and 95% t-interval over seed runs: tables, bands, claims, report")
def _aggregate(a: argparse.Namespace) -> int:
    from mechopd.report.aggregate import aggregate

    with hold(a.out, "aggregate"):  # (the inputs are checked before anything is written; a refusal leaves no --out)
        print(f"report: {aggregate(a.run_dirs, a.out, study=a.study)}")
    return 0


def _explore_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run dir with eval/*.json and/or probes/ (lens, patching, "
                   "attention), its probes/ dir, or a `mechopd eval --compare` directory")
    p.add_argument("--out", default=None, metavar="FILE", help="the HTML file (default RUN_DIR/explore.html)")


@command("explore", "one self-contained HTML page to read a run item by item: prompt, context, target, each model's "
         "answers in both views (Harm / Help), the probes' per-token views")
def _explore(a: argparse.Namespace) -> int:
    from mechopd.report.explore import write_explorer

    print(f"explorer: {write_explorer(a.run_dir, a.out)}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    """The `mechopd` parser: one subcommand per registered command."""
    parser = argparse.ArgumentParser(prog="mechopd", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    registry = {"run": _run_args, "pretrain": _pretrain_args, "train": _train_args, "eval": _eval_args,
                "probe": _probe_args, "figures": _figures_args, "demo": _demo_args, "aggregate": _aggregate_args,
                "explore": _explore_args}
    for name, add_args in registry.items():  # this order in `mechopd --help`
        help_text = COMMANDS[name][0]
        add_args(sub.add_parser(name, help=help_text.replace("%", "%%"), description=help_text))  # help is %-formatted
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    a = make_parser().parse_args(argv)
    try:
        return COMMANDS[a.cmd][1](a)
    except MechopdError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk / quota in any verb: one line (every writer is atomic: nothing older is lost)
        from mechopd.core.runcheck import disk_error

        if disk_error(e) is None:
            raise
        print(f"error: {disk_error(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
