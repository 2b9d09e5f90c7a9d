"""`mechopd` command: thin parsing around library calls. Bad input -> one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from mechopd.errors import ConfigError, MechopdError

COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help: str):
    def deco(fn):
        COMMANDS[name] = (help, fn)
        return fn

    return deco


def _kv(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    from mechopd.config import parse_overrides

    try:
        return parse_overrides(pairs or [])
    except ConfigError as e:
        raise ConfigError(str(e).replace("--set", flag)) from None


def _named(pairs: list[str] | None, flag: str) -> dict[str, str]:
    """``["base=DIR", "opd=DIR"]`` -> ordered dict; refuses malformed items."""
    out: dict[str, str] = {}
    for p in pairs or []:
        name, sep, path = p.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"{flag} {p!r} is not NAME=DIR; e.g. {flag} base=runs/organisms/rules opd=runs/opd/final")
        out[name] = path
    return out


# --- pretrain -----------------------------------------------------------------------------------------------------------
def _pretrain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, help="rules | frozenlake | sokoban")
    p.add_argument("--out", default=None, help="output directory (default runs/organisms/<task>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", default="qwen3", help="qwen3 (default) | llama")
    p.add_argument("--steps", type=int, default=None, help="pretraining steps (default: the organism's)")
    p.add_argument("--n", type=int, default=200, help="held-out items for the with/without-context check")


@command("pretrain", "pretrain (or reuse) an embedded model organism and report its accuracy with/without context")
def _pretrain(a: argparse.Namespace) -> int:
    import time

    from mechopd.evaluate import EvalConfig, evaluate_model
    from mechopd.models import load_model, load_tokenizer
    from mechopd.organisms.pretrain import OrganismConfig, default_config, pretrain
    from mechopd.tasks.base import get_task

    cfg = default_config(a.task, seed=a.seed, arch=a.arch, steps=a.steps)
    out = Path(a.out or f"runs/organisms/{a.task}")
    t0 = time.time()
    path = pretrain(cfg, out)
    print(f"organism {a.task}: {path} ({time.time() - t0:.0f} s)")
    rep = evaluate_model(load_model(path), load_tokenizer(path), get_task(a.task, **cfg.task_options),
                         EvalConfig(n=a.n, seed=a.seed, n_boot=0))
    s = rep["summary"]
    print(f"accuracy with context {s['acc_xc']['value']:.3f}, without context {s['acc_x']['value']:.3f} "
          f"(n={s['n']} held-out items, greedy)")
    (path / "accuracy.json").write_text(json.dumps({"acc_xc": s["acc_xc"]["value"], "acc_x": s["acc_x"]["value"],
                                                    "n": s["n"]}, indent=1))
    return 0


# --- train --------------------------------------------------------------------------------------------------------------
SHORTHANDS = ("task", "method", "student", "teacher", "steps", "beta", "budget", "selector", "lr", "batch_size",
              "seed", "eval_every")


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=None, help="YAML config (see training/*.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key")
    p.add_argument("--out", default=None, help="run directory (default runs/<config name or task-method>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--no-progress", action="store_true")
    for name in SHORTHANDS:
        p.add_argument(f"--{name.replace('_', '-')}", dest=f"short_{name}", default=None)


@command("train", "train one OPD / NCA / TA-OPD / ablation run")
def _train(a: argparse.Namespace) -> int:
    from mechopd.config import load_train_config, merge, parse_overrides
    from mechopd.train.trainer import train

    short = {k: getattr(a, f"short_{k}") for k in SHORTHANDS if getattr(a, f"short_{k}") is not None}
    over = parse_overrides([f"{k}={v}" for k, v in short.items()])
    over = merge(over, _kv(a.set, "--set"))
    cfg = load_train_config(a.config, over)
    name = Path(a.config).stem if a.config else f"{cfg.task}-{cfg.method}-{cfg.selector}"
    out = Path(a.out or f"runs/{name}")
    final = train(cfg, out, resume=a.resume, progress=not a.no_progress)
    print(f"final checkpoint: {final}")
    return 0


# --- eval ---------------------------------------------------------------------------------------------------------------
def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint dir (or organism:<task>)")
    p.add_argument("--compare", nargs="+", default=None, metavar="NAME=DIR", help="several models side by side")
    p.add_argument("--task", required=True)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="task option (e.g. rule=shift:1)")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=1, help="k sampled responses per item and view (default greedy)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--no-context-system", default=None, help="explicit system prompt of the no-context view")
    p.add_argument("--decoder", default="lean", help="lean (default; Llama/Qwen2/Qwen3) | hf (model(...) per step)")
    p.add_argument("--out", default=None, help="--model: report path (.json; a .csv of the records is written next to "
                   "it); --compare: a directory (one report per model + compare.md/.csv)")


@command("eval", "context-removability evaluation: both views, paired outcomes, Harm/Help/BothCorrect/Δlen, regime")
def _eval(a: argparse.Namespace) -> int:
    from mechopd.evaluate import EvalConfig, compare, evaluate_model, format_summary, write_report
    from mechopd.models import load_model, load_tokenizer
    from mechopd.tasks.base import get_task
    from mechopd.train.trainer import resolve_student
    from mechopd.views import RenderSpec

    if bool(a.model) == bool(a.compare):
        raise ConfigError("pass exactly one of --model DIR or --compare NAME=DIR ...")
    if a.compare and a.out and Path(a.out).suffix in (".json", ".csv", ".md"):
        raise ConfigError(f"--out {a.out} looks like a file, but --compare writes a directory (one report per model "
                          "+ compare.md/.csv); pass a directory, e.g. --out runs/compare/mytask")
    task = get_task(a.task, **_kv(a.option, "--option"))
    models = {"model": a.model} if a.model else _named(a.compare, "--compare")
    cfg = EvalConfig(n=a.n, seed=a.seed, samples=a.samples, temperature=a.temperature, decoder=a.decoder)
    spec = RenderSpec(placement=task.placement, no_context_system=a.no_context_system)
    reports = {}
    for name, path in models.items():
        path = resolve_student(path, "runs/organisms")
        reports[name] = evaluate_model(load_model(path), load_tokenizer(path), task, cfg, spec)
        reports[name]["settings"]["model"] = str(path)
        print(format_summary(name, reports[name]["summary"]))
    if a.model:
        out = Path(a.out or f"{a.model.rstrip('/')}/eval/{a.task}.json") if ":" not in a.model else \
            Path(a.out or f"runs/eval/{a.task}.json")
        j, c = write_report(reports["model"], out)
        print(f"report: {j} (records: {c})")
    else:
        out_dir = Path(a.out or f"runs/compare/{a.task}")
        for name, rep in reports.items():
            write_report(rep, out_dir / f"{name}.json")
        md, mdp, csvp = compare(reports, out_dir)
        print(md)
        print(f"table: {mdp} and {csvp}")
    return 0


# --- probe --------------------------------------------------------------------------------------------------------------
def _probe_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="probe", required=True)
    s = sub.add_parser("similarity", help="layerwise two-view hidden-state cosine (several models, same items)")
    s.add_argument("--models", nargs="+", required=True, metavar="NAME=DIR")
    s.add_argument("--task", required=True)
    s.add_argument("--responses-from", default=None, help="label of the model that samples the responses")
    s.add_argument("--layers", default=None, help="comma-separated decoder layers (default: all sites)")
    s.add_argument("--cka", action="store_true", help="also linear CKA over tokens")
    g = sub.add_parser("gradients", help="alignment of two loss terms' gradients (global, per layer, per module)")
    g.add_argument("--model", required=True)
    g.add_argument("--teacher", default=None, help="teacher checkpoint (default: the model itself)")
    g.add_argument("--task", required=True)
    g.add_argument("--terms", default="opd,nca", help="two of opd,nca,dual,sym")
    g.add_argument("--layers", default=None)
    g.add_argument("--estimator", default="full", help="full | topk | sampled")
    d = sub.add_parser("deltas", help="parameter-delta attribution per layer x module (streamed safetensors)")
    d.add_argument("--base", required=True)
    d.add_argument("--models", nargs="+", required=True, metavar="NAME=DIR")
    d.add_argument("--pair", default=None, help="two labels to compare, e.g. opd,nca (default: the first two)")
    t = sub.add_parser("teachability", help="fixed-context token teachability diagnostic")
    t.add_argument("--student", required=True, help="the initial student")
    t.add_argument("--trained", required=True)
    t.add_argument("--teacher", required=True)
    t.add_argument("--task", required=True)
    t.add_argument("--bank", default=None, help="an existing bank.json (default: build one)")
    for q in (s, g, d, t):
        q.add_argument("--out", default=None, help="output directory (default runs/probes/<probe>)")
        if q is not d:
            q.add_argument("--n", type=int, default=64)
            q.add_argument("--seed", type=int, default=0)


def _layers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--layers {text!r} must be comma-separated integers, e.g. --layers 0,1,2") from None


@command("probe", "mechanistic probes: similarity | gradients | deltas | teachability")
def _probe(a: argparse.Namespace) -> int:
    out = Path(a.out or f"runs/probes/{a.probe}")
    if a.probe == "similarity":
        from mechopd.probes.similarity import run_similarity

        path = run_similarity(_named(a.models, "--models"), a.task, a.n, a.seed, out, responses_from=a.responses_from,
                              layers=_layers(a.layers), cka=a.cka)
        print(f"similarity table: {path}")
    elif a.probe == "gradients":
        from mechopd.probes.gradients import run_gradients

        terms = tuple(t.strip() for t in a.terms.split(","))
        if len(terms) != 2:
            raise ConfigError(f"--terms {a.terms!r} must name two terms, e.g. --terms opd,nca")
        rows = run_gradients(a.model, a.teacher or a.model, a.task, a.n, a.seed, terms, out, estimator=a.estimator,
                             layers=_layers(a.layers))
        glob = [r for r in rows if r.scope == "global"][0]
        print(f"cos(grad {terms[0]}, grad {terms[1]}) = {glob.cos:.4f}, norm ratio {glob.norm_ratio:.4f}; "
              f"table: {out / 'gradients.csv'}")
    elif a.probe == "deltas":
        from mechopd.probes.deltas import parameter_deltas, write_table

        models = _named(a.models, "--models")
        pair = tuple(a.pair.split(",")) if a.pair else (tuple(list(models)[:2]) if len(models) >= 2 else None)
        rows = parameter_deltas(a.base, models, pair=pair)
        paths = write_table(rows, out / "deltas.csv")
        print(f"delta table: {', '.join(str(p) for p in paths)}")
    else:
        from mechopd.probes.teachability import run_teachability

        summary = run_teachability(a.student, a.trained, a.teacher, a.task, a.n, a.seed, out, bank=a.bank)
        print(f"teachability: {out / 'teachability_summary.json'}")
        print(json.dumps(summary.get("gap", {}), indent=1, default=str)[:2000])
    return 0


# --- figures / demo -----------------------------------------------------------------------------------------------------
def _figures_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory written by `mechopd demo`")


@command("figures", "redraw every figure of a run from its saved artifacts (no model is loaded)")
def _figures(a: argparse.Namespace) -> int:
    from mechopd.plots import draw_all
    from mechopd.report import write_report_md

    run = Path(a.run_dir)
    if not run.is_dir():
        raise ConfigError(f"run directory {run} does not exist; run `mechopd demo --out {run}` first")
    drawn = draw_all(run)
    n = sum(len(v) for v in drawn.values())
    if n == 0:
        raise ConfigError(f"{run} holds no artifacts to draw (eval/, probes/, train/*/metrics.jsonl)")
    write_report_md(run)
    print(f"{n} files in {run / 'figures'}; report: {run / 'report.md'}")
    return 0


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--task", default="rules", help="rules (default) | frozenlake | sokoban")
    p.add_argument("--fast", action="store_true", help="tiny organism and a few steps (for tests; <= 2 min)")
    p.add_argument("--sweep", action="store_true", help="also the TA-OPD budget sweep (figure 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seeds", type=int, default=1, help="N training seeds 0..N-1 into OUT/seed-k, then aggregated")
    p.add_argument("--batch-size", type=int, default=None, help="prompts (games) per step (default 32)")


@command("demo", "pretrain the organism, train OPD / NCA / TA-OPD, evaluate, probe, draw, report")
def _demo(a: argparse.Namespace) -> int:
    from mechopd.demo import DemoConfig, demo

    kw = {"steps": a.steps} if a.steps else {}
    kw.update({"batch_size": a.batch_size} if a.batch_size else {})
    demo(DemoConfig(task=a.task, out=a.out, fast=a.fast, sweep=a.sweep, seed=a.seed, seeds=a.seeds, **kw))
    return 0


def _aggregate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", help="demo run directories of one study (one per seed)")
    p.add_argument("--out", required=True, help="directory for aggregate.json, the seed-band figures and report.md")


@command("aggregate", "mean and 95% t-interval over seed runs: tables, bands, claims, report")
def _aggregate(a: argparse.Namespace) -> int:
    from mechopd.aggregate import aggregate

    print(f"report: {aggregate(a.run_dirs, a.out)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(prog="mechopd", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    registry = {"pretrain": _pretrain_args, "train": _train_args, "eval": _eval_args, "probe": _probe_args,
                "figures": _figures_args, "demo": _demo_args, "aggregate": _aggregate_args}
    for name, (help_text, _) in COMMANDS.items():
        registry[name](sub.add_parser(name, help=help_text))
    a = parser.parse_args(argv)
    try:
        return COMMANDS[a.cmd][1](a)
    except MechopdError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
