"""`RunSet`: a run directory read back: the runs of one study by ROLE, and the typed evaluation reports they own.

(Not "study": the study is what a user writes and runs, `mechopd.pipeline.spec.StudySpec`; this package reads the
run directory it produced, or any directory of runs, through a roles file.)

A role says what a run IS in the comparison (``base``: the initial student; ``opd``, ``nca``, ``nca_const``,
``ta_opd``: the demo's methods; any other word a user adds); a run's NAME is where it lives on disk
(``train/<name>/``, ``eval/<name>.json``, the ``model`` column of the probe tables). The report, the claims and the
figures ask the study for a role; they never spell a run's name. Renaming a run changes the study file only.

This is the reading side of a run directory, not an input format: what a study RUNS is the study file of `mechopd run`
(`mechopd.pipeline.spec.StudySpec`, the one schema of the demo's built-in studies, `mechopd run` and the probe
studies), and the run directory's ``demo.json`` and ``study.yaml`` are written from it (a checkpoint run of the study
keeps its directory as ``model``).

A study is read from (`RunSet.load`):

  * a study YAML (``study.yaml``; `mechopd demo` writes one next to ``demo.json``)::

        task: rules
        root: .                 # optional: where eval/, train/, probes/ live (default: the YAML's folder, or the
                                # run dir the study is applied to)
        runs:                   # role -> run: a name, or a mapping with name / label / dir / eval / model
          base: {name: base, model: runs/organisms/rules}
          opd: opd
          nca: my_nca           # the NCA run lives in train/my_nca, eval/my_nca.json, probe rows model=my_nca
          ta_opd: {name: ta_opd, label: "TA-OPD (ρ=0.10)"}

  * else a demo directory's ``demo.json`` (role = name for every listed method);
  * else a plain directory: ``train/*`` (or ``eval/*.json``) names, each its own role.

``demo.json`` (when present under the root) still supplies the config, labels, per-run training overrides,
thresholds and ``seed_runs``; the study YAML overrides the roles. `EvalReport` is the typed ``eval/<name>.json``; a
probe's typed result under ``RunSet.probes_dir`` is read through its registration (`probes.registry.probe_result`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mechopd.core.artifacts import (
    FileSet,
    finite_or_none,
    mean_kept_fraction,
    metric_lines,
    read_json,
    write_csv,
    write_json,
    write_text,
)
from mechopd.core.checks import check_display_label, check_label, inside_root
from mechopd.core.config_parse import load_yaml
from mechopd.core.errors import ConfigError, DataError

BASE = "base"
STUDY_FILE = "study.yaml"
MANIFEST_FILE = "demo.json"
METRICS = ("acc_x", "acc_xc", "harm", "help", "both_correct", "delta_len")


# ------------------------------------------------------------------------------------------------- eval reports
@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval; None where undefined (the report's ``null``)."""

    value: float | None
    low: float | None = None
    high: float | None = None
    n_boot_valid: int = 0

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> Interval:
        if not isinstance(doc, Mapping) or "value" not in doc:
            raise DataError(f"{where} must be an object with 'value', 'low', 'high'; rewrite it with mechopd eval")
        num = lambda v: finite_or_none(v, where)  # noqa: E731  (text / bool refused; NaN, inf, null: n/a)
        return cls(num(doc["value"]), num(doc.get("low")), num(doc.get("high")), int(doc.get("n_boot_valid") or 0))


@dataclass
class EvalSummary:
    """The removability summary (`removability.summarize`): the six metrics with intervals, n, the regime."""

    metrics: dict[str, Interval]
    n: int
    regime: str
    regime_reason: str
    raw: dict[str, Any] = field(default_factory=dict)  # the object as read: every other key kept (thresholds, ...)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "summary") -> EvalSummary:
        if not isinstance(doc, Mapping):
            raise DataError(f"{where} has no 'summary' object; write it with mechopd eval")
        absent = [k for k in (*METRICS, "n", "regime") if k not in doc]
        if absent:
            raise DataError(f"{where} lacks {absent[0]!r}; rewrite it with mechopd eval")
        metrics = {m: Interval.from_dict(doc[m], f"{where}.{m}") for m in METRICS}
        n = doc["n"]
        if isinstance(n, bool) or not isinstance(n, (int, float)) or n != int(n) or n < 0:
            raise DataError(f"{where}.n = {str(n)[:40]!r} is not a count of items; rewrite it with mechopd eval")
        return cls(metrics, int(n), str(doc["regime"]), str(doc.get("regime_reason", "")), dict(doc))

    def value(self, metric: str) -> float | None:
        """The point estimate of ``metric`` (None when undefined, e.g. Harm with no item right without c)."""
        return self.metrics[metric].value

    def to_dict(self) -> dict[str, Any]:
        """The on-disk form (the same keys as `removability.summarize`)."""
        return dict(self.raw)


@dataclass
class EvalReport:
    """``eval/<name>.json``: summary (metrics with intervals), per-item records, settings (model path, n, seed...)."""

    summary: EvalSummary
    records: list[dict[str, Any]]
    settings: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)  # any other top-level key, written back unchanged

    @classmethod
    def from_dict(cls, doc: Any, where: str = "report") -> EvalReport:
        if not isinstance(doc, Mapping):
            raise DataError(f"{where}: expected a JSON object written by mechopd eval")
        extra = {k: v for k, v in doc.items() if k not in ("summary", "records", "settings")}
        records, others = doc.get("records") or [], doc.get("other_contexts") or []
        lists = isinstance(records, list) and isinstance(others, list)
        if not lists or not all(isinstance(x, Mapping) for x in [*records, *others, doc.get("settings") or {}]):
            raise DataError(f"{where}: records, settings or other_contexts is not as mechopd eval writes it; rerun it")
        return cls(
            EvalSummary.from_dict(doc.get("summary"), f"{where}: summary"),
            list(records),
            dict(doc.get("settings") or {}),
            extra,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> EvalReport:
        return cls.from_dict(read_json(path), str(path))

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary.to_dict(), "records": self.records, "settings": self.settings, **self.extra}

    def save(self, path: str | os.PathLike) -> tuple[Path, Path | None]:
        """``path`` (.json) and the records as CSV next to it, as ONE file set (`artifacts.FileSet`: both or none;
        `artifacts`' one non-finite policy)."""
        out = Path(path).with_suffix(".json")
        with FileSet(out.parent, out.stem) as stage:
            write_json(stage.dir / out.name, self.to_dict())
            if self.records:
                write_csv(stage.dir / f"{out.stem}.csv", self.records)
        return out, (out.with_suffix(".csv") if self.records else None)


# ------------------------------------------------------------------------------------------------------- study
@dataclass(frozen=True)
class Run:
    """One run of a study: its role, its name on disk, its display label and where its files are."""

    role: str
    name: str
    label: str
    train_dir: Path
    eval_path: Path
    model: str | None = None  # checkpoint dir (base: the organism; a study's checkpoint run: its directory, demo.json's
    # runs.NAME.checkpoint; else train_dir/final when None)
    settings: Mapping[str, Any] = field(default_factory=dict)  # the demo's training overrides of this run
    label_given: bool = False  # the label comes from the study file or demo.json (not the default)

    @property
    def checkpoint(self) -> str:
        return self.model or str(self.train_dir / "final")


@dataclass
class RunSet:
    """The runs of one comparison by role (module docstring). ``manifest``: ``demo.json`` as read ({} if absent)."""

    root: Path
    task: str
    runs: dict[str, Run]
    manifest: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    # -- roles -----------------------------------------------------------------------------------------------------
    @property
    def roles(self) -> list[str]:
        return list(self.runs)

    @property
    def names(self) -> list[str]:
        """Run names, ``base`` first (the order of the tables and the colours of the figures)."""
        return [r.name for r in self.runs.values()]

    @property
    def methods(self) -> list[str]:
        """Names of the trained runs (every run but the base)."""
        return [r.name for r in self.runs.values() if r.role != BASE]

    def run(self, role: str) -> Run | None:
        return self.runs.get(role)

    def name(self, role: str) -> str | None:
        """The run name of ``role`` (None when the study has no such role)."""
        r = self.runs.get(role)
        return None if r is None else r.name

    def label(self, name_or_role: str) -> str:
        """Display label of a run (by name or by role)."""
        r = self.runs.get(name_or_role) or next((r for r in self.runs.values() if r.name == name_or_role), None)
        return r.label if r is not None else name_or_role

    @property
    def labels(self) -> dict[str, str]:
        """name -> label of every run."""
        return {r.name: r.label for r in self.runs.values()}

    @property
    def given_labels(self) -> dict[str, str]:
        """name -> label where the study file or demo.json gives one (the figures have their own default)."""
        return {r.name: r.label for r in self.runs.values() if r.label_given}

    # -- artifacts ---------------------------------------------------------------------------------------------------
    @property
    def probes_dir(self) -> Path:
        return self.root / "probes"

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.manifest.get("config") or {})

    @property
    def thresholds(self) -> dict[str, float] | None:
        th = self.manifest.get("thresholds")
        if th is not None and not isinstance(th, Mapping):
            raise DataError(
                f"{self.root / MANIFEST_FILE}: 'thresholds' must be an object (drop_min, harm_high, gain_min)"
            )
        return None if th is None else dict(th)

    @property
    def seed_runs(self) -> list[Path]:
        return [Path(p) for p in self.manifest.get("seed_runs") or []]

    def eval(self, role: str) -> EvalReport | None:
        """The evaluation report of ``role`` (None when the study lacks the role or the report is absent)."""
        r = self.runs.get(role)
        return EvalReport.load(r.eval_path) if r is not None and r.eval_path.is_file() else None

    def value(self, role: str, metric: str) -> float | None:
        """A removability point estimate of ``role`` (None when absent or undefined)."""
        rep = self.eval(role)
        return None if rep is None else rep.summary.value(metric)

    def metrics(self, role: str) -> list[dict[str, Any]]:
        """The training log (metrics.jsonl lines) of ``role``; [] when absent."""
        r = self.runs.get(role)
        return [] if r is None else metric_lines(r.train_dir / "metrics.jsonl")

    def kept_fraction(self, role: str) -> float | None:
        """Mean of ``kept_fraction`` over the training steps of ``role`` (None if never logged)."""
        r = self.runs.get(role)
        return None if r is None else mean_kept_fraction(r.train_dir)

    # -- reading / writing ---------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike, study: str | os.PathLike | Mapping[str, Any] | None = None) -> RunSet:
        """The study of a run dir or a study YAML (module docstring). ``study``: a YAML file (or its parsed
        mapping) applied to the run dir ``path`` (its ``root`` key is ignored then)."""
        p = Path(path)
        if study is None and p.is_file():
            return cls.from_yaml(p)
        if not p.is_dir():
            raise ConfigError(
                f"{p} is neither a run directory nor a study YAML; pass a dir written by mechopd demo or a study.yaml"
            )
        if study is not None:
            doc, where = (dict(study), "study") if isinstance(study, Mapping) else (_read_yaml(Path(study)), str(study))
            return cls.from_mapping(doc, root=p, where=where, own_root=False)
        if (p / STUDY_FILE).is_file():
            return cls.from_mapping(_read_yaml(p / STUDY_FILE), root=p, where=str(p / STUDY_FILE))
        return cls.from_manifest(p)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> RunSet:
        path = Path(path)
        return cls.from_mapping(_read_yaml(path), root=path.parent, where=str(path))

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], root: Path, where: str = "study", own_root: bool = True) -> RunSet:
        """A parsed study YAML; ``root``: the YAML's folder (its ``root`` key, relative to it, wins when
        ``own_root``) or the run dir it is applied to."""
        if not isinstance(doc.get("runs"), Mapping) or not doc["runs"]:
            raise ConfigError(
                f"{where}: needs a 'runs' mapping of role -> run name, e.g. runs: {{opd: opd, nca: my_nca}}}}"
            )
        root = inside_root(root, doc.get("root"), where) if own_root else root  # outputs stay in the study's folder
        manifest = _manifest(root)
        runs = {str(role): _run(str(role), spec, root, manifest, where) for role, spec in doc["runs"].items()}
        if BASE not in runs:
            runs = {BASE: _run(BASE, BASE, root, manifest, where), **runs}
        names = [r.name for r in runs.values()]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            roles = ", ".join(r.role for r in runs.values() if r.name == dup)
            raise ConfigError(f"{where}: run {dup!r} plays two roles ({roles}); give each role its own run")
        task = str(doc.get("task") or manifest.get("task") or root.name)
        return cls(root, task, runs, manifest, where)

    @classmethod
    def from_manifest(cls, root: Path) -> RunSet:
        """A demo dir (``demo.json``: role = name of each method) or a plain dir (``train/*``, ``eval/*.json``)."""
        manifest = _manifest(root)
        if manifest:
            names = [str(m) for m in manifest["methods"]]
        else:
            names = sorted(p.name for p in (root / "train").glob("*") if p.is_dir()) or sorted(
                p.stem for p in (root / "eval").glob("*.json") if p.stem != BASE
            )
        runs = {n: _run(n, n, root, manifest, str(root)) for n in [BASE] + [n for n in names if n != BASE]}
        return cls(root, str(manifest.get("task", root.name)), runs, manifest, str(root / MANIFEST_FILE))

    @classmethod
    def of_models(cls, root: str | os.PathLike, task: str, models: Mapping[str, str | os.PathLike]) -> RunSet:
        """A study whose roles are the given model labels (``base`` first), each with its checkpoint dir."""
        root = Path(root)
        runs = {str(k): _run(str(k), {"name": str(k), "model": str(v)}, root, {}, "models") for k, v in models.items()}
        return cls(root, task, {**({BASE: runs.pop(BASE)} if BASE in runs else {}), **runs})

    def to_mapping(self) -> dict[str, Any]:
        """The study YAML's content: task and role -> name (plus a model path where one is set)."""
        runs = {r.role: ({"name": r.name, "model": r.model} if r.model else r.name) for r in self.runs.values()}
        return {"task": self.task, "runs": runs}

    def write(self, path: str | os.PathLike | None = None) -> Path:
        """Write the study YAML (default ``root/study.yaml``), atomically."""
        target = Path(path) if path is not None else self.root / STUDY_FILE
        return write_text(target, yaml.safe_dump(self.to_mapping(), sort_keys=False, allow_unicode=True))

    def __iter__(self) -> Iterator[Run]:
        return iter(self.runs.values())


def runset_root(path: str | os.PathLike) -> Path:
    """Where the study YAML ``path`` puts its runs (its ``root`` key, relative to its folder; else the folder),
    without reading any run."""
    return inside_root(Path(path).parent, _read_yaml(Path(path)).get("root"), str(path))


def runsets(paths: Sequence[str | os.PathLike | RunSet], study: str | os.PathLike | None = None) -> list[RunSet]:
    """Studies of several run dirs (one per seed), the same study file applied to each when given."""
    return [p if isinstance(p, RunSet) else RunSet.load(p, study) for p in paths]


def _read_yaml(path: Path) -> dict[str, Any]:

    if not path.is_file():
        raise ConfigError(f"study file {path} does not exist; pass a study.yaml (see mechopd/runset/__init__.py)")
    return load_yaml(path)  # the one YAML reader: malformed or not a mapping -> ConfigError naming the file


def _manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST_FILE
    if not path.is_file():
        return {}
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("methods"), list):
        raise DataError(f'{path}: expected an object with a \'methods\' list, e.g. {{"methods": ["opd"]}}')
    return doc


def _run(role: str, spec: Any, root: Path, manifest: Mapping[str, Any], where: str) -> Run:

    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name", role), str):
        raise ConfigError(
            f"{where}: runs.{role} must be a run name or a mapping with 'name' (and optionally label, dir, eval, model)"
        )
    unknown = sorted(set(spec) - {"name", "label", "dir", "eval", "model"})
    if unknown:
        raise ConfigError(f"{where}: runs.{role} has unknown key {unknown[0]!r}; use name, label, dir, eval, model")
    name = check_label(str(spec.get("name", role)), f"{where}: runs.{role}")
    labels = manifest.get("labels") or {}
    given = check_display_label(spec.get("label") or labels.get(name), f"{where}: runs.{role}.label")
    settings = dict((manifest.get("runs") or {}).get(name) or {})
    model = spec.get("model") or (manifest.get("organism") if role == BASE else settings.get("checkpoint"))
    return Run(
        role,
        name,
        str(given or name),
        _path(root, spec.get("dir"), Path("train") / name),
        _path(root, spec.get("eval"), Path("eval") / f"{name}.json"),
        None if model is None else str(model),
        settings,
        given is not None,
    )


def _path(root: Path, given: Any, default: Path) -> Path:
    return root / (Path(str(given)) if given else default)
