"""`mechopd eval` and `mechopd.run_eval` as one library call: a checkpoint's evaluation with its training record read.

`plan_eval` reads, before any model loads, the task (named, else the one every model's training record names) and
its options; `evaluate_plan` checks every checkpoint, pins each render to its record (`records.checked_renders`:
the task's vocabulary, the no-context system prompt, the chat template variables, the first item's length), then
evaluates every model in both views, Acc_xc and Acc_x, Harm, Help (docs/method.md §2), and with ``other_contexts``
under the task's other contexts (following, retention against a model named base). The CLI adds only the report
paths, the lock and the printing (`cli/eval_cmd.py`).

    from mechopd.evaluation.run import evaluate_checkpoint
    rep = evaluate_checkpoint("runs/x/final", None, n=200)   # the task the run recorded
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechopd.config import TrainConfig
from mechopd.core.errors import ConfigError
from mechopd.evaluation.evaluate import EvalConfig, evaluate, evaluate_model, write_report
from mechopd.evaluation.following import add_following, apply_retention
from mechopd.evaluation.records import checked_renders, recorded_config, recorded_task
from mechopd.generate.vllm_engine import VllmEngine
from mechopd.models import check_model, load_model
from mechopd.models.spec import resolve_spec
from mechopd.tasks.base import get_task


def evaluate_checkpoint(
    model: Any,
    task: Any = None,
    *,
    n: int = EvalConfig.n,
    seed: int = EvalConfig.seed,
    samples: int = EvalConfig.samples,
    temperature: float | None = EvalConfig.temperature,
    max_new_tokens: int | None = EvalConfig.max_new_tokens,
    engine: str = EvalConfig.engine,
    no_context_system: str | None = TrainConfig.no_context_system,
    chat_template_kwargs: dict[str, Any] | None = None,
    other_contexts: bool = False,
    task_options: dict[str, Any] | None = None,
    out: str | Path | None = None,
    spec: Any = None,
    tokenizer: Any = None,
) -> dict[str, Any]:
    """``mechopd.run_eval``: a checkpoint dir, hub id or organism:<task> through `mechopd eval`'s checks (``task``
    None: the task its record names); a loaded model (with ``tokenizer``), a task object or an explicit render
    ``spec`` go to `evaluate.evaluate` as given. Writes the report to ``out`` when given."""
    if not isinstance(model, (str, Path)) or tokenizer is not None or spec is not None or hasattr(task, "examples"):
        if task is None:
            raise ConfigError("run_eval: pass task= (a name or a task object) with a loaded model")
        return evaluate(
            model,
            task,
            n=n,
            seed=seed,
            samples=samples,
            temperature=temperature,
            spec=spec,
            tokenizer=tokenizer,
            task_options=task_options,
            out=out,
        )
    cfg = EvalConfig(
        n=n, seed=seed, samples=samples, temperature=temperature, max_new_tokens=max_new_tokens, engine=engine
    )  # every setting validated before any work
    plan = plan_eval({"model": str(model)}, task, task_options)
    rep = evaluate_plan(
        plan,
        cfg,
        no_context_system=no_context_system,
        chat_template_kwargs=chat_template_kwargs,
        other_contexts=other_contexts,
    )["model"]
    if out is not None:
        write_report(rep, out)
    return rep


@dataclass
class EvalPlan:
    """What `mechopd eval` and `run_eval` evaluate, read before any model loads: the task (named, else the one every
    model's training record names: `records.recorded_task`), its options, the models by label, their records."""

    task_name: str
    task_options: dict[str, Any]
    task: Any
    models: dict[str, str]
    records: dict[str, Any]


def plan_eval(
    models: dict[str, str],
    task: str | None = None,
    task_options: dict[str, Any] | None = None,
    run: str | Path | None = None,
) -> EvalPlan:
    """The checked plan of an evaluation of ``models`` (label -> checkpoint dir, hub id or organism:<task>); ``run``:
    a training run whose record (config.yaml) stands for its final/ checkpoint."""
    if run is not None and not Path(run, "final", "config.json").is_file():
        raise ConfigError(f"--run {run} holds no final checkpoint (final/); pass a finished training run")
    records = {name: recorded_config(run or path) for name, path in models.items()}
    name, options = recorded_task(records, task, dict(task_options or {}))
    return EvalPlan(name, options, get_task(name, **options), dict(models), records)


def evaluate_plan(
    plan: EvalPlan,
    cfg: EvalConfig,
    *,
    no_context_system: str | None = TrainConfig.no_context_system,
    chat_template_kwargs: dict[str, Any] | None = None,
    other_contexts: bool = False,
) -> dict[str, dict[str, Any]]:
    """Every model of ``plan`` in both views (and under the task's other contexts: following, retention against a
    model named base): each checkpoint checked, each render pinned to its training record and checked against the
    task (`records.checked_renders`) before the first model loads. Returns the reports by label (not written)."""
    from mechopd.organisms.pretrain import pretrain_organism

    paths = {name: check_model(resolve_spec(path, make=pretrain_organism)) for name, path in plan.models.items()}
    toks, specs = checked_renders(
        plan.task, paths, plan.records, no_context_system, dict(chat_template_kwargs or {}), cfg.seed, cfg.rollout()
    )
    reports = {}
    for name, path in paths.items():
        model, engine = load_model(path), None
        if cfg.engine == "vllm":
            engine = VllmEngine(path)
        reports[name] = evaluate_model(model, toks[name], plan.task, cfg, specs[name], engine=engine)
        reports[name]["settings"].update(
            model=str(Path(path).resolve()) if Path(path).exists() else str(path), task_options=plan.task_options
        )
        if other_contexts:
            add_following(reports[name], model, toks[name], plan.task, cfg, specs[name])
    if other_contexts:
        apply_retention(reports)
    return reports
