"""`mechopd demo`: one command from a fresh install to the papers' figures and a report, on the embedded organism.

Stages (each stage's outputs are its checkpoint: a re-run skips what is finished, resumes a killed training run from
its last checkpoint):
  1. organism   pretrain (or reuse) the task's model organism                      runs/organisms/<task>[-fast]
  2. train      OPD (full tokens); NCA (β = 0.5; rules: anchor from step 30, games: gated on OPD's KL, `nca_gate`);
                TA-OPD (ρ = 0.10, the paper's top ⌈ρN⌉; rules: support K = 2); NCA + the follow term (rules: trained
                on the shifts, the other contexts held out): same seed, data, steps            RUN/train/<m>/
  3. eval       base + every method in both views and under the other contexts (paired, bootstrap, regime)
  4. probes     every registered probe with a demo entry (similarity, gradients, deltas, teachability, ...)
  5. figures    every figure from the saved artifacts                               RUN/figures/
  6. report     RUN/report.md: findings first, then the tables and the claims

With ``seeds = N > 1`` (the rules default, its built-in study's seeds) stages 2-6 run per seed k into ``RUN/seed-k/`` (one
organism) as jobs on worker processes, one pinned thread each (`mechopd.pipeline.pool`); `mechopd.report.aggregate` writes the
seed tables, bands and report into RUN. Seeds k >= 1 skip the per-seed figures and the study's ``first_seed_only``
probes (no claim reads them).

What runs is the task's built-in study, ``mechopd/data/studies/<task>.yaml`` (`study_spec.builtin_study`; `mechopd
run` runs a copy of it). The rules study was chosen by measurement so that its effects stand on every seed: the distilled
context is ``reverse`` (reverse twice is the identity: OPD's context-induced degradation stands at the end of training
on every seed), lr 2e-3 decaying linearly to 0, NCA's anchor from step 30 (from step 0 it erases the context; a KL
gate never opens on a seed where OPD plateaus), TA-OPD's K = 2 (K = 16 holds the whole 11-token answer vocabulary and
collapses). The paper's constant β from step 0 is not a default run: it collapses on this organism (both views at 0,
regime X); `mechopd train training/organisms/rules.yaml --method nca --set nca_start=0` trains it. What was tried and
measured: docs/results.md, "Choosing the default study"; the schedule's reasons: `mechopd.organisms.recipes`.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from mechopd.core.artifacts import read_json, write_json
from mechopd.core.errors import ConfigError
from mechopd.organisms.recipes import ORGANISM_RECIPES
from mechopd.pipeline.stages import evaluate_all, labels_for, method_label, run_probes, train_resumable
from mechopd.study import MANIFEST_FILE, STUDY_FILE, Study

__all__ = [
    "DemoConfig",
    "demo",
    "demo_one",
    "evaluate_all",
    "labels_for",
    "method_label",
    "run_probes",
    "train_resumable",
]

NCA_GATE = ORGANISM_RECIPES["sokoban"]["nca_gate"]  # nats per token: a game's anchor waits for OPD (the recipe's)
NCA_GATE_WINDOW = 5  # steps averaged by the gate (TrainConfig's default)
GRAD_STATS_EVERY = 10
# The policy (schedule, runs, seeds, which probes run on the first seed only) is the task's built-in study,
# mechopd/data/studies/<task>.yaml (`study_spec.builtin_study`); DemoConfig's None fields take its values.


def task_defaults(task: str) -> dict[str, Any]:
    """DemoConfig's defaults read from the task's built-in study: its schedule, eval and probe items, task options,
    NCA's anchor start, TA-OPD's K and the follow term's contexts (each only where the study sets it)."""
    from mechopd.pipeline.spec import builtin_study

    spec = builtin_study(task)
    out = {k: spec.train[k] for k in ("steps", "batch_size", "lr", "lr_schedule", "eval_every")}
    out.update(eval_n=spec.eval_n, probe_n=spec.probe_n)
    if spec.task_options:
        out["task_options"] = dict(spec.task_options)
    for field_name, key in (("nca_start", "nca_start"), ("ta_opd_k", "k"), ("follow_contexts", "follow_contexts")):
        given = [run[key] for run in spec.runs.values() if key in run]
        if given:
            out[field_name] = given[0]
    return out


def default_seeds(task: str) -> int:
    """The built-in study's number of training seeds (its seeds are 0..N-1)."""
    from mechopd.pipeline.spec import builtin_study

    return len(builtin_study(task).seeds)


def first_seed_only(task: str) -> tuple[str, ...]:
    """Probes that run on seed 0 only in a several-seed demo (the built-in study's ``first_seed_only``)."""
    from mechopd.pipeline.spec import builtin_study

    return tuple(builtin_study(task).first_seed_only)


@dataclass
class DemoConfig:
    """The demo's knobs; `fast` shrinks everything for the test suite (a smaller organism, a few steps)."""

    task: str = "rules"
    out: str = "runs/demo"
    fast: bool = False
    sweep: bool = False
    full_stages: bool = True  # False: a seed k >= 1 of a study (no figures, no first_seed_only probes)
    seed: int = 0
    seeds: int | None = None  # None: the built-in study's seeds (with --fast: 1)
    workers: int | None = None  # worker processes (None: torch.get_num_threads(); pipeline/pool.py)
    job_threads: int = 1  # intra-op threads per job (demo_pool.JOB_THREADS; part of the numbers' identity)
    organism_seed: int = 0
    layers: int | None = None  # decoder layers of the organism (None: 3; e.g. 8 for the "which layers" claims)
    steps: int | None = None  # None: the task's built-in study's (as for the five below, `task_defaults`)
    batch_size: int | None = None
    lr: float | None = None
    lr_schedule: str | None = None
    eval_every: int | None = None
    eval_n: int | None = None
    probe_n: int | None = None
    nca_gate: float = NCA_GATE
    nca_gate_window: int = NCA_GATE_WINDOW
    nca_start: int | None = None  # NCA's anchor from this step (None: the KL gate above); rules: 30
    ta_opd_k: int | None = None  # TA-OPD's support K (None: the paper's 16); rules: 2
    follow_contexts: list[str] | None = None  # the follow term's contexts (None: every other one); the rest held out
    grad_stats_every: int = GRAD_STATS_EVERY
    organism_dir: str = "runs/organisms"
    task_options: dict[str, Any] | None = None  # None: the built-in study's (the distilled context)
    train_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from mechopd.organisms.pretrain import ORGANISM_TASKS

        if self.task not in ORGANISM_TASKS:
            raise ConfigError(f"demo --task {self.task!r}: choose one of {', '.join(ORGANISM_TASKS)}")
        if self.seeds is None:  # a chosen training seed means one seed run
            self.seeds = 1 if (self.fast or self.seed != 0) else default_seeds(self.task)
        if isinstance(self.seeds, int) and self.seeds > 1 and self.seed != 0:
            raise ConfigError(
                f"demo --seed {self.seed} with --seeds {self.seeds}: --seeds N runs seeds 0..N-1; drop "
                "--seed, or pass --seeds 1 for that one seed"
            )
        if self.workers is None:
            from mechopd.pipeline.pool import default_workers

            self.workers = default_workers(self.job_threads if isinstance(self.job_threads, int) else 1)
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"demo --workers {self.workers!r}: must be an integer >= 1 (omit it for one per thread)")
        if isinstance(self.job_threads, bool) or not isinstance(self.job_threads, int) or self.job_threads < 1:
            raise ConfigError(f"demo --job-threads {self.job_threads!r}: must be an integer >= 1 (default 1)")
        if isinstance(self.seeds, bool) or not isinstance(self.seeds, int) or self.seeds < 1:
            raise ConfigError(f"demo --seeds {self.seeds!r}: must be an integer >= 1 (training seeds 0..N-1)")
        if self.layers is not None and (
            self.fast or isinstance(self.layers, bool) or not isinstance(self.layers, int) or not 1 <= self.layers <= 48
        ):
            raise ConfigError(
                f"demo --layers {self.layers!r}: pass an integer in 1..48, without --fast (whose "
                "organism has its own 2 layers)"
            )
        for key in ("steps", "batch_size"):  # honoured as given, --fast or not
            if getattr(self, key) is not None and (
                isinstance(getattr(self, key), bool)
                or not isinstance(getattr(self, key), int)
                or getattr(self, key) < 1
            ):
                raise ConfigError(
                    f"demo --{key.replace('_', '-')} {getattr(self, key)!r}: pass an integer >= 1 (omit "
                    "it for the recipe's)"
                )
        given = {k: getattr(self, k) for k in ("steps", "batch_size") if getattr(self, k) is not None}
        for key, value in task_defaults(self.task).items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        if self.fast:
            self.steps, self.eval_every, self.eval_n, self.probe_n, self.batch_size = 6, 3, 24, 8, 8
            self.__dict__.update(given)
            # a tiny organism does not reach the teacher in 6 steps: a gate any KL passes, open from step 2
            self.nca_gate, self.nca_gate_window, self.grad_stats_every = 1e6, 2, 3
            self.nca_start = None if self.nca_start is None else 2

    def methods(self) -> dict[str, dict[str, Any]]:
        """The built-in study's runs with this config's anchor schedule, K, follow contexts and gradient-statistics
        period filled in (a fixed ``nca_start`` replaces the KL gate)."""
        from mechopd.pipeline.spec import builtin_study

        return {name: self._run_fields(dict(run)) for name, run in builtin_study(self.task).runs.items()}

    def _run_fields(self, over: dict[str, Any]) -> dict[str, Any]:
        if "nca_start" in over or "nca_gate" in over:  # an anchored run: a fixed start, or the KL gate
            if self.nca_start is not None:
                over = {k: v for k, v in over.items() if not k.startswith("nca_gate")}
                over["nca_start"] = self.nca_start
            else:
                over = {k: v for k, v in over.items() if k != "nca_start"}
                over.update(nca_gate=self.nca_gate, nca_gate_window=self.nca_gate_window)
        if over.get("selector") == "ta_opd" and self.ta_opd_k is not None:
            over["k"] = self.ta_opd_k
        if "follow_contexts" in over and self.follow_contexts:
            over["follow_contexts"] = list(self.follow_contexts)
        if "grad_stats_every" in over:
            over["grad_stats_every"] = self.grad_stats_every
        over.pop("save_every", None)  # the demo's: half the steps, a tenth for TA-OPD (`train_methods`)
        return over


def _log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def organism(cfg: DemoConfig) -> Path:
    from mechopd.organisms.pretrain import FAST_ORGANISM, OrganismConfig, default_config, organism_dir_name, pretrain

    if cfg.fast:
        oc = OrganismConfig(task=cfg.task, seed=cfg.organism_seed, **FAST_ORGANISM)
        out = Path(cfg.organism_dir) / f"{cfg.task}-fast"
    else:
        oc = default_config(cfg.task, seed=cfg.organism_seed, layers=cfg.layers)
        out = Path(cfg.organism_dir) / organism_dir_name(cfg.task, cfg.layers)
    _log(f"organism: {out} ({'reused' if (out / 'organism.json').exists() else 'pretraining'})")
    return pretrain(oc, out)


def demo_study(cfg: DemoConfig, student: Path | str, methods: dict[str, dict[str, Any]]) -> Any:
    """The built-in study (`builtin_study`) with this config's schedule, task options, seed and ``methods`` as its
    runs: one `StudySpec.train_config` builds every training config, for `mechopd run` and the demo alike. A run
    saves at half its steps (TA-OPD: every tenth, the checkpoints teachability chooses from)."""
    from mechopd.pipeline.spec import builtin_study

    spec = builtin_study(cfg.task)
    train = {**spec.train, **{k: getattr(cfg, k) for k in ("steps", "batch_size", "lr", "lr_schedule", "eval_every")}}
    runs = {
        _role(name): {**over, "save_every": max(1, cfg.steps // (10 if name == "ta_opd" else 2)), **cfg.train_overrides}
        for name, over in methods.items()
    }
    return replace(
        spec,
        student=str(student),
        task_options=dict(cfg.task_options or {}),
        train={**train, "eval_n": cfg.eval_n},
        runs=runs,
        seeds=[cfg.seed],
    )


def train_methods(cfg: DemoConfig, student: Path, run: Path, methods: dict[str, dict[str, Any]]) -> dict[str, Path]:
    """Train (or resume, or skip) every run of ``methods`` for ``cfg.seed``, on `demo_study`'s configs."""
    spec = demo_study(cfg, student, methods)
    return {
        name: train_resumable(
            name, run / "train" / name, lambda name=name: spec.train_config(_role(name), cfg.seed), over
        )
        for name, over in methods.items()
    }


def _role(name: str) -> str:
    """A run name as a study role (an identifier): the sweep's ``ta_opd-0.1`` -> ``ta_opd_0_1``."""
    return re.sub(r"\W", "_", name)


def demo(cfg: DemoConfig) -> Path:
    """Run every stage (once per seed with ``cfg.seeds > 1``, then aggregate); returns the report path."""
    from mechopd.core.runcheck import check_demo_out
    from mechopd.pipeline.pool import hold_demo_out

    check_demo_out(asdict(cfg))  # a demo of another seed / config there, or --out inside a run: refused
    if demo_done(cfg):
        _log(f"{cfg.out}: done, nothing to run (report {Path(cfg.out) / 'report.md'})")
        return Path(cfg.out) / "report.md"
    with hold_demo_out(cfg.out):  # its lock, and SIGTERM handled as Ctrl-C (the workers stop, the lock released)
        return _demo(cfg)


def _demo(cfg: DemoConfig) -> Path:
    """Organism (ORGANISM_THREADS), the seed runs' jobs on `cfg.workers` processes (`demo_pool`), the aggregate."""
    from mechopd.pipeline.pool import ORGANISM_THREADS, job_threads, run_seed_runs, seed_configs

    t0 = time.time()
    with job_threads(ORGANISM_THREADS):  # pinned, as every job's: the numbers do not depend on OMP_NUM_THREADS
        student = organism(cfg)
    t_organism = time.time() - t0
    runs = seed_configs(cfg)
    for r in runs:  # every seed run's manifest before the first job: what it will save is checked first
        write_manifest(r, Path(student))
    _log(
        f"{len(runs)} seed run{'s' if len(runs) > 1 else ''} on {cfg.workers} worker"
        f"{'s' if cfg.workers > 1 else ''} ({cfg.job_threads} intra-op thread{'s' if cfg.job_threads > 1 else ''} "
        f"per job{'; job logs in <run>/logs/' if cfg.workers > 1 else ''})"
    )
    run_seed_runs(runs, student, cfg.workers, _log, train_methods, demo_one)
    if cfg.seeds > 1:
        from mechopd.report.aggregate import aggregate

        aggregate([Path(r.out) for r in runs], cfg.out, report=False)
    report = record_wall_time(cfg, time.time() - t0, t_organism)
    _log(f"report: {report} ({time.time() - t0:.0f} s in all, organism {t_organism:.0f} s)")
    return report


def demo_done(cfg: DemoConfig) -> bool:
    """Every stage of this demo finished (its config checked by `runcheck.check_demo_out`): the wall time recorded
    last into OUT/demo.json, OUT's report, and per seed run its report, every training and every evaluation."""
    from mechopd.pipeline.pool import finished, seed_configs

    out = Path(cfg.out)
    if not all((out / f).is_file() for f in ("report.md", MANIFEST_FILE)) or "wall_s" not in read_json(
        out / MANIFEST_FILE
    ):
        return False
    for r in seed_configs(cfg):
        run, methods = Path(r.out), r.methods()
        if not (run / "report.md").is_file() or not all(finished(run / "train" / m) for m in methods):
            return False
        if not all((run / "eval" / f"{m}.json").is_file() for m in ("base", *methods)):
            return False
        if cfg.sweep and not _sweep_done(run):
            return False
    return True


def _sweep_done(run: Path) -> bool:
    from mechopd.pipeline.sweep import SWEEP_BUDGETS, SWEEP_SELECTORS

    target = run / "sweep" / "sweep.json"
    return target.is_file() and len(read_json(target).get("rows", [])) == len(SWEEP_SELECTORS) * len(SWEEP_BUDGETS)


def demo_one(cfg: DemoConfig, student: Path | None = None) -> Path:
    """Every stage for one training seed (trainings already finished are skipped); returns the report path."""
    from mechopd.plots import draw_all
    from mechopd.report import write_report_md

    t0 = time.time()
    run = Path(cfg.out)
    run.mkdir(parents=True, exist_ok=True)
    methods = cfg.methods()
    student = organism(cfg) if student is None else student
    manifest = write_manifest(cfg, Path(student))
    finals = train_methods(cfg, student, run, methods)
    manifest["labels"] = labels_for(run, methods)  # the kept fractions are measured now
    write_json(run / "demo.json", manifest)
    models = {"base": student, **finals}
    evaluate_all(cfg, models, run)
    run_probes(cfg, models, run, skip=() if cfg.full_stages else first_seed_only(cfg.task))
    if cfg.sweep:
        from mechopd.pipeline.sweep import sweep

        sweep(cfg, student, run, train_methods)
    if cfg.full_stages:
        _log("figures")
        draw_all(run)
    write_json(run / "demo.json", manifest)
    report = write_report_md(run)
    _log(f"report: {report} (this stage {time.time() - t0:.0f} s)")
    return report


def write_manifest(cfg: DemoConfig, student: Path) -> dict[str, Any]:
    """A seed run's demo.json (and study.yaml unless a user wrote one), before any step: a full disk fails first."""
    from mechopd.evaluation.removability import RegimeThresholds

    run, methods = Path(cfg.out), cfg.methods()
    run.mkdir(parents=True, exist_ok=True)
    manifest = {
        "task": cfg.task,
        "methods": list(methods),
        "labels": labels_for(run, methods),
        "runs": methods,
        "organism": str(Path(student).resolve()),
        "thresholds": asdict(RegimeThresholds()),
        "config": asdict(cfg),
        "command": "mechopd " + " ".join(sys.argv[1:]) if sys.argv and "mechopd" in sys.argv[0] else None,
    }
    write_json(run / MANIFEST_FILE, manifest)
    if not (run / STUDY_FILE).is_file():  # the roles of the runs (a user may rename a run here)
        Study.from_manifest(run).write()
    return manifest


def record_wall_time(cfg: DemoConfig, wall_s: float, organism_s: float) -> Path:
    """The whole invocation's wall time (organism included) into OUT/demo.json, and OUT's report rewritten."""
    from mechopd.report import write_aggregate_report, write_report_md

    out = Path(cfg.out)
    manifest = read_json(out / "demo.json")
    manifest.update(wall_s=round(wall_s, 1), organism_s=round(organism_s, 1), workers=cfg.workers)
    write_json(out / "demo.json", manifest)
    return write_aggregate_report(out) if cfg.seeds > 1 else write_report_md(out)
