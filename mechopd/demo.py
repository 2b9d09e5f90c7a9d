"""`mechopd demo`: one command from a fresh install to the papers' figures and a report, on the embedded organism.

Stages (each stage's outputs are its checkpoint: a re-run skips what is finished, resumes a killed training run from
its last checkpoint):
  1. organism   pretrain (or reuse) the task's model organism                      runs/organisms/<task>[-fast]
  2. train      OPD (full tokens), NCA (β = 0.5), TA-OPD (ρ = 0.10): same seed, data, steps      RUN/train/<m>/
  3. eval       base + every method in both views (paired, bootstrap, regime)      RUN/eval/<m>.json
  4. probes     similarity (base/OPD/NCA), gradient alignment (OPD vs NCA at the OPD checkpoint), parameter deltas
                (OPD, NCA vs base), teachability (base → TA-OPD, fixed bank)         RUN/probes/
  5. figures    every figure from the saved artifacts                               RUN/figures/
  6. report     RUN/report.md
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mechopd.errors import ConfigError

METHODS: dict[str, dict[str, Any]] = {
    "opd": {"method": "opd", "selector": "full"},
    "nca": {"method": "nca", "selector": "full", "beta": 0.5},
    "ta_opd": {"method": "opd", "selector": "ta_opd", "budget": 0.10},
}
LABELS = {"base": "base", "opd": "OPD", "nca": "NCA (β=0.5)", "ta_opd": "TA-OPD (ρ=0.10)"}
SWEEP_SELECTORS = ("ta_opd", "random", "entropy", "divergence")
SWEEP_BUDGETS = (0.05, 0.10, 0.30, 0.50)


@dataclass
class DemoConfig:
    """The demo's knobs; `fast` shrinks everything for the test suite (a smaller organism, a few steps)."""

    task: str = "rules"
    out: str = "runs/demo"
    fast: bool = False
    sweep: bool = False
    seed: int = 0
    steps: int = 150
    batch_size: int = 32
    lr: float = 1e-3
    eval_every: int = 25
    eval_n: int = 200
    probe_n: int = 64
    organism_dir: str = "runs/organisms"
    train_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from mechopd.organisms.pretrain import ORGANISM_TASKS

        if self.task not in ORGANISM_TASKS:
            raise ConfigError(f"demo --task {self.task!r}: choose one of {', '.join(ORGANISM_TASKS)}")
        if self.fast:
            self.steps, self.eval_every, self.eval_n, self.probe_n, self.batch_size = 6, 3, 24, 8, 8


def _log(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def organism(cfg: DemoConfig) -> Path:
    from mechopd.organisms.pretrain import FAST_ORGANISM, OrganismConfig, default_config, pretrain

    if cfg.fast:
        oc = OrganismConfig(task=cfg.task, seed=cfg.seed, **FAST_ORGANISM)
        out = Path(cfg.organism_dir) / f"{cfg.task}-fast"
    else:
        oc = default_config(cfg.task, seed=cfg.seed)
        out = Path(cfg.organism_dir) / cfg.task
    _log(f"organism: {out} ({'reused' if (out / 'organism.json').exists() else 'pretraining'})")
    return pretrain(oc, out)


def train_methods(cfg: DemoConfig, student: Path, run: Path, methods: dict[str, dict[str, Any]]) -> dict[str, Path]:
    from mechopd.config import TrainConfig
    from mechopd.train.checkpoint import latest_checkpoint
    from mechopd.train.trainer import train

    finals = {}
    for name, over in methods.items():
        out = run / "train" / name
        if (out / "final" / "config.json").exists():
            _log(f"train {name}: done, skipped")
            finals[name] = out / "final"
            continue
        resume = latest_checkpoint(out) is not None
        if out.exists() and not resume:
            shutil.rmtree(out)  # the demo's own partial output from a killed run without a checkpoint
        tc = TrainConfig(task=cfg.task, student=str(student), steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
                         seed=cfg.seed, eval_every=cfg.eval_every, eval_n=cfg.eval_n,
                         save_every=max(1, cfg.steps // 2), **{**over, **cfg.train_overrides})
        _log(f"train {name}: {over} ({'resuming' if resume else 'new'})")
        finals[name] = train(tc, out, resume=resume)
    return finals


def evaluate_all(cfg: DemoConfig, models: dict[str, Path], run: Path) -> dict[str, dict]:
    from mechopd.evaluate import EvalConfig, evaluate_model, format_summary, write_report
    from mechopd.models import load_model, load_tokenizer
    from mechopd.tasks.base import get_task

    task = get_task(cfg.task)
    out = {}
    for name, path in models.items():
        target = run / "eval" / f"{name}.json"
        if target.exists():
            out[name] = json.loads(target.read_text())
            continue
        rep = evaluate_model(load_model(path), load_tokenizer(path), task, EvalConfig(n=cfg.eval_n, seed=cfg.seed))
        rep["settings"]["model"] = str(path)
        write_report(rep, target)
        out[name] = rep
        print(format_summary(LABELS.get(name, name), rep["summary"]), flush=True)
    return out


def run_probes(cfg: DemoConfig, models: dict[str, Path], run: Path) -> None:
    """Every registered probe that has a place in the demo (`ProbeSpec.demo`: its options, i.e. which models), on
    the demo's setup (task, probe_n items, seed; models base + methods); a probe whose first output exists is skipped."""
    from mechopd.probes.registry import probes as registered
    from mechopd.probes.setup import ProbeSetup

    out = run / "probes"
    setup = ProbeSetup(task=cfg.task, n=cfg.probe_n, seed=cfg.seed, models={k: str(v) for k, v in models.items()},
                       run=str(run))
    for spec in registered():
        if spec.demo is None or (spec.outputs and (out / spec.outputs[0]).exists()):
            continue
        _log(f"probe {spec.name} ({', '.join(f'{k}={v}' for k, v in spec.demo.items())})")
        spec(setup, out, **spec.demo)


def sweep(cfg: DemoConfig, student: Path, run: Path) -> None:
    """TA-OPD budget curve: final no-context accuracy against ρ for each selector."""
    from mechopd.evaluate import EvalConfig, evaluate_model
    from mechopd.models import load_model, load_tokenizer
    from mechopd.tasks.base import get_task

    target = run / "sweep" / "sweep.json"
    rows = json.loads(target.read_text())["rows"] if target.exists() else []
    done = {(r["selector"], r["budget"]) for r in rows}
    sub = DemoConfig(**{**asdict(cfg), "out": str(run / "sweep"), "eval_every": 0})
    for sel in SWEEP_SELECTORS:
        for rho in SWEEP_BUDGETS:
            if (sel, rho) in done:
                continue
            name = f"{sel}-{rho:g}"
            final = train_methods(sub, student, run / "sweep", {name: {"method": "opd", "selector": sel,
                                                                       "budget": rho}})[name]
            s = evaluate_model(load_model(final), load_tokenizer(final), get_task(cfg.task),
                               EvalConfig(n=cfg.eval_n, seed=cfg.seed, n_boot=0))["summary"]
            rows.append({"selector": sel, "budget": rho, "acc_x": s["acc_x"]["value"], "acc_xc": s["acc_xc"]["value"],
                         "harm": s["harm"]["value"]})
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps({"rows": rows}, indent=1))


def demo(cfg: DemoConfig) -> Path:
    """Run every stage; returns the report path."""
    from mechopd.plots import draw_all
    from mechopd.removability import RegimeThresholds
    from mechopd.report import write_report_md

    t0 = time.time()
    run = Path(cfg.out)
    run.mkdir(parents=True, exist_ok=True)
    student = organism(cfg)
    manifest = {"task": cfg.task, "methods": list(METHODS), "labels": LABELS, "organism": str(student),
                "thresholds": asdict(RegimeThresholds()), "config": asdict(cfg),
                "command": "mechopd " + " ".join(sys.argv[1:]) if sys.argv and "mechopd" in sys.argv[0] else None}
    (run / "demo.json").write_text(json.dumps(manifest, indent=1))
    finals = train_methods(cfg, student, run, METHODS)
    models = {"base": student, **finals}
    evaluate_all(cfg, models, run)
    run_probes(cfg, models, run)
    if cfg.sweep:
        sweep(cfg, student, run)
    _log("figures")
    draw_all(run)
    report = write_report_md(run)
    manifest["wall_s"] = round(time.time() - t0, 1)
    (run / "demo.json").write_text(json.dumps(manifest, indent=1))
    _log(f"report: {report} ({manifest['wall_s']:.0f} s)")
    return report
