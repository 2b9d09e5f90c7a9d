"""`mechopd eval`: both views (and other contexts) on held-out items for one or more models; thin around
`mechopd.evaluation.evaluate`. Registered in the command table of `mechopd.cli.common`; `mechopd.cli` builds the parser."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechopd.cli.common import add_given, command, kv, named, setup_facts, text
from mechopd.core.artifacts import FileSet
from mechopd.core.errors import ConfigError
from mechopd.core.options import add_flags, bind, field_facts, flag_values, option
from mechopd.core.runlock import hold

# --- eval ---------------------------------------------------------------------------------------------------------------
EVAL_SETUP = ("run", "task", "task_options", "no_context_system", "chat_template_kwargs")  # as the probes' setup


@dataclass
class EvalArgs:
    """`mechopd eval`'s own arguments: the models and where the reports go (the render and task flags: the probes'
    setup's, `EVAL_SETUP`; the evaluation's: `EvalConfig`)."""

    model: str | None = option(
        None,
        help="checkpoint dir, hub id, organism:<task> or model:NAME; a checkpoint written by mechopd train renders as "
        "its final/training.json records",
        metavar="DIR",
    )
    compare: list[str] | None = option(
        None,
        help="several models side by side on the same items; NAME is a plain label (letters, digits, _ - .) used as a "
        "file name",
        metavar="NAME=DIR",
    )
    other_contexts: bool = option(
        False,
        help="also answer every item under each of the task's other contexts: follow_other, stick; with --compare and "
        "a model named base: retention, context-deaf (docs/method.md)",
        switch=True,
    )
    out: str | None = option(
        None,
        help="--model: report path ending in .json (a .csv of the records is written next to it) or a directory "
        "(created when missing); --compare: a directory (one report per model + compare.md/.csv)",
        metavar="PATH",
    )


def _eval_args(p: argparse.ArgumentParser) -> None:
    """The models (--model, --compare; --run from the setup flags), the render and task flags the probes share
    (`common.setup_facts`), EvalConfig's declared fields, --other-contexts and --out."""
    from mechopd.evaluation.config import EVAL_FACTS

    setup = [  # eval's task default is the one the models record (`evaluation.records.recorded_task`)
        dataclasses.replace(f, help="task name (default: the task the run or checkpoint records)")
        if f.name == "task"
        else f
        for f in setup_facts(*EVAL_SETUP)
    ]
    own = {f.name: f for f in field_facts(EvalArgs)}
    add_given(p, [own["model"], own["compare"], *setup])  # a chat-template variable unlike the run's is refused
    add_flags(p, EVAL_FACTS, sets=False)  # --n, --seed, --samples, --temperature, ...: declared once, on EvalConfig
    add_given(p, [own["other_contexts"], own["out"]])


def _eval_targets(a: argparse.Namespace, labels: list[str]) -> tuple[dict[str, Path], Path | None]:
    """Report path per label (and the --compare directory), checked writable and clobber-free before any load."""
    from mechopd.core.checks import check_out_dir, check_report_target
    from mechopd.core.model_checks import INDEX, WEIGHTS
    from mechopd.core.runcheck import default_eval_report

    if a.model:
        out = Path(a.out) if a.out else default_eval_report(a.model, a.task)  # never inside the checkpoint
        if out.is_dir() or (not out.suffix and not out.exists() and not out.is_symlink()):
            out = out / f"{a.task}.json"  # a directory, created when missing (as every verb's --out)
        elif out.suffix != ".json":
            raise ConfigError(
                f"--out {a.out}: pass a report path ending in .json (a .csv of the records is written "
                "next to it) or a directory"
            )
        return {"model": check_report_target(out)}, None
    if a.out and Path(a.out).suffix in (".json", ".csv", ".md"):
        raise ConfigError(
            f"--out {a.out} looks like a file, but --compare writes a directory (one report per model "
            "+ compare.md/.csv); pass a directory, e.g. --out runs/compare/mytask"
        )
    out_dir = check_out_dir(a.out or f"runs/compare/{a.task}")
    if any((out_dir / f).exists() for f in ("config.json", WEIGHTS, INDEX)):
        raise ConfigError(
            f"--out {out_dir} is a checkpoint directory; --compare writes its reports into a directory "
            f"of their own, e.g. --out runs/compare/{a.task}"
        )
    return {name: check_report_target(out_dir / f"{name}.json") for name in labels}, out_dir


@command(
    "eval",
    "context-removability evaluation: both views, paired outcomes, Harm/Help/BothCorrect/Δlen, regime",
    _eval_args,
)
def _eval(a: argparse.Namespace) -> int:
    from mechopd.evaluation.config import EVAL_FACTS, EvalConfig
    from mechopd.evaluation.run import evaluate_plan, plan_eval

    if sum(bool(x) for x in (a.model, a.run, a.compare)) != 1:
        raise ConfigError("pass exactly one of --model DIR, --run RUN_DIR or --compare NAME=DIR ...")
    cfg = bind(EvalConfig, flags=flag_values(a, EVAL_FACTS), source="eval")
    models = {"model": a.model or str(Path(a.run or "", "final"))} if not a.compare else named(a.compare, "--compare")
    a.model = models.get("model")  # --run: its final/ (the default report path sits under it)
    plan = plan_eval(models, a.task, kv(a.task_options, "--option"), run=a.run)
    a.task = plan.task_name
    targets, out_dir = _eval_targets(a, list(models))
    ncs, kwargs = text(a.no_context_system, "--no-context-system"), kv(a.chat_template_kwargs, "--chat-template-kwarg")
    with hold(out_dir or targets["model"].parent, "eval"):  # one writer per report directory
        reports = evaluate_plan(
            plan, cfg, no_context_system=ncs, chat_template_kwargs=kwargs, other_contexts=bool(a.other_contexts)
        )
        return _write_reports(a, reports, targets, out_dir)


def _write_reports(
    a: argparse.Namespace, reports: dict[str, Any], targets: dict[str, Path], out_dir: Path | None
) -> int:
    from mechopd.evaluation import following
    from mechopd.evaluation.evaluate import compare, format_summary, write_report

    for name, rep in reports.items():
        print(format_summary(name, rep["summary"]))
    if a.other_contexts:
        print(following.format_following(reports))
    if out_dir is None:
        written = write_report(reports["model"], targets["model"])  # r.json + r.csv as one set (FileSet)
        print(f"report: {written[0]} (records: {written[1]})")
        return 0
    with FileSet(out_dir, "compare") as stage:  # every report + compare.md/.csv: one set, never mixed runs
        for name, rep in reports.items():
            write_report(rep, stage.dir / targets[name].name)
        md, _, _ = compare(reports, stage.dir)
    print(md)
    print(f"table: {out_dir / 'compare.md'} and {out_dir / 'compare.csv'}")
    return 0
