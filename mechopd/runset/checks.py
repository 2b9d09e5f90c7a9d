"""A study checked whole before anything is written (`mechopd figures --study`, `mechopd aggregate`).

`check_study` (one study): every role names a run that exists under the study's root (its ``train/<name>`` or its
``eval/<name>.json``), and the study's ``task`` is the runs' own (``demo.json``'s and each run's ``config.yaml``);
labels and ``root:`` are checked where the study is read (`mechopd.core.checks.check_display_label`, `inside_root`).

`check_seeds` (the seed runs of `aggregate`): each seed passes `check_study`, and every role's evaluation report is
present in every seed and carries the same blocks (the summary keys, ``other_contexts``) with numbers in their range.
A seed written by an older release that lacks a newer block (the following block: ``follow_other``, ``stick``,
``retention``) is refused with the seed and the fix, never averaged over the seeds that have it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from mechopd.core.config_parse import load_yaml
from mechopd.core.errors import ConfigError, DataError
from mechopd.runset import BASE, RunSet

RATES = ("acc_x", "acc_xc", "harm", "help", "both_correct")  # probabilities: in [0, 1]
MAX_ABS = 1e6  # any other number of an evaluation summary (delta_len: tokens) is below this in magnitude
BLOCKS = ("follow_other", "stick", "retention")  # the newer summary keys a seed may lack (written by `following`)


def check_study(study: RunSet) -> RunSet:
    """`study` after checking that its roles resolve to runs and its task is the runs' own; ConfigError otherwise."""
    for run in study:
        if run.role == BASE or run.train_dir.is_dir() or run.eval_path.is_file():
            continue
        known = sorted(p.name for p in (study.root / "train").glob("*") if p.is_dir())
        raise ConfigError(
            f"{study.source}: role {run.role!r} names run {run.name!r}, but neither {run.train_dir} nor "
            f"{run.eval_path} exists (runs in {study.root / 'train'}: {', '.join(known) or 'none'}); "
            f"fix runs.{run.role}"
        )
    for run in study:  # every evaluation report read whole now (typed), not half-way through drawing
        if run.eval_path.is_file():
            study.eval(run.role)
    tasks = _run_tasks(study)
    if len(tasks) == 1 and study.task == study.root.name and study.task not in tasks:  # no task given: the runs'
        study = replace(study, task=next(iter(tasks)))
    if tasks and study.task not in tasks:
        raise ConfigError(
            f"{study.source}: task {study.task!r}, but the runs were trained on {', '.join(sorted(tasks))}"
            f"; drop the task: line (the task comes from the runs) or name runs of task {study.task!r}"
        )
    if len(tasks) > 1:
        raise ConfigError(
            f"{study.source}: the runs were trained on several tasks ({', '.join(sorted(tasks))}); a "
            "study compares runs of one task"
        )
    return study


def check_seeds(seeds: Sequence[RunSet]) -> list[RunSet]:
    """The seed studies of `aggregate` after `check_study` on each and the per-role evaluation checks (module
    docstring); DataError naming the seed, the file and the fix."""
    seeds = [check_study(s) for s in seeds]
    first = seeds[0]
    if any(s.task != first.task or s.roles != first.roles for s in seeds):
        return seeds  # not one study: `aggregate.check_runs` names the difference
    for run in first:
        reports = {}
        for k, s in enumerate(seeds):
            r = s.run(run.role)
            if r is None or not r.eval_path.is_file():
                if all((xr := x.run(run.role)) is None or not xr.eval_path.is_file() for x in seeds):
                    break  # measured in no seed: the role has no row, as before
                raise DataError(
                    f"aggregate: role {run.role!r} has no evaluation in seed run {s.root} (expected "
                    f"{r.eval_path if r else 'a run for it'}); evaluate it there (rerun mechopd demo) or "
                    "leave that seed out"
                )
            report = s.eval(run.role)
            assert report is not None  # r.eval_path is a file (checked above), so the report loads
            reports[k] = _checked_summary(report.to_dict(), r.eval_path)
        _same_blocks(reports, seeds, run.role)
    return seeds


def _checked_summary(doc: dict, path: Path) -> set[str]:
    """The block keys of an evaluation report (summary keys, ``other_contexts``); a number out of range refused (a
    rate outside [0, 1], anything else beyond ±`MAX_ABS`)."""
    summary = doc["summary"]
    for key, entry in summary.items():
        parts = entry if isinstance(entry, dict) else {"value": entry}
        for part in ("value", "low", "high"):
            x = parts.get(part)
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                continue  # text fields (regime) / null; the typed reader refused text where a number belongs
            low, high = (0.0, 1.0) if key in RATES else (-MAX_ABS, MAX_ABS)
            if not low <= x <= high:
                name = key if part == "value" else f"{key}.{part}"
                raise DataError(
                    f"{path}: summary.{name} = {x!r} is outside [{low}, {high}]; rewrite the report with "
                    "mechopd eval (or rerun mechopd demo)"
                )
    return set(summary) | ({"other_contexts"} if doc.get("other_contexts") is not None else set())


def _same_blocks(reports: dict[int, set[str]], seeds: Sequence[RunSet], role: str) -> None:
    every = set().union(*reports.values()) if reports else set()
    for k, keys in reports.items():
        missing = sorted((every - keys) & (set(BLOCKS) | {"other_contexts"}))
        if missing:
            has = next((seeds[j].root for j, ks in reports.items() if set(missing) <= ks), "another seed")
            raise DataError(
                f"aggregate: seed run {seeds[k].root} has no {', '.join(missing)} for role {role!r} "
                f"(written by an older mechopd), but {has} has; a mean over the seeds that have it would "
                f"shrink silently: re-evaluate that seed with --other-contexts (rerun mechopd demo) or "
                "leave it out"
            )


def _run_tasks(study: RunSet) -> set[str]:
    """The task(s) the study's runs record: demo.json's ``task`` and each run's ``config.yaml``."""
    tasks = {str(study.manifest["task"])} if study.manifest.get("task") else set()
    for run in study:
        cfg = run.train_dir / "config.yaml"
        if run.role != BASE and cfg.is_file():
            task = load_yaml(cfg).get("task")
            if task:
                tasks.add(str(task))
    return tasks
