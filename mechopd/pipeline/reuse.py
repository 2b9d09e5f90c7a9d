"""What a rerun of `mechopd run` may reuse of the run already in ``--out`` (`run.check_out` asks, `run._run` applies).

``--out`` holds only what the study made. Before any job:

- a directory that holds anything but this study's record (``study_run.yaml``, and ``study_inputs.json`` written
  before it) is refused: a user's own ``mechopd train`` run at ``train/opd`` is never replaced or reused;
- a study record whose inputs record is gone is "unknown inputs", refused, never "done";
- every trained run already there (``<seed run>/train/<role>/config.yaml``, never a link out of the run) must
  record, field by field, the config the study asks for (its paths are compared by content, in ``study_inputs.json``); the first fields that differ are
  named;
- the study's keys split in two: the TRAINING keys (task, task_options, student, teacher, render, seeds, train, runs:
  the inputs record, by content, holds only these) and the DOWNSTREAM keys (`DOWNSTREAM`: eval, probes, probe_n,
  first_seed_only). A rerun that changes only downstream keys reuses every trained model and reruns what depends on
  the change (`Stale`): a changed ``eval`` every evaluation and every probe that picks its items from them
  (``select``); a changed probe entry (or ``probe_n``, for the probes
  that take it) that probe; the figures, the report and the aggregate always. A probe removed from the study is
  refused (its tables would stay in the report).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mechopd.config import DATE_PIN
from mechopd.core.errors import ConfigError
from mechopd.core.runcheck import check_no_escape
from mechopd.core.runlock import LOCK_NAME

DOWNSTREAM = ("eval", "probes", "probe_n", "first_seed_only")  # keys whose change reuses every trained model


@dataclass(frozen=True)
class Stale:
    """What a rerun over a finished study redoes beyond the figures, reports and aggregate (always redone)."""

    evaluations: bool = False  # every model's evaluation (``eval`` changed)
    probes: tuple[str, ...] = field(default_factory=tuple)  # the probes whose options changed

    def __bool__(self) -> bool:
        return self.evaluations or bool(self.probes)

    def describe(self) -> str:
        parts = (["every evaluation"] if self.evaluations else []) + [f"probe {p}" for p in self.probes]
        return ", ".join(parts)


def check_foreign(out: Path, spec_file: str, own: tuple[str, ...] = ()) -> None:
    """``out`` is absent, empty (its lock and the records ``own`` aside: a study killed before its ``spec_file``) or
    holds ``spec_file``: anything else is a directory the study did not write, refused with what it holds (nothing is
    changed)."""
    if not out.is_dir() or (out / spec_file).is_file():
        return
    held = sorted(p.name for p in out.iterdir() if p.name not in (LOCK_NAME, *own))
    if held:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise ConfigError(
            f"--out {out} holds {shown} but no {spec_file}: no run of this study wrote it, and a study never "
            "replaces or reuses what it did not make; pass an empty or new --out (nothing was changed)"
        )


def check_inputs_recorded(out: Path, spec_file: str, inputs_file: str) -> None:
    """A study record without its inputs record: what its results were made from is unknown (refused, not 'done')."""
    if (out / spec_file).is_file() and not (out / inputs_file).is_file():
        raise ConfigError(
            f"--out {out} holds a study run but not its {inputs_file}: the models and data its results were "
            "made from are unknown, so none of them is reused; pass another --out (nothing was changed)"
        )


def stale_after(out: Path, old: Mapping[str, Any], new: Mapping[str, Any]) -> Stale | None:
    """What a rerun redoes when the recorded study ``old`` becomes ``new`` (both `StudySpec.to_mapping`, normalised);
    None when a training key differs (the caller refuses); a removed probe is refused here."""
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if [k for k in diff if k not in DOWNSTREAM]:
        return None
    old_probes, new_probes = old.get("probes") or {}, new.get("probes") or {}
    gone = sorted(set(old_probes) - set(new_probes))
    if gone:
        raise ConfigError(
            f"--out {out}: the study no longer lists probes.{gone[0]}, whose tables the finished run holds (its "
            "report would keep reading them); list it again, or pass another --out (nothing was changed)"
        )
    probe_n_changed = old.get("probe_n") != new.get("probe_n")
    changed = [
        name
        for name, opts in new_probes.items()
        if name in old_probes
        and (old_probes[name] != opts or (probe_n_changed and "n" not in (opts or {})))  # probe_n: its default n
    ]
    evaluations = old.get("eval") != new.get("eval")
    if evaluations:  # a probe whose items were picked from the evaluations (`select`) picks again
        changed += [n for n, opts in new_probes.items() if isinstance(opts, Mapping) and opts.get("select")]
    return Stale(evaluations=evaluations, probes=tuple(sorted(set(changed))))


def clear_stale(seed_dirs: Iterable[Path], stale: Stale) -> None:
    """Mark what ``stale`` names as not done in every seed run: the file-set record of each evaluation and of each
    named probe goes (`core.artifacts.FileSet`; the stages then run again and replace their files atomically)."""
    from mechopd.core.artifacts import FileSet

    for run in seed_dirs:
        records = list((run / "eval").glob(".*.fileset")) if stale.evaluations else []
        records += [FileSet.manifest_path(run / "probes", name) for name in stale.probes]
        for record in records:
            record.unlink(missing_ok=True)


def check_trained_configs(spec: Any, seed_dirs: Mapping[int, Path]) -> None:
    """Every training run already in the seed runs (``train/<role>/config.yaml``) records the config the study asks
    for, field by field (paths aside: ``study_inputs.json`` compares them by content); else one line naming the
    fields that differ."""
    for seed, run in seed_dirs.items():
        for role in spec.trained:
            check_no_escape(run, run / "train" / role)  # a link out of the run (a user's run linked in): refused now
            recorded = run / "train" / role / "config.yaml"
            if not recorded.is_file():
                continue
            diff = config_fields_differ(_read_config(recorded), spec.train_config(role, seed).to_dict())
            if diff:
                raise ConfigError(
                    f"{recorded} records another config than the study's runs.{role} ({'; '.join(diff[:3])}"
                    f"{'; ...' if len(diff) > 3 else ''}): it would be reused as this study's run; restore the "
                    "study's values or pass another --out (nothing was changed)"
                )


def _read_config(path: Path) -> dict[str, Any]:

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(
            f"{path} is unreadable ({type(e).__name__}); pass another --out (nothing was changed)"
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} is not a config mapping; pass another --out (nothing was changed)")
    return doc


def config_fields_differ(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"field: old -> new"`` for each field of two training configs that differs; path fields (student, teacher,
    organism_dir, a task option naming a file) are the inputs record's, compared by content, not here. The
    chat-template variables compare after training's pins: a recorded ``date_string`` the wanted config does not set
    is the date training pinned (`config.adopt_pins`), and flags read as `views.template_flags` reads them."""
    from mechopd.core.views import template_flags
    from mechopd.train.rundir import DATA_OPTIONS, PATH_KEYS

    def norm(doc: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in doc.items() if k not in PATH_KEYS}
        if isinstance(out.get("chat_template_kwargs"), Mapping):
            out["chat_template_kwargs"] = template_flags(dict(out["chat_template_kwargs"]))
        opts = out.get("task_options")
        if isinstance(opts, Mapping):
            out["task_options"] = {k: v for k, v in opts.items() if k not in DATA_OPTIONS}
        return json.loads(json.dumps(out, sort_keys=True, default=str))

    old, new = dict(old), dict(new)
    pins, wanted = old.get("chat_template_kwargs"), new.get("chat_template_kwargs")
    if isinstance(pins, Mapping) and isinstance(wanted, Mapping) and DATE_PIN in pins and DATE_PIN not in wanted:
        new["chat_template_kwargs"] = {**wanted, DATE_PIN: pins[DATE_PIN]}  # training's pin (`adopt_pins`, as resume)
    a, b = norm(old), norm(new)
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
