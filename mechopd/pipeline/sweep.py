"""`mechopd demo --sweep`: the TA-OPD budget curve (fig. 8) — final no-context accuracy against ρ for each selector,
with the measured kept fraction, into ``RUN/sweep/sweep.json``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from mechopd.core.artifacts import read_json, write_json
from mechopd.study import EvalReport, mean_kept_fraction

SWEEP_SELECTORS = ("ta_opd", "random", "entropy", "divergence")
SWEEP_BUDGETS = (0.05, 0.10, 0.30, 0.50)


def sweep(cfg: Any, student: Path, run: Path, train_methods: Callable[..., dict[str, Path]]) -> None:
    """TA-OPD budget curve: final no-context accuracy against ρ for each selector (with the measured kept fraction);
    ``cfg`` a `mechopd.pipeline.demo.DemoConfig`, ``train_methods`` the demo's trainer of named runs."""
    from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
    from mechopd.models import load_model, load_tokenizer
    from mechopd.tasks.base import get_task

    target = run / "sweep" / "sweep.json"
    rows = read_json(target)["rows"] if target.exists() else []
    done = {(r["selector"], r["budget"]) for r in rows}
    sub = replace(cfg, out=str(run / "sweep"), eval_every=0)
    for sel in SWEEP_SELECTORS:
        for rho in SWEEP_BUDGETS:
            if (sel, rho) in done:
                continue
            name = f"{sel}-{rho:g}"
            final = train_methods(
                sub, student, run / "sweep", {name: {"method": "opd", "selector": sel, "budget": rho}}
            )[name]
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
