"""`mechopd demo --sweep`: the TA-OPD budget curve (fig. 8) — final no-context accuracy against ρ for each selector,
with the measured kept fraction, into ``RUN/sweep/sweep.json``. A stage of a seed run's finish job
(`run.finish_seed`) where its ``sweep`` is set."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from mechopd.core.artifacts import mean_kept_fraction, read_json, write_json
from mechopd.models import load_model, load_tokenizer
from mechopd.pipeline.stages import train_resumable
from mechopd.runset import EvalReport

SWEEP_SELECTORS = ("ta_opd", "random", "entropy", "divergence")
SWEEP_BUDGETS = (0.05, 0.10, 0.30, 0.50)


def sweep(cfg: Any, student: Path, run: Path) -> None:
    """TA-OPD budget curve: final no-context accuracy against ρ for each selector (with the measured kept fraction);
    ``cfg`` a `mechopd.pipeline.run.SeedRun` whose ``sweep`` holds the fields every sweep run adds."""
    from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
    from mechopd.tasks.base import get_task

    target = run / "sweep" / "sweep.json"
    rows = read_json(target)["rows"] if target.exists() else []
    done = {(r["selector"], r["budget"]) for r in rows}
    for sel in SWEEP_SELECTORS:
        for rho in SWEEP_BUDGETS:
            if (sel, rho) in done:
                continue
            name = f"{sel}-{rho:g}"
            final = _train(cfg, student, run / "sweep" / "train" / name, name, {"selector": sel, "budget": rho})
            task = get_task(cfg.task, **(cfg.task_options or {}))
            s = EvalReport.from_dict(
                evaluate_model(
                    load_model(final), load_tokenizer(final), task, EvalConfig(n=cfg.eval_n, seed=cfg.seed, n_boot=0)
                ),
                name,
            ).summary
            rows.append(
                {
                    "selector": sel,
                    "budget": rho,
                    "acc_x": s.value("acc_x"),
                    "acc_xc": s.value("acc_xc"),
                    "harm": s.value("harm"),
                    "kept": mean_kept_fraction(run / "sweep" / "train" / name),
                }
            )
            write_json(target, {"rows": rows})


def _train(cfg: Any, student: Path, out: Path, name: str, selector: dict[str, Any]) -> Path:
    """One sweep run: OPD with ``selector``, on the seed run's study (its shared training fields, no evaluation
    during training, a checkpoint at half the steps) plus ``cfg.sweep``; skipped when finished, else resumed."""
    role = re.sub(r"\W", "_", name)  # a study role is an identifier: ``ta_opd-0.1`` -> ``ta_opd_0_1``
    train = {**cfg.spec.train, "eval_every": 0}
    over = {"method": "opd", **selector, "save_every": max(1, int(train["steps"]) // 2), **cfg.sweep}
    spec = replace(cfg.spec, train=train, runs={role: over}, probes={}, seeds=[cfg.seed])
    return train_resumable(name, out, lambda: spec.train_config(role, cfg.seed, str(student)), over, out.parents[2])
