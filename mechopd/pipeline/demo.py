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

What runs is the task's built-in study, ``mechopd/data/studies/<task>.yaml`` (`spec.builtin_study`; `mechopd run` runs
a copy of it), through the study runner's jobs (`mechopd.pipeline.run`): per seed, `run.train_runs` then
`run.finish_seed` on the demo's `SeedRun` (`seed_run`: `demo_study`'s spec with this config's schedule, and as data
what the demo does beyond a study: every registered probe with a demo entry, figures on seed 0 only, the ``--sweep``
budget curve, demo.json's runs and config). With ``seeds = N > 1`` (the rules default, its built-in study's
seeds) stages 2-6 run per seed k into ``RUN/seed-k/`` (one organism) as jobs on worker processes, one pinned thread
each (`mechopd.pipeline.pool`); `mechopd.report.aggregate` writes the seed tables, bands and report into RUN. Seeds
k >= 1 skip the per-seed figures and the study's ``first_seed_only`` probes (no claim reads them). ``--fast`` shrinks
the study by the values of ``mechopd/data/demo_fast.yaml`` (`fast_values`).

The rules study was chosen by measurement so that its effects stand on every seed: the distilled
context is ``reverse`` (OPD's context-induced degradation stands at the end of training on every seed measured), lr 2e-3 decaying linearly to 0, NCA's anchor from step 30 (from step 0 it erases the context; a KL
gate never opens on a seed where OPD plateaus), TA-OPD's K = 2 (K = 16 holds the whole 11-token answer vocabulary and
collapses). The paper's constant β from step 0 is not a default run: it collapses on this organism (both views at 0,
regime X); `mechopd train training/organisms/rules.yaml --method nca --set nca_start=0` trains it. What was tried and
measured: docs/results.md, "Choosing the default study"; the schedule's reasons: `mechopd.organisms.recipes`.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from mechopd.config import TrainConfig
from mechopd.core.artifacts import read_json, write_json
from mechopd.core.config_parse import load_yaml
from mechopd.core.errors import ConfigError
from mechopd.core.options import (
    GE0,
    GE1,
    GT0,
    SEED_RANGE,
    Range,
    check_fields,
    check_value,
    field_facts,
    option,
    option_of,
)
from mechopd.core.runcheck import check_demo_out
from mechopd.organisms.pretrain import (
    FAST_ORGANISM,
    ORGANISM_TASKS,
    OrganismConfig,
    default_config,
    organism_dir_name,
    pretrain,
)
from mechopd.organisms.recipes import ORGANISM_RECIPES
from mechopd.pipeline.pool import (
    ORGANISM_THREADS,
    PoolOptions,
    default_workers,
    finished,
    hold_demo_out,
    job_threads,
    run_seed_runs,
    seed_configs,
    workers_why,
)
from mechopd.pipeline.run import SeedRun, finish_seed, train_runs, write_manifest
from mechopd.pipeline.spec import StudySpec, builtin_study
from mechopd.pipeline.stages import probes_whole
from mechopd.pipeline.sweep import SWEEP_BUDGETS, SWEEP_SELECTORS
from mechopd.runset import MANIFEST_FILE

__all__ = ["DemoConfig", "demo", "demo_study", "fast_values", "seed_run"]

NCA_GATE = ORGANISM_RECIPES["sokoban"]["nca_gate"]  # nats per token: a game's anchor waits for OPD (the recipe's)
NCA_GATE_WINDOW = TrainConfig.nca_gate_window  # steps averaged by the gate
GRAD_STATS_EVERY = 10
FAST_FILE = Path(__file__).parent.parent / "data" / "demo_fast.yaml"  # what `--fast` sets over the built-in study
# The policy (schedule, runs, seeds, which probes run on the first seed only) is the task's built-in study,
# mechopd/data/studies/<task>.yaml (`spec.builtin_study`); DemoConfig's None fields take its values.


def task_defaults(task: str) -> dict[str, Any]:
    """DemoConfig's defaults read from the task's built-in study: its schedule, eval and probe items, task options,
    NCA's anchor start, TA-OPD's K and the follow term's contexts (each only where the study sets it)."""
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
    return len(builtin_study(task).seeds)


@functools.cache
def fast_values() -> dict[str, Any]:
    """``--fast``'s values over the built-in study (``mechopd/data/demo_fast.yaml``), each a `DemoConfig` field."""
    doc = load_yaml(FAST_FILE)
    known = {f.name: f for f in field_facts(DemoConfig) if f.name not in ("task", "out", "fast")}
    for key, value in doc.items():
        if key not in known:
            raise ConfigError(f"{FAST_FILE}: {key!r} is no DemoConfig field; use {', '.join(known)}")
        check_value(known[key], value, subject=f"{FAST_FILE}: {key}={value!r}")  # the field's declared range
    return dict(doc)


@dataclass
class DemoConfig:
    """The demo's knobs; `fast` shrinks everything for the test suite (a smaller organism, `fast_values`). Every field
    is an `option` (help, range, choices declared once): `mechopd demo`'s flags (`DEMO_FLAGS`), docs/config.md's demo
    table and the checks in ``__post_init__`` read them. A None field takes the task's built-in study's value."""

    task: str = option(
        TrainConfig.task, help="the organism task whose built-in study runs", choices=ORGANISM_TASKS, metavar="TASK"
    )
    out: str = option("runs/demo", help="demo directory", metavar="DIR")
    fast: bool = option(
        False, help="tiny organism and a few steps (for tests; <= 2 min); with --study: one seed, a few steps"
    )
    sweep: bool = option(False, help="also the TA-OPD budget sweep (figure 8)")
    full_stages: bool = option(True, help="false: a seed k >= 1 of a study (no figures, no first_seed_only probes)")
    seed: int = option(
        TrainConfig.seed,
        help="one training seed (a one-seed demo; the organism uses organism_seed)",
        range=SEED_RANGE,
        metavar="INT",
    )
    seeds: int | None = option(
        None,
        help="N training seeds 0..N-1 into OUT/seed-k, then aggregated (95% intervals made for few seeds: "
        "Student-t over the seeds' values, each seed's item noise as a floor, docs/method.md §8; "
        "default: the built-in study's seeds, 1 for --fast or a chosen --seed)",
        range=GE1,
        metavar="N",
    )
    workers: int | None = option_of(PoolOptions, "workers")
    job_threads: int = option_of(PoolOptions, "job_threads")
    organism_seed: int = option(0, help="seed of the organism's pretraining", range=SEED_RANGE)
    layers: int | None = option(
        None,
        help="decoder layers of the organism (default: the organism's; e.g. 8 for the shallow-vs-deep claim; "
        "pretrained once into runs/organisms/<task>-L<n>)",
        range=Range(1, 48),
        metavar="INT",
    )
    steps: int | None = option(
        None, help="training steps per method (default: the task's built-in study's)", range=GE1, metavar="INT"
    )
    batch_size: int | None = option(
        None, help="prompts (games) per step (default: the task's built-in study's)", range=GE1, metavar="INT"
    )
    lr: float | None = option(None, help="learning rate (default: the built-in study's)", range=GT0)
    lr_schedule: str | None = option(None, help="learning-rate schedule (default: the built-in study's)")
    eval_every: int | None = option(None, help="steps between evaluations (default: the built-in study's)", range=GE0)
    eval_n: int | None = option(None, help="held-out evaluation items (default: the built-in study's)", range=GE1)
    probe_n: int | None = option(None, help="probe items (default: the built-in study's)", range=GE1)
    nca_gate: float = option(NCA_GATE, help="NCA's anchor gate, nats per token (the sokoban recipe's)", range=GE0)
    nca_gate_window: int = option(NCA_GATE_WINDOW, help="steps averaged by the anchor gate", range=GE1)
    nca_start: int | None = option(
        None, help="NCA's anchor from this step (default: the built-in study's; none: the KL gate)", range=GE0
    )
    ta_opd_k: int | None = option(
        None, help="TA-OPD's support K (default: the built-in study's, else the selector's)", range=GE1
    )
    follow_contexts: list[str] | None = option(
        TrainConfig.follow_contexts, help="the follow term's contexts (none: every other one); the rest held out"
    )
    grad_stats_every: int = option(GRAD_STATS_EVERY, help="steps between gradient statistics", range=GE1)
    organism_dir: str = option(TrainConfig.organism_dir, help="where the organisms are cached")
    task_options: dict[str, Any] | None = option(
        None, help="the task's options (default: the built-in study's, its distilled context)"
    )
    train_overrides: dict[str, Any] = option(default_factory=dict, help="training keys set on every run")

    def __post_init__(self) -> None:
        check_fields(self)  # every range and choice, one line naming the field (the CLI names the flag first)
        if self.layers is not None and self.fast:
            raise ConfigError(
                f"demo --layers {self.layers!r}: drop it with --fast (whose organism has its own 2 layers)"
            )
        if self.seeds is None:  # a chosen training seed means one seed run
            self.seeds = 1 if (self.fast or self.seed != 0) else default_seeds(self.task)
        if self.seeds > 1 and self.seed != 0:
            raise ConfigError(
                f"demo --seed {self.seed} with --seeds {self.seeds}: --seeds N runs seeds 0..N-1; drop "
                "--seed, or pass --seeds 1 for that one seed"
            )

        passed = self.workers is not None
        if self.workers is None:
            self.workers = default_workers(self.job_threads)
        self.workers_why = workers_why(self.workers, self.job_threads, passed)
        given = {f.name for f in fields(self) if f.default is None and getattr(self, f.name) is not None}
        for key, value in task_defaults(self.task).items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        if self.fast:  # over the study's values, not the caller's; a gated anchor (nca_start None) stays gated
            for key, value in fast_values().items():
                if key not in given and not (key == "nca_start" and self.nca_start is None):
                    setattr(self, key, value)

    def count(self, key: str) -> int:
        """A count `__post_init__` resolved (``steps``, ``seeds``, ``workers``): an integer from there on."""
        value = getattr(self, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"DemoConfig.{key}={value!r}: must be an integer (set by DemoConfig(...) itself)")
        return value

    def methods(self) -> dict[str, dict[str, Any]]:
        """The built-in study's runs with this config's anchor schedule, K, follow contexts and gradient-statistics
        period filled in (a fixed ``nca_start`` replaces the KL gate)."""
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
        over.pop("save_every", None)  # the demo's: half the steps, a tenth for TA-OPD (`demo_study`)
        return over


def _log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def organism(cfg: DemoConfig) -> Path:

    if cfg.fast:
        oc = OrganismConfig(task=cfg.task, seed=cfg.organism_seed, **FAST_ORGANISM)
        out = Path(cfg.organism_dir) / f"{cfg.task}-fast"
    else:
        oc = default_config(cfg.task, seed=cfg.organism_seed, layers=cfg.layers)
        out = Path(cfg.organism_dir) / organism_dir_name(cfg.task, cfg.layers)
    _log(f"organism: {out} ({'reused' if (out / 'organism.json').exists() else 'pretraining'})")
    return pretrain(oc, out)


def demo_study(cfg: DemoConfig, student: Path | str) -> StudySpec:
    """The built-in study (`builtin_study`) with this config's schedule, task options, eval and probe items, seed and
    `DemoConfig.methods` as its runs: what the seed run's jobs train and finish (`seed_run`), for `mechopd run` and
    the demo alike through `StudySpec.train_config`. A run saves at half its steps (TA-OPD: every tenth, the
    checkpoints teachability chooses from)."""
    spec, steps = builtin_study(cfg.task), cfg.count("steps")
    train = {**spec.train, **{k: getattr(cfg, k) for k in ("steps", "batch_size", "lr", "lr_schedule", "eval_every")}}
    runs = {
        name: {**over, "save_every": max(1, steps // (10 if name == "ta_opd" else 2)), **cfg.train_overrides}
        for name, over in cfg.methods().items()
    }
    return replace(
        spec,
        student=str(student),
        task_options=dict(cfg.task_options or {}),
        train={**train, "eval_n": cfg.eval_n},
        runs=runs,
        seeds=[cfg.seed],
        eval={**spec.eval, "n": cfg.eval_n},
        probe_n=cfg.probe_n,
    )


def seed_run(cfg: DemoConfig, student: Path | str) -> SeedRun:
    """One seed run of the demo (``cfg`` with one seed) as the study runner's `SeedRun`: `demo_study`'s spec, and
    what the demo does beyond a study as data: every registered probe with a demo entry (a plug-in's joins, one whose
    roles the study lacks says skipped), figures and the first_seed_only probes where ``cfg.full_stages``, the budget
    sweep with ``cfg.sweep``, demo.json's runs (`DemoConfig.methods`) and config (``cfg`` itself)."""
    return SeedRun(
        demo_study(cfg, student),
        out=cfg.out,
        seed=cfg.seed,
        student=str(Path(student).resolve()),
        job_threads=cfg.job_threads,
        all_probes=True,
        first_seed=cfg.full_stages,
        figures=cfg.full_stages,
        sweep=dict(cfg.train_overrides) if cfg.sweep else None,
        manifest_runs=cfg.methods(),
        manifest_config=asdict(cfg),
    )


def demo(cfg: DemoConfig) -> Path:
    """Run every stage (once per seed with ``cfg.seeds > 1``, then aggregate); returns the report path."""
    if cfg.fast:
        from mechopd.report import SMOKE_NOTE

        _log(SMOKE_NOTE)  # first: a newcomer must not read the collapsed models as broken
    check_demo_out(asdict(cfg))  # a demo of another seed / config there, or --out inside a run: refused
    if demo_done(cfg):
        _log(f"{cfg.out}: done, nothing to run (report {Path(cfg.out) / 'report.md'})")
        return Path(cfg.out) / "report.md"
    with hold_demo_out(cfg.out):  # its lock, and SIGTERM handled as Ctrl-C (the workers stop, the lock released)
        return _demo(cfg)


def _warn_design(cfg: DemoConfig) -> None:
    """Before the first job: which core claim rows seeds × items cannot decide (`report.design`, #54)."""
    from mechopd.report.design import design_lines

    items = cfg.eval_n if cfg.eval_n is not None else task_defaults(cfg.task).get("eval_n")
    for line in design_lines(cfg.count("seeds"), int(items)) if items else []:
        _log(line)


def _demo(cfg: DemoConfig) -> Path:
    """Organism (ORGANISM_THREADS), the seed runs' jobs on `cfg.workers` processes (`pipeline.pool`), the aggregate."""
    t0, workers, threads = time.time(), cfg.count("workers"), cfg.job_threads
    with job_threads(ORGANISM_THREADS):  # pinned, as every job's: the numbers do not depend on OMP_NUM_THREADS
        student = organism(cfg)
    t_organism = time.time() - t0
    runs = [seed_run(r, student) for r in seed_configs(cfg)]
    for r in runs:  # every seed run's manifest before the first job: what it will save is checked first
        write_manifest(r)
    logs = "; job logs in <run>/logs/" if workers > 1 else ""
    _log(
        f"{len(runs)} seed run{'s' if len(runs) > 1 else ''} on {workers} worker{'s' if workers > 1 else ''} "
        f"({threads} intra-op thread{'s' if threads > 1 else ''} per job{logs}; workers: {cfg.workers_why})"
    )
    _warn_design(cfg)
    run_seed_runs(runs, student, workers, _log, train_runs, finish_seed)
    if cfg.count("seeds") > 1:
        from mechopd.report.aggregate import aggregate

        aggregate([Path(r.out) for r in runs], cfg.out, report=False)
    report = record_wall_time(cfg, time.time() - t0, t_organism)
    _log(f"report: {report} ({time.time() - t0:.0f} s in all, organism {t_organism:.0f} s)")
    return report


def demo_done(cfg: DemoConfig) -> bool:
    """Every stage of this demo finished (its config checked by `runcheck.check_demo_out`): the wall time recorded
    last into OUT/demo.json, OUT's report, and per seed run its report, every training and every evaluation."""
    out = Path(cfg.out)
    if not all((out / f).is_file() for f in ("report.md", MANIFEST_FILE)) or "wall_s" not in read_json(
        out / MANIFEST_FILE
    ):
        return False
    for r in seed_configs(cfg):
        run, methods = Path(r.out), r.methods()
        if not (run / "report.md").is_file() or not all(finished(run / "train" / m) for m in methods):
            return False
        if not probes_whole(run):  # a kill between a probe's two files: that probe runs again
            return False
        if not all((run / "eval" / f"{m}.json").is_file() for m in ("base", *methods)):
            return False
        if cfg.sweep and not _sweep_done(run):
            return False
    return True


def _sweep_done(run: Path) -> bool:

    target = run / "sweep" / "sweep.json"
    return target.is_file() and len(read_json(target).get("rows", [])) == len(SWEEP_SELECTORS) * len(SWEEP_BUDGETS)


def record_wall_time(cfg: DemoConfig, wall_s: float, organism_s: float) -> Path:
    """The whole invocation's wall time (organism included) into OUT/demo.json, and OUT's report rewritten."""
    from mechopd.report import write_aggregate_report, write_report_md

    out = Path(cfg.out)
    manifest = read_json(out / "demo.json")
    manifest.update(wall_s=round(wall_s, 1), organism_s=round(organism_s, 1), workers=cfg.workers)
    write_json(out / "demo.json", manifest)
    return write_aggregate_report(out) if cfg.count("seeds") > 1 else write_report_md(out)
