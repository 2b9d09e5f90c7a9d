"""`mechopd run STUDY.yaml`: a study file (`mechopd.pipeline.spec`) run as jobs on the worker pool; `mechopd demo`
runs its built-in study through the same jobs.

The pipeline for any model: per training seed k (``OUT`` with one seed, ``OUT/seed-k`` with several), one training
job per run of the study (`train_runs`: a finished run skipped, a killed one resumed from its last checkpoint; a
checkpoint run, ``checkpoint: DIR``, has none: its directory is evaluated and probed as it is), then the seed's finish
job (`finish_seed`): base and every run evaluated in both views (and under the task's other contexts), the listed
probes (the ``first_seed_only`` ones on the first seed only), every figure the artifacts allow, ``report.md``
(`stages.evaluate_all`, `stages.run_probes`, `plots.draw_all`, `report.write_report_md`). With two or more seeds, the
aggregate over seeds and its ``report.md`` with the claims table (`aggregate.aggregate`); a claim whose roles the
study lacks reads "not measurable here". Jobs run on ``workers`` processes, one pinned thread each, one log per job
in ``<seed run>/logs/`` (`pipeline.pool`).

What a seed run does beyond that is data on its `SeedRun`, set by the runner that builds it: `seed_runs` here, and
`demo.seed_run` for the demo (figures on its first seed only, the ``--sweep`` budget curve, its manifest's runs and
config); there is one finish job for both.

``OUT`` (default: the study file's folder / its stem) records the study (``study_run.yaml``) and what its runs are made
from by content (``study_inputs.json``: student, teacher, data and context files, `preflight.study_inputs`) before
any job: a rerun with another study, or the same study over other inputs (``student: ./base`` run from another
folder), is refused, naming the keys that differ; so is a directory the study did not write, a study record without
its inputs record, and a trained run whose config.yaml records another config (`reuse`). A change of the evaluation or
probe options only reuses every trained model and reruns what depends on it (`reuse.Stale`). The models are
checked before that (`preflight.check_study_models`); SIGTERM stops the run as Ctrl-C does. When every stage is done (``study_done.json``, written last, and every file it vouches for), a rerun says so
and returns at once.

    from mechopd.pipeline.run import run_study
    run_study("training/studies/qwen3-1.7b-jsonl.yaml", workers=1)
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from mechopd.core.artifacts import read_json, write_json, write_text
from mechopd.core.config_parse import load_yaml
from mechopd.core.errors import ConfigError
from mechopd.core.provenance import changed_inputs
from mechopd.core.runcheck import check_out_place
from mechopd.core.runlock import hold
from mechopd.models.arch import check_lora_targets
from mechopd.models.spec import is_named, organism_task, resolve_spec
from mechopd.pipeline.budget import StudyClock, check_budget
from mechopd.pipeline.logline import as_run
from mechopd.pipeline.pool import (
    ORGANISM_THREADS,
    PoolOptions,
    default_workers,
    finished,
    job_threads,
    run_seed_runs,
    terminate_as_interrupt,
    workers_why,
)
from mechopd.pipeline.preflight import check_study_models, study_inputs
from mechopd.pipeline.reuse import (
    Stale,
    check_foreign,
    check_inputs_recorded,
    check_trained_configs,
    clear_stale,
    stale_after,
)
from mechopd.pipeline.spec import CHECKPOINT, StudySpec, default_out
from mechopd.pipeline.stages import evaluate_all, labels_for, probes_whole, run_probes, train_resumable
from mechopd.pipeline.sweep import sweep
from mechopd.runset import MANIFEST_FILE, STUDY_FILE, RunSet

SPEC_FILE = "study_run.yaml"  # the study as run (a rerun compares it; the reports' command runs it again)
DONE_FILE = "study_done.json"
INPUTS_FILE = "study_inputs.json"  # what the runs were made from, by content (`preflight.study_inputs`)


@dataclass(frozen=True)
class SeedRun:
    """One training seed of a study, as the pool's jobs see it (`pool.Job.cfg`). The fields after ``job_threads``
    say what its finish job does beyond evaluation, probes and report; `seed_runs` sets them for a study,
    `demo.seed_run` for the demo."""

    spec: StudySpec
    out: str
    seed: int
    student: str  # the resolved base checkpoint (a local dir, or a hub id)
    study_out: str = ""  # the study's OUT (the seed run's parent with several seeds)
    job_threads: int = PoolOptions.job_threads
    all_probes: bool = False  # every registered probe with a demo entry (the demo's), not only the study's listed ones
    first_seed: bool = True  # runs the study's first_seed_only probes (a study's first seed, the demo's seed 0)
    figures: bool = True  # draws the figures (a study: on every seed; the demo: on its first seed only)
    sweep: Mapping[str, Any] | None = None  # the budget sweep (`pipeline.sweep`): what each sweep run adds
    manifest_runs: Mapping[str, Mapping[str, Any]] | None = None  # demo.json's runs (None: `StudySpec.methods`)
    manifest_config: Mapping[str, Any] | None = None  # demo.json's config (None: the study's, with its study file)

    @property
    def task(self) -> str:
        return self.spec.task

    @property
    def task_options(self) -> dict[str, Any]:
        return dict(self.spec.task_options)

    @property
    def eval_n(self) -> int:
        return self.spec.eval_n

    @property
    def probe_n(self) -> int | None:
        return self.spec.probe_n  # a probe's own entry (`probes: {similarity: {n: 16}}`) wins; None: its default

    def runs(self) -> dict[str, dict[str, Any]]:
        """role -> every run's fields as demo.json records them (a checkpoint run's: ``{checkpoint: DIR}``; the
        labels read them)."""
        if self.manifest_runs is None:
            return self.spec.methods()
        return {role: dict(over) for role, over in self.manifest_runs.items()}

    def methods(self) -> dict[str, dict[str, Any]]:
        """role -> fields of the runs this seed trains (the pool's training jobs): every run but the checkpoint runs."""
        return {role: over for role, over in self.runs().items() if CHECKPOINT not in over}

    def checkpoints(self) -> dict[str, Path]:
        """role -> the directory of each checkpoint run (evaluated and probed, never trained)."""
        return {role: Path(over[CHECKPOINT]) for role, over in self.runs().items() if CHECKPOINT in over}


def _log(msg: str) -> None:
    print(f"[run {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------------------- jobs
def train_runs(cfg: SeedRun, student: Path, run: Path, methods: dict[str, dict[str, Any]]) -> dict[str, Path]:
    """The training job(s) of one seed: every run named in ``methods`` (finished ones skipped, killed ones resumed)."""
    finals = {}
    for role, over in methods.items():
        finals[role] = train_resumable(
            role, run / "train" / role, lambda role=role: cfg.spec.train_config(role, cfg.seed, str(student)), over
        )
    return finals


def finish_seed(cfg: SeedRun, student: Path | None = None) -> Path:
    """The finish job of one seed (a study's or the demo's): evaluation, the listed probes, the budget sweep and the
    figures where ``cfg`` says so, report (its trainings found done: skipped)."""
    from mechopd.plots import draw_all
    from mechopd.report import write_report_md

    spec, run = cfg.spec, Path(cfg.out)
    student = Path(cfg.student) if student is None else student
    manifest = write_manifest(cfg)
    finals = {**train_runs(cfg, student, run, cfg.methods()), **cfg.checkpoints()}
    manifest["labels"] = labels_for(run, cfg.runs())  # the kept fractions are measured now
    write_json(run / MANIFEST_FILE, manifest)
    models = {"base": student, **{role: finals[role] for role in cfg.runs()}}  # the study's order
    evaluate_seed(cfg, models)
    teacher = {"teacher": Path(resolve_model(spec.teacher, spec))} if spec.teacher else {}
    skip = () if cfg.first_seed else tuple(spec.first_seed_only)  # no claim reads them: the first seed only
    chosen = None if cfg.all_probes else spec.probe_plan()
    run_probes(cfg, {**models, **teacher}, run, chosen=chosen, setup_fields=spec.render_fields(), skip=skip)
    if cfg.sweep is not None:
        sweep(cfg, student, run)
    if cfg.figures:
        _log(f"{run}: figures")
        draw_all(run)
    report = write_report_md(run)
    _log(f"{run}: report {report}")
    return report


def evaluate_seed(cfg: SeedRun, models: dict[str, Path]) -> None:
    """Every model of the seed run in both views (and under the other contexts), rendered as the study says."""
    from mechopd.core.views import RenderSpec

    spec = cfg.spec
    render = spec.render_fields()
    placement = render.pop("placement", None) or spec_task_placement(spec)
    evaluate_all(
        cfg,
        models,
        Path(cfg.out),
        spec=RenderSpec(placement, **render),
        other_contexts=spec.other_contexts,
        eval_fields=spec.eval_fields(),
    )


def spec_task_placement(spec: StudySpec) -> str:
    from mechopd.tasks.base import get_task

    return get_task(spec.task, **spec.task_options).placement


def write_manifest(cfg: SeedRun) -> dict[str, Any]:
    """A seed run's ``demo.json`` (what the study, report, claims and aggregate read) and ``study.yaml``, before any
    step: a full disk fails first. Its runs and config are the seed run's ``manifest_*`` where set (the demo's)."""
    from mechopd.evaluation.removability import RegimeThresholds

    run, spec, methods = Path(cfg.out), cfg.spec, cfg.runs()
    run.mkdir(parents=True, exist_ok=True)
    if cfg.manifest_config is not None:
        recorded: dict[str, Any] = {"config": dict(cfg.manifest_config)}
    else:
        recorded = {
            "config": study_config(cfg),
            "study": str(Path(cfg.study_out) / SPEC_FILE),
            "out_dir": cfg.study_out,
        }
    manifest = {
        "task": spec.task,
        "methods": list(methods),
        "labels": labels_for(run, methods),
        "runs": methods,
        "organism": cfg.student,
        "thresholds": asdict(RegimeThresholds()),
        **recorded,
        "command": "mechopd " + " ".join(sys.argv[1:]) if sys.argv and "mechopd" in sys.argv[0] else None,
    }
    write_json(run / MANIFEST_FILE, manifest)
    if not (run / STUDY_FILE).is_file():  # the roles of the runs (role = run name; a user may rename a run here)
        RunSet.from_manifest(run).write()  # a checkpoint run with its directory (demo.json's runs.ROLE.checkpoint)
    return manifest


def study_config(cfg: SeedRun) -> dict[str, Any]:
    """demo.json's ``config`` of a study's seed run: its schedule (the first trained run's), eval items, task, models."""
    spec = cfg.spec
    tc = spec.first_config(cfg.seed, cfg.student)
    return {
        "seed": cfg.seed,
        "out": cfg.out,
        "steps": tc.steps,
        "batch_size": tc.batch_size,
        "lr": tc.lr,
        "lr_schedule": tc.lr_schedule,
        "eval_n": spec.eval_n,
        "other_contexts": spec.other_contexts,
        "eval": spec.eval_fields(),  # the other EvalConfig fields (n_boot, ...): the report's eval line sets them
        "task_options": dict(spec.task_options),
        "job_threads": cfg.job_threads,
        "student": spec.student,
        "teacher": spec.teacher,
        "render": {k: spec.render[k] for k in ("no_context_system", "chat_template_kwargs") if k in spec.render},
    }


# ------------------------------------------------------------------------------------------------------- the study
def check_lora_runs(spec: StudySpec, student: str) -> None:
    """Every LoRA run's targets against the student's own modules, before any job (`arch.check_lora_targets`)."""
    for role in spec.trained:
        tc = spec.train_config(role, 0, student)
        if tc.uses_lora:
            check_lora_targets(student, tc.lora_targets, f"{spec.source}: runs.{role}.lora_targets")


def resolve_model(model: str, spec: StudySpec, pretrain: bool = False) -> str:
    """``organism:<task>`` -> its directory (pretrained now when ``pretrain``, on the organism's pinned threads);
    ``model:NAME`` -> its fetched directory (fetched on first use); a local dir -> absolute; anything else (a hub id)
    unchanged."""
    from mechopd.organisms.pretrain import pretrain_organism

    if is_named(model) and organism_task(model) is None:
        return resolve_spec(model)
    if organism_task(model) is not None:
        make = pretrain_organism if pretrain else None
        with job_threads(ORGANISM_THREADS):
            return str(Path(resolve_spec(model, spec.first_config(0).organism_dir, make=make)).resolve())
    return str(Path(model).resolve()) if Path(model).exists() else model


def seed_runs(spec: StudySpec, out: Path, student: str) -> list[SeedRun]:
    """One seed run per training seed: ``out`` itself with one seed, ``out/seed-k`` with several."""
    one, first = len(spec.seeds) == 1, spec.seeds[0]
    return [
        SeedRun(spec, str(out if one else out / f"seed-{k}"), k, student, study_out=str(out), first_seed=k == first)
        for k in spec.seeds
    ]


def _normal(doc: Any) -> Any:
    return json.loads(json.dumps(doc, sort_keys=True, default=str))


def check_out(spec: StudySpec, out: Path, inputs: Mapping[str, Any] | None = None) -> Stale:
    """``out`` holds nothing, or a run of this same study made from the same ``inputs`` (`preflight.study_inputs`:
    the student's, teacher's, data's content) whose trained runs record the study's configs, field by field; anything
    else is refused (nothing is changed). A study that differs only in its downstream keys (`reuse.DOWNSTREAM`:
    eval, probes) reuses every trained model: returns what reruns (`reuse.Stale`)."""
    check_out_place(out, "run")
    recorded = out / SPEC_FILE
    if not recorded.is_file():
        if (out / MANIFEST_FILE).is_file():
            raise ConfigError(
                f"--out {out} holds a demo or another run (its demo.json), not a study run; pass "
                "another --out (nothing was changed)"
            )
        check_foreign(out, SPEC_FILE, (INPUTS_FILE,))  # what the study did not write: never replaced nor reused
        return Stale()

    old = _normal(load_yaml(recorded))
    new = _normal(spec.to_mapping())
    stale = stale_after(out, old, new)
    if stale is None:
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise ConfigError(
            f"--out {out} holds a run of another study (keys that differ: {', '.join(diff)}); its "
            "finished stages would be reused as this one's: pass another --out"
        )
    check_inputs_recorded(out, SPEC_FILE, INPUTS_FILE)  # results of unknown inputs are never "done"
    changed = changed_inputs(read_json(out / INPUTS_FILE), inputs or {})
    if changed:
        raise ConfigError(
            f"--out {out} holds a run made from other inputs ({'; '.join(changed)}): its finished stages "
            "are another model's or data's results; pass another --out (nothing was changed)"
        )
    check_trained_configs(spec, {r.seed: Path(r.out) for r in seed_runs(spec, out, spec.student)})
    return stale


def is_done(spec: StudySpec, out: Path) -> bool:
    """Every stage finished: the done record written last, every run's final checkpoint, every report."""
    if not (out / DONE_FILE).is_file() or not (out / "report.md").is_file():
        return False
    if read_json(out / DONE_FILE).get("run") != _normal(spec.to_mapping()):  # e.g. a probe added since
        return False
    for r in seed_runs(spec, out, spec.student):
        if not (Path(r.out) / "report.md").is_file() or not all(
            finished(Path(r.out) / "train" / role) for role in spec.trained
        ):
            return False
        if not probes_whole(
            Path(r.out), set(spec.probes) - set([] if r.first_seed else spec.first_seed_only)
        ):  # a kill between a probe's two files: that probe runs again
            return False
    return True


def run_study(
    study: str | os.PathLike | Mapping[str, Any],
    out: str | os.PathLike | None = None,
    workers: int | None = PoolOptions.workers,
) -> Path:
    """Run a study (a file's path or its mapping) into ``out`` on ``workers`` processes; returns the report path
    (the aggregate's with two or more seeds). A finished study returns at once, saying so."""
    spec = StudySpec.load(study)
    if out is None and isinstance(study, Mapping):
        raise ConfigError("run_study(mapping): pass out=DIR (a study file's run defaults to its folder / its stem)")
    out = Path(out) if out is not None else default_out(study)  # type: ignore[arg-type]
    given, workers = workers is not None, default_workers(1) if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers {workers!r}: must be an integer >= 1 (omit it for one per thread)")
    why = workers_why(workers, 1, given)
    check_study_models(spec)  # every model the study names, before the first file or job
    inputs = study_inputs(spec)  # what its runs are made from, by content
    stale = check_out(spec, out, inputs)
    if is_done(spec, out):
        _log(f"{out}: done, nothing to run (report {out / 'report.md'})")
        return out / "report.md"
    with terminate_as_interrupt(), hold(out, "run"), as_run():  # SIGTERM as Ctrl-C: the workers stop, locks freed
        return _run(spec, out, workers, inputs, stale, why)


def _run(
    spec: StudySpec, out: Path, workers: int, inputs: Mapping[str, Any], stale: Stale | None = None, why: str = ""
) -> Path:

    t0 = time.time()
    student = resolve_model(spec.student, spec, pretrain=True)
    runs = seed_runs(spec, out, student)
    check_lora_runs(spec, student)
    est = check_budget(runs, student, out, workers, _log)  # the disk and memory it takes; refused before any file
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / INPUTS_FILE, dict(inputs))  # before the study record: a study record implies its inputs'
    if stale:
        _log(
            f"{out}: the study's evaluation or probe options changed: every trained model reused; rerunning "
            f"{stale.describe()}, then the figures and reports"
        )
        clear_stale([Path(r.out) for r in seed_runs(spec, out, spec.student)], stale)
    write_text(
        out / SPEC_FILE,
        f"# the study run here (from {spec.source}); `mechopd run` compares a rerun with it\n"
        + yaml.safe_dump(_normal(spec.to_mapping()), sort_keys=False, allow_unicode=True),
    )
    for r in runs:  # every seed run's manifest before the first job
        write_manifest(r)
    given = f"; {', '.join(spec.checkpoints())} from checkpoint(s), not trained" if spec.checkpoints() else ""
    _log(
        f"{len(runs)} seed run(s) x {len(spec.runs)} run(s) ({', '.join(spec.runs)}{given}) on {workers} worker(s)"
        f"{'; job logs in <seed run>/logs/' if workers > 1 else ''}{f' (workers: {why})' if why else ''}"
    )
    from mechopd.report.design import design_lines

    for line in design_lines(len(spec.seeds), spec.eval_n):  # before the first job: what it cannot decide (#54)
        _log(line)
    clock = StudyClock(_log, trainings=est.runs, finishes=len(runs), workers=workers)  # each job's end: an ETA
    run_seed_runs(runs, Path(student), workers, clock, train_runs, finish_seed)
    report = out / "report.md"
    if len(runs) > 1:
        from mechopd.report.aggregate import aggregate

        report = aggregate([Path(r.out) for r in runs], out)
    write_json(
        out / DONE_FILE,
        {
            "study": spec.source,
            "report": str(report),
            "wall_s": round(time.time() - t0, 1),
            "run": _normal(spec.to_mapping()),
        },
    )
    _log(f"report: {report} ({time.time() - t0:.0f} s)")
    return report
