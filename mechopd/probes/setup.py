"""One probe setup: task, task options, render spec, sampling settings, items and the models, for every probe.

Build it three ways; all give the same object:

    ProbeSetup(task="jsonl", task_options={"path": "qa.jsonl"}, n=32, models={"base": "runs/o", "opd": "runs/x/final"})
    ProbeSetup.from_run("runs/x")         # a training run dir (config.yaml, else final/training.json) or a demo dir
    setup_from_args(namespace)            # the `mechopd probe` flags (--run, --task, ...): mechopd.cli.probe_cmd

Models are named: ``base`` is the initial student (W0; the teacher too unless ``teacher`` is given), every other label
is a trained model. A training run dir gives ``base`` (its ``student``; ``organism:<task>`` resolved to
``<organism_dir>/<task>``), ``teacher`` (when the run had one) and one trained label (the method, or the selector
when it is not ``full``: ``opd``, ``nca``, ``ta_opd``) -> ``RUN/final``; a demo dir gives ``base`` (the organism) and
one label per ``train/<m>/final``. A probe names the models it reads by label (or by checkpoint dir).

Defaults left as None mean "the task's" (placement, temperature, max_new_tokens) or "the probe's" (split: the
on-policy probes sample training prompts, similarity held-out ones).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechopd.config import TrainConfig, build_config
from mechopd.core.artifacts import read_json
from mechopd.core.checks import check_label
from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.options import GE0, GE1, check_fields, check_seed, check_temperature, option
from mechopd.core.views import PLACEMENTS, RenderSpec
from mechopd.models.fetch import fetched_name
from mechopd.models.spec import is_named, recorded_model, resolve_spec
from mechopd.organisms.recipes import load_train_config
from mechopd.probes.items import ProbeItems, make_batches
from mechopd.runset import RunSet

BASE, TEACHER = "base", "teacher"
DEFAULT_N = 64
SPLITS = ("train", "test")
DEMO_FILE = "demo.json"


class TaskView:
    """A task with the setup's temperature / max_new_tokens in place of its own (every other attribute forwarded)."""

    def __init__(self, task: Any, temperature: float | None, max_new_tokens: int | None) -> None:
        self._task = task
        self.temperature = float(task.temperature if temperature is None else temperature)
        self.max_new_tokens = int(task.max_new_tokens if max_new_tokens is None else max_new_tokens)

    def __getattr__(self, name: str) -> Any:
        if name == "_task":  # not set yet (copy / unpickle): no recursion
            raise AttributeError(name)
        return getattr(self._task, name)


@dataclass
class ProbeSetup:
    """What every probe reads. Fields = CLI flags = keys of a run's config (see the module docstring); each field's
    help, flag and range are declared once, here, and `mechopd probe NAME`'s setup flags are generated from them
    (`mechopd.core.options.add_flags`, typed, as every probe's own options; a flag's default there is None: a flag
    left out keeps what ``--run`` says).

    models: label -> checkpoint dir; responses_from: a model label, ``"answers"`` (the task's reference answers) or a
    ``.jsonl`` of response ids (probes that score given responses: similarity; the on-policy probes sample from the
    model their quantity is defined on). run: the run dir it was read from (outputs default to ``run/probes``).
    """

    run: str | None = option(
        None, help="a training run or demo dir: task, options, render spec and models come from it", metavar="RUN_DIR"
    )
    task: str = option("rules", help="task name (with --run: the run's)")
    task_options: dict[str, Any] = option(
        help="task option, e.g. --option path=qa.jsonl --option rule=shift:2",
        default_factory=dict,
        flag="--option",
        metavar="KEY=VALUE",
    )
    placement: str | None = option(
        None, help="system | user: where the context goes (default: the task's)", choices=PLACEMENTS
    )
    no_context_system: str | None = option(None, help="explicit system prompt of the no-context view")
    chat_template_kwargs: dict[str, Any] = option(
        help="chat-template variable, e.g. --chat-template-kwarg enable_thinking=false",
        default_factory=dict,
        flag="--chat-template-kwarg",
        metavar="KEY=VALUE",
    )
    temperature: float | None = option(None, help="sampling temperature (default: the run's/task's)")
    max_new_tokens: int | None = option(None, help="response cap (default: the run's / task's)", range=GE1)
    n: int | None = option(None, help=f"items (default {DEFAULT_N}, or the demo's)", range=GE1)
    seed: int = option(0, help="item and sampling seed (with --run: the run's)", range=GE0)
    batch_size: int = option(8, help="items per forward", range=GE1)
    split: str | None = option(None, help="train | test: item split (default: the probe's)", choices=SPLITS)
    responses_from: str | None = option(
        None, help="model label, 'answers' or a responses .jsonl (probes that score given responses)"
    )
    select: str | None = option(
        None,
        help="a trained model's label: the held-out items it learned (right without the context, the base wrong) or "
        "was harmed on (right without, wrong with it), from RUN/eval/ (mechopd.probes.informative)",
    )
    models: dict[str, str] = field(default_factory=dict)  # no flag: --run, or the probe's own model options

    def __post_init__(self) -> None:
        check_fields(self)  # every declared range and choice (n, batch_size, max_new_tokens, placement, split, ...)
        check_temperature(self.temperature)  # the rule of every verb
        check_seed(self.seed)
        self.models = {
            str(k): str(Path(v).resolve()) if Path(str(v)).exists() else str(v)  # recorded absolute
            for k, v in self.models.items()
        }

    # -- what the probes read ------------------------------------------------------------------------------------------
    def make_task(self) -> TaskView:
        """The task with its options, the setup's temperature and max_new_tokens."""
        from mechopd.tasks.base import get_task

        view = TaskView(get_task(self.task, **self.task_options), self.temperature, self.max_new_tokens)
        if self.select is None:
            return view
        from mechopd.probes.informative import SelectedTask, selection

        if self.run is None:
            raise ConfigError(f"probe setup select={self.select}: needs --run (the run's evaluation picks the items)")
        return SelectedTask(view, selection(self.run, self.select))  # type: ignore[return-value]

    def spec(self, task: Any | None = None) -> RenderSpec:
        """The render spec: ``placement`` (default: the task's), ``no_context_system``, ``chat_template_kwargs``."""
        placement = self.placement or (task or self.make_task()).placement
        return RenderSpec(placement, self.no_context_system, dict(self.chat_template_kwargs))

    def n_for(self, task: Any, split: str) -> int:
        """Items to use: ``n``; None = DEFAULT_N, or the whole split when the task reports fewer (``split_sizes``,
        e.g. a small JSONL file). An explicit ``n`` above the split's size is the task's error."""
        if self.n is not None:
            return self.n
        sizes = task.split_sizes() if hasattr(task, "split_sizes") else {}
        return min(DEFAULT_N, sizes[split]) if sizes.get(split) else DEFAULT_N

    def examples(self, task: Any | None = None, default_split: str = "test") -> list:
        """`n_for` examples of the task (``split``, else the probe's ``default_split``) for ``seed``."""
        task = task or self.make_task()
        split = self.split or default_split
        return task.examples(split, self.n_for(task, split), self.seed)

    def items(self, tokenizer: Any, source: Any, task: Any | None = None, *, greedy: bool = False) -> ProbeItems:
        """The examples with one response each, as a re-iterable source of `TwoViewBatch`es.

        source: a model (responses sampled on the no-context view with the setup's temperature, max_new_tokens and
        seed; ``greedy`` for argmax), ``"answers"`` (the reference answers + eos), or the response ids themselves.
        """
        task = task or self.make_task()
        split = self.split or "test"
        return make_batches(
            tokenizer,
            task,
            self.n_for(task, split),
            self.seed,
            self.batch_size,
            source,
            self.spec(task),
            split=split,
            greedy=greedy,
        )

    # -- models ------------------------------------------------------------------------------------------------------
    @property
    def trained(self) -> list[str]:
        """Labels of the trained models (every label but base and teacher), in order."""
        return [k for k in self.models if k not in (BASE, TEACHER)]

    def model(self, ref: str | None, role: str) -> tuple[str, str]:
        """(label, checkpoint dir) of a model named by label, by dir, ``organism:<task>`` or ``model:NAME`` (label NAME;
        fetched on first use); None = the role's default: ``base``;
        ``teacher`` (the teacher, else base); ``trained`` (the first trained model)."""
        if ref is None:
            ref = self._default(role)
        if ref in self.models:
            return ref, self.models[ref]
        if is_named(ref) or os.sep in ref or Path(ref).exists():  # model:NAME labelled NAME
            return fetched_name(ref) or Path(ref).name or ref, resolve_spec(ref)
        known = ", ".join(self.models) or "none"
        raise ConfigError(
            f"model {ref!r} is neither a label of this setup (labels: {known}) nor a checkpoint dir; "
            "pass --run RUN_DIR or a path"
        )

    def pick(self, refs: Sequence[str] | Mapping[str, str] | None, default: Sequence[str]) -> dict[str, str]:
        """label -> dir of several models: a mapping as given; else labels, dirs or ``NAME=DIR`` items resolved with
        `model` (None or empty: the labels ``default``)."""
        if isinstance(refs, Mapping):
            return {str(k): str(v) for k, v in refs.items()}

        out: dict[str, str] = {}
        for ref in refs or default:
            name, sep, path = ref.partition("=")
            label, path = (name, resolve_spec(path)) if sep and name and path else self.model(ref, "trained")
            check_label(label, "--models")
            dup = next((k for k in out if k.lower() == label.lower()), None)
            if dup is not None:
                raise ConfigError(
                    f"--models names {label!r} twice ({dup}={out[dup]} and {ref}); give each model its own label"
                )
            out[label] = path
        if not out:
            raise ConfigError(
                "no models given: pass --run RUN_DIR or the probe's model flags, e.g. --models "
                "base=runs/organisms/rules opd=runs/opd/final"
            )
        return out

    def _default(self, role: str) -> str:
        if role == TEACHER and TEACHER in self.models:
            return TEACHER
        if role in (BASE, TEACHER) and BASE in self.models:
            return BASE
        if role == "trained" and self.trained:
            return self.trained[0]
        raise ConfigError(
            f"no {role} model: pass --run RUN_DIR (a training or demo run) or the probe's model flags "
            "(see mechopd probe NAME --help)"
        )

    def replace(self, **changes: Any) -> ProbeSetup:
        """A copy with ``changes`` (None values are ignored; task_options / chat_template_kwargs / models merged)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        for key in ("task_options", "chat_template_kwargs", "models"):
            if key in changes:
                changes[key] = {**getattr(self, key), **changes[key]}
        return dataclasses.replace(self, **changes)

    # -- from a run directory ------------------------------------------------------------------------------------------
    @classmethod
    def from_run(cls, run_dir: str | os.PathLike) -> ProbeSetup:
        """Read a training run dir (``config.yaml``, else ``final/training.json``) or a demo dir (``demo.json``)."""
        run = Path(run_dir)
        if not run.is_dir():
            raise ConfigError(f"--run {run} is not a directory; pass a run dir written by mechopd train or demo")
        if (run / DEMO_FILE).is_file():
            return _from_demo(run)
        return _from_training(run)


def method_label(cfg: Any) -> str:
    """The label of a trained model: its selector when it is not ``full`` (``ta_opd``), else its method."""
    return cfg.method if cfg.selector == "full" else cfg.selector


def _train_config(run: Path):

    if (run / "config.yaml").is_file():
        return load_train_config(run / "config.yaml")
    if (run / "final" / "training.json").is_file():
        doc = read_json(run / "final" / "training.json")
        if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
            raise ConfigError(
                f"{run / 'final' / 'training.json'} has no 'config' object; pass a run written by mechopd train"
            )
        return build_config(TrainConfig, doc["config"], source=str(run / "final" / "training.json"))
    raise ConfigError(
        f"--run {run} holds neither config.yaml, final/training.json nor demo.json; pass a run dir "
        "written by mechopd train or mechopd demo"
    )


def _checkpoint_study_config(run: Path, task: str, recorded: Mapping[str, Any]) -> Any:
    """The setup's config of a `mechopd run` dir whose runs are all checkpoints (no training config to read):
    demo.json's task, task options, seed, student and render fields."""
    data = {
        "task": task,
        "task_options": dict(recorded.get("task_options") or {}),
        "seed": recorded.get("seed", TrainConfig.seed),
        "student": recorded.get("student") or TrainConfig.student,
        **dict(recorded.get("render") or {}),
    }
    return build_config(TrainConfig, data, source=f"{run / DEMO_FILE}: config")


def _final(run: Path) -> str:
    if not (run / "final" / "config.json").is_file():
        raise ModelError(f"{run / 'final'} holds no checkpoint; finish the run (mechopd train ... --resume) first")
    return str(run / "final")


def _setup_of_config(cfg: Any, models: dict[str, str], run: Path, **extra: Any) -> ProbeSetup:
    return ProbeSetup(
        task=cfg.task,
        task_options=dict(cfg.task_options),
        no_context_system=cfg.no_context_system,
        chat_template_kwargs=dict(cfg.chat_template_kwargs),
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        models=models,
        run=str(run),
        **extra,
    )


def _from_training(run: Path) -> ProbeSetup:
    cfg = _train_config(run)
    models = {BASE: recorded_model(cfg.student, cfg.organism_dir, run)}  # the run's paths: relative to the run
    if cfg.teacher:
        models[TEACHER] = recorded_model(cfg.teacher, cfg.organism_dir, run)
    models[method_label(cfg)] = _final(run)
    return _setup_of_config(cfg, models, run)


def _from_demo(run: Path) -> ProbeSetup:
    """A demo dir through its typed study (`mechopd.runset`: ``study.yaml``, else ``demo.json``): one label per run
    (its name), base = the organism."""
    study = RunSet.load(run)
    trained = [r for r in study.runs.values() if r.role != BASE]
    if not trained:
        raise ConfigError(f"{run / DEMO_FILE} names no methods and {run / 'train'} is empty; rerun mechopd demo")
    own = [r for r in trained if r.model is None]  # a study's checkpoint run has no train dir
    cfg = _train_config(own[0].train_dir) if own else _checkpoint_study_config(run, study.task, study.config)
    base_run = study.run(BASE)
    organism = base_run.model if base_run is not None and base_run.model else cfg.student
    models = {BASE: recorded_model(str(organism), cfg.organism_dir, run)}
    models.update({r.name: r.model or _final(r.train_dir) for r in trained})  # a study's checkpoint run: its dir
    probe_n = study.config.get("probe_n")
    if probe_n is not None and (isinstance(probe_n, bool) or not isinstance(probe_n, int) or probe_n < 1):
        raise ConfigError(
            f"{run / DEMO_FILE}: config.probe_n={probe_n!r} is not an integer >= 1; restore the file "
            "(mechopd demo writes it)"
        )
    return _setup_of_config(cfg, models, run, **({"n": probe_n} if probe_n else {}))
