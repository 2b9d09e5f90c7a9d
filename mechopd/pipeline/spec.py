"""The study file of `mechopd run STUDY.yaml`: one comparison on any model, declared once and checked before any job.

    task: jsonl                      # any registered task
    task_options: {path: data.jsonl, context_file: context.txt, placement: system}   # files beside the study file
    render: {no_context_system: "", chat_template_kwargs: {enable_thinking: false}}
    student: Qwen/Qwen3-1.7B         # a checkpoint dir, a hub id, organism:<task> or model:NAME
    teacher: null                    # null: self-distillation (the frozen initial student)
    seeds: [0, 1, 2]                 # training seeds; two or more: RUN/seed-k and the aggregate over seeds
    train: {steps: 100, batch_size: 32, lr: 1.0e-4}   # shared training fields (any TrainConfig field)
    runs:                            # one entry per compared run, by ROLE (opd, nca, ta_opd, nca_follow, or yours)
      opd: {method: opd}
      nca: {method: nca, beta: 0.5}
      old_opd: {checkpoint: runs/demo/train/opd/final}   # an already-trained model: evaluated and probed, not trained
    eval: {n: 200, other_contexts: true}             # n, other_contexts, and any other EvalConfig field but seed
    probes: {similarity: {n: 16}, deltas: {}}        # registered probes: setup fields (n, batch_size, split, ...)
                                                     # and the probe's own options (its `mechopd probe NAME` flags;
                                                     # left out: their defaults, e.g. deltas runs no SVD)
    probe_n: 64                      # optional: every probe's items unless its entry sets n (null: each probe's own)
    first_seed_only: [patching]      # optional: probes run on the first seed only (no claim reads them)

The built-in studies of `mechopd demo` are such files (``mechopd/data/studies/<task>.yaml``, `builtin_study`).

A run entry is training fields, or ``checkpoint: DIR`` alone: a model trained elsewhere from the study's student
(``mechopd train``, or another run's ``RUN/train/<role>/final``), which `mechopd run` evaluates and probes as it does
the runs it trains, and never trains. It gets no ``train/<role>/``: the run dir records the directory in ``demo.json``
and ``study.yaml`` and its content in ``study_inputs.json`` (a rerun over a changed checkpoint is refused). The probe
studies of ``probes/`` are such files, every run a checkpoint. A trained run's config is ``train``, then its ``runs``
entry, then the study's task, student, teacher, render and seed (`StudySpec.train_config`); an organism student takes
its recipe (`organisms.recipes`) under what the file sets, as `mechopd train` does. Unless ``save_every`` is set, a
run writes one checkpoint at half its steps (rounded up), so a killed study resumes, and removes it once its final
model is written (``keep_checkpoints: false``); with ``save_every`` set, the checkpoints are kept (only the latest with
its optimizer state). Relative paths in a study FILE (the task's file options
``path`` / ``context_file`` / ``other_context_file``, a student or teacher directory, checkpoints) are read against the
file's folder, whatever the current directory (`anchor_paths`; a student or teacher that is not a directory there stays
a hub id); a study given as a mapping reads them against the current directory.
Every value is checked when the file is read: unknown keys, a role that is not an identifier, a training field of no
`TrainConfig` (each run's config is built), a checkpoint run with a training field or a checkpoint directory that is
not there, an unknown probe or probe option, a probe whose roles the study lacks. `StudySpec.load` is the one reader
(the demo's built-in studies: `builtin_study`, `named.load_named`).
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mechopd.config import TrainConfig, build_config
from mechopd.core.config_parse import load_yaml
from mechopd.core.errors import ConfigError, MechopdError
from mechopd.core.options import option
from mechopd.core.runcheck import check_item_count
from mechopd.evaluation.config import EvalConfig

RENDER_KEYS = ("placement", "no_context_system", "chat_template_kwargs")
STUDY_SET = ("task", "task_options", "student", "teacher", "seed", "no_context_system", "chat_template_kwargs")
PROBE_SETUP_KEYS = ("n", "batch_size", "split", "temperature", "max_new_tokens", "responses_from", "select")
RESERVED_ROLES = ("base", "teacher")
CHECKPOINT = "checkpoint"  # a run entry naming an already-trained model (no TrainConfig field has this name)


@dataclass
class StudySpec:
    """A study file (module docstring); validated in `__post_init__`, errors name the key and the fix."""

    task: str
    student: str
    runs: dict[str, dict[str, Any]]
    task_options: dict[str, Any] = field(default_factory=dict)
    render: dict[str, Any] = field(default_factory=dict)
    teacher: str | None = TrainConfig.teacher
    seeds: list[int] = field(default_factory=lambda: [0])
    train: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)
    probes: dict[str, Any] = field(default_factory=dict)
    probe_n: int | None = option(None, help="items of every probe unless its entry sets n (null: each probe's own)")
    first_seed_only: list[str] = field(default_factory=list)
    source: str = field(default="study", repr=False, compare=False)  # the file it came from (error messages)

    def __post_init__(self) -> None:
        w = self.source
        for key in ("task", "student"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key).strip():
                raise ConfigError(
                    f"{w}: {key} must be a non-empty string, e.g. {key}: "
                    f"{'jsonl' if key == 'task' else 'Qwen/Qwen3-1.7B'}"
                )
        if self.teacher is not None and (not isinstance(self.teacher, str) or not self.teacher.strip()):
            raise ConfigError(f"{w}: teacher must be a checkpoint dir or hub id, or null for self-distillation")
        for key in ("student", "teacher"):  # a local path that is not there (a hub id is checked when loaded)
            value = getattr(self, key)
            if value and value.startswith(("/", ".", "~")) and not Path(value).expanduser().exists():
                raise ConfigError(
                    f"{w}: {key} {value} does not exist; pass a checkpoint dir, a hub id, organism:<task> or model:NAME"
                )
        for key in ("task_options", "render", "train", "runs", "eval", "probes"):
            if getattr(self, key) is None:
                setattr(self, key, {})
            if not isinstance(getattr(self, key), Mapping):
                raise ConfigError(f"{w}: {key} must be a mapping of key: value pairs (see mechopd/pipeline/spec.py)")
        self._check_seeds()
        task = self._check_task()
        self._check_render(task)
        self._check_runs()
        self._check_eval(task)
        self._check_probes()
        self._check_probe_extras()
        self._check_sizes(task)

    # -- checks ------------------------------------------------------------------------------------------------------
    def _check_seeds(self) -> None:
        seeds = self.seeds
        if (
            not isinstance(seeds, list)
            or not seeds
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
        ):
            raise ConfigError(
                f"{self.source}: seeds={seeds!r} must be a non-empty list of integers >= 0, e.g. seeds: [0, 1, 2]"
            )
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"{self.source}: seeds={seeds!r} lists a seed twice; list each training seed once")

    def _check_task(self) -> Any:
        from mechopd.tasks.base import get_task

        try:
            return get_task(self.task, **self.task_options)
        except MechopdError as e:
            raise type(e)(f"{self.source}: task / task_options: {e}") from None

    def _check_render(self, task: Any) -> None:
        from mechopd.core.views import PLACEMENTS

        unknown = sorted(set(self.render) - set(RENDER_KEYS))
        if unknown:
            raise ConfigError(f"{self.source}: render.{unknown[0]} is unknown; use {', '.join(RENDER_KEYS)}")
        placement = self.render.get("placement", task.placement)
        if placement not in PLACEMENTS:
            raise ConfigError(f"{self.source}: render.placement={placement!r}; choose one of {', '.join(PLACEMENTS)}")
        if placement != task.placement:
            raise ConfigError(
                f"{self.source}: render.placement={placement!r} but task {self.task!r} places its "
                f"context in {task.placement!r} (training follows the task); set it in task_options "
                "(jsonl: placement) or drop render.placement"
            )

    def _check_runs(self) -> None:
        from mechopd.core.checks import check_label

        if not self.runs:
            raise ConfigError(
                f"{self.source}: runs is empty; name one run per role, e.g. runs: {{opd: {{method: "
                "opd}}, nca: {{method: nca, beta: 0.5}}}}"
            )
        set_here = sorted(set(self.train) & set(STUDY_SET))
        if set_here:
            raise ConfigError(
                f"{self.source}: train.{set_here[0]} is set by the study itself; use the top-level "
                "key (seed: the seeds list; render for no_context_system, chat_template_kwargs)"
            )
        for role, over in self.runs.items():
            if not isinstance(role, str) or not role.isidentifier() or role in RESERVED_ROLES:
                raise ConfigError(
                    f"{self.source}: runs.{role} is not a usable role; name it with an identifier "
                    f"other than {', '.join(RESERVED_ROLES)} (e.g. opd, nca, ta_opd)"
                )
            check_label(role, f"{self.source}: runs.{role}")
            if over is not None and not isinstance(over, Mapping):
                raise ConfigError(
                    f"{self.source}: runs.{role} must be a mapping of training fields, e.g. {{method: nca, beta: 0.5}}"
                )
            self.runs[role] = dict(over or {})
            if CHECKPOINT in self.runs[role]:
                self._check_checkpoint(role)
                continue
            bad = sorted(set(self.runs[role]) & set(STUDY_SET))
            if bad:
                raise ConfigError(
                    f"{self.source}: runs.{role}.{bad[0]} is set by the study itself; use the top-level key"
                )
            self.train_config(role, self.seeds[0])  # every field checked now, before any job
        self.first_config(self.seeds[0])  # the shared fields, also when every run is a checkpoint

    def _check_checkpoint(self, role: str) -> None:
        """A checkpoint run: ``checkpoint`` alone (it is not trained), naming a directory that is there."""
        w, entry = self.source, self.runs[role]
        extra = sorted(set(entry) - {CHECKPOINT})
        if extra:
            raise ConfigError(
                f"{w}: runs.{role} names a checkpoint and sets {extra[0]}; a checkpoint run is not trained: drop "
                f"{', '.join(extra)}, or drop checkpoint to train the run"
            )
        value = entry[CHECKPOINT]
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(
                f"{w}: runs.{role}.checkpoint must be the directory of a trained model, e.g. runs/demo/train/opd/final"
            )
        if not Path(value).expanduser().is_dir():
            raise ConfigError(
                f"{w}: runs.{role}.checkpoint {value} is not a directory; pass a trained model's directory (e.g. "
                "RUN/train/opd/final, relative to the study file's folder), or train it (method: ...) instead"
            )

    def _check_eval(self, task: Any) -> None:
        from mechopd.evaluation.evaluate import EvalConfig

        known = [f.name for f in fields(EvalConfig) if f.name not in ("seed", "thresholds")] + ["other_contexts"]
        unknown = sorted(set(self.eval) - set(known))
        if unknown:
            raise ConfigError(f"{self.source}: eval.{unknown[0]} is unknown; use {', '.join(known)}")
        if not isinstance(self.eval.get("other_contexts", True), bool):
            raise ConfigError(f"{self.source}: eval.other_contexts must be true or false")
        n = self.eval.get("n", EvalConfig.n)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(
                f"{self.source}: eval.n={n!r} must be an integer >= 1 (held-out items, e.g. {EvalConfig.n})"
            )
        held_out = (task.split_sizes() if hasattr(task, "split_sizes") else {}).get("test")
        if held_out is not None and n > held_out:
            raise ConfigError(
                f"{self.source}: eval.n={n} but task {self.task!r} holds {held_out} held-out items; "
                f"set eval.n to at most {held_out}"
            )
        try:
            EvalConfig(**self.eval_fields(), n=n)
        except (ConfigError, TypeError) as e:
            raise ConfigError(f"{self.source}: eval: {e}") from None

    def _check_sizes(self, task: Any) -> None:
        """Every run's ``pool_size`` within the task's training items and every probe's explicit ``n`` within its
        split (held-out unless the probe sets ``split``), by `Task.max_items`, before any job: a study asking for 2048
        training prompts of a 31-item file is refused here, not when its first run starts."""
        asks = [(f"runs.{r}.pool_size", "train", self.train_config(r, self.seeds[0]).pool_size) for r in self.trained]
        for name, (setup, _) in self.probe_plan().items():
            n = setup.get("n", self.probe_n)
            if isinstance(n, int) and not isinstance(n, bool):
                asks.append((f"probes.{name}.n", setup.get("split") or "test", n))
        for key, split, n in asks:
            try:
                check_item_count(task, split, n)
            except MechopdError as e:
                raise type(e)(f"{self.source}: {key}={n}: {e}") from None

    def _check_probes(self) -> None:
        from mechopd.probes.registry import demo_options, get_probe, probes, study_options
        from mechopd.probes.setup import ProbeSetup

        roles = {"base", *self.runs, *(["teacher"] if self.teacher else [])}
        study = _Roles(roles)
        for name, given in self.probes.items():
            spec = get_probe(str(name))  # unknown: ConfigError naming the known probes
            if given is not None and not isinstance(given, Mapping):
                raise ConfigError(f"{self.source}: probes.{name} must be a mapping of options, e.g. {{n: 16}}, or {{}}")
            setup, own = self.probe_plan_of(name)
            try:
                spec.values(**own)
                ProbeSetup(task=self.task, **setup)
            except ConfigError as e:
                raise ConfigError(
                    f"{self.source}: probes.{name}: {e} (setup keys: {', '.join(PROBE_SETUP_KEYS)})"
                ) from None
            self._check_select(str(name), setup)
            wanted = study_options(spec, own)  # a role option left out with a None default: every run
            asked = {r for k in spec.role_options for r in _role_names(wanted.get(k))}
            if "teacher" in asked and self.teacher and not getattr(spec, "reads_teacher", False):
                readers = ", ".join(p.name for p in probes() if getattr(p, "reads_teacher", False))
                raise ConfigError(
                    f"{self.source}: probes.{name} cannot read the teacher (only the forward-only probes {readers} "
                    "do); drop teacher from its options"
                )
            if demo_options(_Demo(wanted, spec.role_options), study) is None:
                need = [r for k in spec.role_options for r in _role_names(wanted.get(k)) if r not in roles]
                raise ConfigError(
                    f"{self.source}: probes.{name} reads the role(s) {', '.join(need)}, which the study "
                    f"lacks ({', '.join(sorted(roles))}); add that run or give the probe's "
                    f"{', '.join(spec.role_options)} option a role of the study (a study's probes read its roles, "
                    "not checkpoint dirs)"
                )

    def _check_select(self, name: str, setup: Mapping[str, Any]) -> None:
        """A probe's ``select`` names a run of the study (its evaluation picks the held-out items: never base or
        teacher, the reference) and reads the test split; refused here, not at probe time after training."""
        select = setup.get("select")
        if select is None:
            return
        if not isinstance(select, str) or select not in self.runs:
            raise ConfigError(
                f"{self.source}: probes.{name}.select={select!r} is not a run of the study; name one of "
                f"{', '.join(self.runs)} (its evaluation picks the items; base and teacher are the reference)"
            )
        if setup.get("split") == "train":
            raise ConfigError(
                f"{self.source}: probes.{name}: select={select!r} picks held-out (test) items from the evaluation; "
                "drop split: train or drop select"
            )

    def _check_probe_extras(self) -> None:
        from mechopd.probes.registry import get_probe

        n = self.probe_n
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"{self.source}: probe_n={n!r} must be an integer >= 1 (items per probe), or null")
        if not isinstance(self.first_seed_only, list):
            raise ConfigError(f"{self.source}: first_seed_only must be a list of probe names, e.g. [patching]")
        for name in self.first_seed_only:
            get_probe(str(name))  # unknown: ConfigError naming the known probes

    # -- what the runner reads -----------------------------------------------------------------------------------------
    def train_config(self, role: str, seed: int, student: str | None = None) -> Any:
        """The `TrainConfig` of run ``role`` for training seed ``seed`` (``student``: the resolved checkpoint); a
        checkpoint run has none (`checkpoints`)."""
        if role in self.checkpoints():
            raise ConfigError(f"{self.source}: runs.{role} is a checkpoint run; it has no training config")
        return self._config(role, seed, student)

    def first_config(self, seed: int, student: str | None = None) -> Any:
        """The first trained run's `TrainConfig` (the study's schedule, its organism's directory); with every run a
        checkpoint, the shared ``train`` fields' alone."""
        return self._config(self.trained[0] if self.trained else None, seed, student)

    @property
    def trained(self) -> list[str]:
        """The roles `mechopd run` trains (every run but the checkpoint runs), in the file's order."""
        return [role for role, over in self.runs.items() if CHECKPOINT not in over]

    def checkpoints(self) -> dict[str, str]:
        """role -> the checkpoint directory (absolute) of every checkpoint run: evaluated and probed, not trained."""
        return {
            role: str(Path(over[CHECKPOINT]).expanduser().resolve())
            for role, over in self.runs.items()
            if CHECKPOINT in over
        }

    def _config(self, role: str | None, seed: int, student: str | None) -> Any:
        from mechopd.organisms.recipes import resolve_train_data

        data: dict[str, Any] = {
            **self.train,
            **(self.runs[role] if role is not None else {}),
            "task": self.task,
            "task_options": dict(self.task_options),
            "student": self.student,
            "teacher": self.teacher,
            "seed": seed,
            **{k: self.render[k] for k in ("no_context_system", "chat_template_kwargs") if k in self.render},
        }
        data = resolve_train_data(data)  # an organism student: its recipe under what the file sets
        if "save_every" not in data:  # resumable at half its steps; that checkpoint goes once final/ is written
            data["save_every"] = -(-int(data.get("steps", TrainConfig.steps)) // 2)
            data.setdefault("keep_checkpoints", False)
        if student is not None:
            data["student"] = student
        where = "train" if role is None else f"runs.{role}"
        try:
            return build_config(TrainConfig, data, source=f"{self.source}: {where}")
        except ConfigError as e:
            msg = str(e)
            raise ConfigError(msg if msg.startswith(self.source) else f"{self.source}: {where}: {msg}") from None

    def methods(self) -> dict[str, dict[str, Any]]:
        """role -> the run's training fields (shared ``train`` under its own), a checkpoint run's ``{checkpoint:
        DIR}`` (absolute): the manifest's ``runs``."""
        given = self.checkpoints()
        return {
            role: {CHECKPOINT: given[role]} if role in given else {**self.train, **over}
            for role, over in self.runs.items()
        }

    @property
    def eval_n(self) -> int:
        return int(self.eval.get("n", EvalConfig.n))

    @property
    def other_contexts(self) -> bool:
        return bool(self.eval.get("other_contexts", True))

    def eval_fields(self) -> dict[str, Any]:
        return {k: v for k, v in self.eval.items() if k not in ("n", "other_contexts")}

    def render_fields(self) -> dict[str, Any]:
        return dict(self.render)

    def probe_plan_of(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(setup fields, the probe's own options) of a listed probe."""
        given = dict(self.probes.get(name) or {})
        return (
            {k: v for k, v in given.items() if k in PROBE_SETUP_KEYS},
            {k: v for k, v in given.items() if k not in PROBE_SETUP_KEYS},
        )

    def probe_plan(self) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        return {str(name): self.probe_plan_of(name) for name in self.probes}

    def to_mapping(self) -> dict[str, Any]:
        """The study as a mapping of its file's keys (recorded in the output; compared by a rerun)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}

    # -- reading ---------------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, study: str | os.PathLike | Mapping[str, Any], source: str | None = None) -> StudySpec:
        """A study file's path or its parsed mapping (``source``: the file it was read from, for the messages);
        unknown or missing keys refused, naming the known ones."""
        if isinstance(study, Mapping):
            doc, where = dict(study), source or "study"
        else:
            doc, where = load_yaml(os.fspath(study)), str(study)
            if isinstance(doc, dict):
                doc = anchor_paths(doc, Path(study).absolute().parent)
        known = [f.name for f in fields(cls) if f.name != "source"]
        unknown = sorted(set(doc) - set(known))
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; a study has {', '.join(known)}")
        missing = [k for k in ("task", "student", "runs") if k not in doc]
        if missing:
            raise ConfigError(
                f"{where}: needs {missing[0]!r} (e.g. task: jsonl, student: PATH, runs: {{opd: {{method: opd}}}})"
            )
        return cls(**doc, source=where)


FILE_OPTIONS = ("path", "context_file", "other_context_file", "pool")  # task options that name a file (facts: pool)


def anchor_paths(doc: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A study file's relative paths made absolute against its ``folder`` (module docstring); the rest unchanged."""

    def here(value: Any) -> Any:
        if not isinstance(value, str) or not value.strip() or Path(value).expanduser().is_absolute():
            return value
        return os.path.normpath(folder / value) if not value.startswith("~") else value

    doc = dict(doc)
    if isinstance(doc.get("task_options"), Mapping):
        doc["task_options"] = {k: here(v) if k in FILE_OPTIONS else v for k, v in doc["task_options"].items()}
    for key in ("student", "teacher"):
        value = doc.get(key)  # organism:<task>, model:NAME and hub ids stay as written
        if isinstance(value, str) and ":" not in value and (value.startswith(".") or (folder / value).exists()):
            doc[key] = here(value)
    if isinstance(doc.get("runs"), Mapping):
        doc["runs"] = {
            role: {**entry, CHECKPOINT: here(entry[CHECKPOINT])}
            if isinstance(entry, Mapping) and CHECKPOINT in entry
            else entry
            for role, entry in doc["runs"].items()
        }
    return doc


def _role_names(value: Any) -> list[str]:
    """A role option's value as the roles it names (a list, or comma-separated text; None: none)."""
    if value is None:
        return []
    return [str(r).strip() for r in (value if isinstance(value, (list, tuple)) else str(value).split(","))]


@dataclass(frozen=True)
class _Roles:
    """The study's roles as `probes.registry.demo_options` reads them (role = run name in a study file)."""

    roles: frozenset[str] | set[str]

    def name(self, role: str) -> str | None:
        return role if role in self.roles else None


@dataclass(frozen=True)
class _Demo:
    demo: dict[str, Any]
    role_options: tuple[str, ...]


STUDIES_DIR = Path(__file__).parent.parent / "data" / "studies"  # the built-in studies, one per organism task


def builtin_study(task: str) -> StudySpec:
    """The built-in study of an organism task (``mechopd/data/studies/<task>.yaml``): what `mechopd demo` runs
    (read and checked once per process; each call returns its own copy)."""
    return copy.deepcopy(_load_builtin(task))


@functools.cache
def _load_builtin(task: str) -> StudySpec:
    path = STUDIES_DIR / f"{task}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in STUDIES_DIR.glob("*.yaml"))
        raise ConfigError(f"no built-in study for task {task!r}; choose one of {', '.join(known)}")
    return StudySpec.load(path)


def default_out(study: str | os.PathLike) -> Path:
    """Where a study file's run goes by default: its folder / its stem (``studies/qwen.yaml`` -> ``studies/qwen``)."""
    p = Path(study)
    return p.parent / p.stem
