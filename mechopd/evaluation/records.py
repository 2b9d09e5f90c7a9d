"""What a run or a checkpoint records about how it was trained, and the render a later command takes from it.

A training run writes its resolved config twice: ``RUN/config.yaml`` and ``RUN/final/training.json`` (``{"config":
...}``; also in every ``checkpoints/step-N``). `recorded_config` reads it from a run directory or a checkpoint
directory. `recorded_render` turns it into the render a later ``eval`` uses: the record is the default, and a flag
that would render differently from training (another ``--no-context-system``, another or an extra
``--chat-template-kwarg``) is refused (exit 2) — an evaluation silently rendered with thinking on for a run trained
with ``enable_thinking=false`` differs on every greedy response.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from mechopd.config.sections import RolloutOptions
from mechopd.core.checks import check_task_vocab
from mechopd.core.config_parse import StrictLoader
from mechopd.core.errors import ConfigError
from mechopd.core.model_checks import read_config
from mechopd.core.views import RenderSpec
from mechopd.evaluation.pinning import check_fits, pin_render
from mechopd.generate.settings import task_default
from mechopd.models import load_tokenizer


def recorded_config(path: str | Path) -> tuple[dict[str, Any], Path] | None:
    """(config dict, file it came from) of a run dir (config.yaml, else final/training.json) or a checkpoint dir
    (final/'s training.json, a step-N's trainer_state.json); None when `path` records nothing (a plain checkpoint, an
    organism, a hub id)."""
    p = Path(path)
    for file in (p / "config.yaml", p / "final" / "training.json", p / "training.json", p / "trainer_state.json"):
        if not file.is_file():
            continue
        try:
            text = file.read_text(encoding="utf-8")
            doc = (yaml.load(text, Loader=StrictLoader) or {}) if file.suffix == ".yaml" else json.loads(text)  # noqa: S506
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:
            raise ConfigError(f"{file} is not readable ({type(e).__name__}); restore it from the run") from None
        cfg = doc if file.suffix == ".yaml" else (doc.get("config") if isinstance(doc, dict) else None)
        if not isinstance(cfg, dict):
            raise ConfigError(f"{file} holds no config mapping; pass a run written by mechopd train")
        return cfg, file
    return None


def recorded_render(
    record: tuple[dict[str, Any], Path] | None,
    placement: str,
    no_context_system: str | None,
    chat_template_kwargs: dict[str, Any],
) -> RenderSpec:
    """The render of a recorded run, or of the flags when nothing is recorded; flags that differ are refused."""
    if record is None:
        return RenderSpec(placement, no_context_system, dict(chat_template_kwargs))
    cfg, file = record
    ncs, kwargs = cfg.get("no_context_system"), dict(cfg.get("chat_template_kwargs") or {})
    if no_context_system is not None and no_context_system != ncs:
        raise ConfigError(
            f"--no-context-system {no_context_system!r} differs from the run's no_context_system "
            f"{ncs!r} ({file}); omit the flag to evaluate with the render the run was trained with"
        )
    differ = sorted(k for k, v in chat_template_kwargs.items() if k not in kwargs or kwargs[k] != v)
    if differ:
        k = differ[0]
        raise ConfigError(
            f"--chat-template-kwarg {k}={chat_template_kwargs[k]!r} differs from the run's "
            f"chat_template_kwargs {kwargs} ({file}); omit the flag to evaluate with the render the run "
            "was trained with"
        )
    return RenderSpec(placement, ncs, kwargs)


def recorded_task(
    records: dict[str, tuple[dict[str, Any], Path] | None], task: str | None, options: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The task to evaluate: ``--task`` (with ``--option``), else the one task every model's record names. The
    options every model that records that task was trained with apply (``--option`` on top), whichever models record
    nothing (an organism, a base): a model distilled with ``rule: reverse`` is never scored against the default rule.
    Models recording the same task with different options (a key ``--option`` does not set) are refused."""
    recs = {label: r for label, r in records.items() if r is not None}
    named = {(r[0].get("task"), json.dumps(r[0].get("task_options") or {}, sort_keys=True)) for r in recs.values()}
    if task is None:
        if len(named) != 1 or len(recs) != len(records):
            raise ConfigError(
                "--task is required: the model records no training task (or the models record different "
                "ones); e.g. --task rules"
            )
        task = str(next(iter(named))[0])
    merged: dict[str, tuple[Any, Path]] = {}
    for cfg, file in (r for r in recs.values() if r[0].get("task") == task):
        recorded = cfg.get("task_options") or {}
        for key, value in recorded.items() if isinstance(recorded, dict) else ():
            if key in options:
                continue
            if key in merged and merged[key][0] != value:
                raise ConfigError(
                    f"the models were trained on {task} with different {key}: {merged[key][0]!r} "
                    f"({merged[key][1]}) and {value!r} ({file}); evaluate them apart, or pass --option "
                    f"{key}=VALUE to score every model on one"
                )
            merged.setdefault(key, (value, file))
    return task, {**{k: v for k, (v, _) in merged.items()}, **options}


def checked_renders(
    task: Any,
    paths: dict[str, str],
    records: dict[str, Any],
    no_context_system: str | None,
    chat_template_kwargs: dict[str, Any],
    seed: int,
    rollout: RolloutOptions,
):
    """Every model's tokenizer and pinned render (the record's, else the flags'), checked before the first model
    loads: the task's vocabulary, the render (`pinning.pin_render`) and the first item's length. Prints what was
    pinned (`rollout`: the evaluation's section, its response cap). Returns (tokenizers, specs) by label."""
    toks, specs = {}, {}
    for name, path in paths.items():
        toks[name] = load_tokenizer(path)
        check_task_vocab(toks[name], task)
        first = task.examples("test", 1, seed)[0]
        spec = recorded_render(records[name], task.placement, no_context_system, chat_template_kwargs)
        specs[name], note = pin_render(toks[name], spec, first.prompt, first.context)
        check_fits(
            toks[name],
            [first],
            specs[name],
            task_default(rollout, task, "max_new_tokens"),  # every item: later
            getattr(read_config(path), "max_position_embeddings", None),
        )
        if note:
            print(f"{name}: {note}", flush=True)
    return toks, specs
