"""A training run's directory: its files, what state a previous run left it in, the metrics log.

States of ``--out`` at start (decided by `prepare`, rank 0 writes, every rank reads):
  empty / absent                        a new run (with --resume too: a note says a new run starts)
  config.yaml, no complete checkpoint,  an earlier run stopped before its first complete checkpoint: it is
  no final                              restartable (with or without --resume); its metrics are dropped
  a complete checkpoints/step-N         resumable with --resume (the config must equal config.yaml except for
                                        ``config.RESUME_MUTABLE``); refused without it
  anything else                         refused (nothing is overwritten)
Interrupted checkpoint writes leave dot-prefixed temp directories (``.step-N.tmp-*``); they are removed at start.
The run's lock file (`runlock.LOCK_NAME`) is not a run file: it never makes a directory "hold a run".

Paths (`record_paths`): config.yaml records ``organism_dir``, a local ``student`` / ``teacher`` and a task's data
file absolute; on ``--resume`` a RELATIVE value on the command line that names another place than the run recorded
is read as the run's (the run's paths are relative to the run, never to the current directory; a note says so), so
a resume from any directory trains on the same models. A different absolute value is a config change (refused).
A resume replaces ``final/`` but keeps every file in it that the save did not write (an evaluation report, notes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mechopd.config import RESUME_MUTABLE, TrainConfig, config_diff
from mechopd.core.errors import ConfigError, TrainingError
from mechopd.core.runcheck import check_item_count, check_no_escape, check_out_place
from mechopd.core.runlock import LOCK_NAME, hold
from mechopd.train.checkpoint import latest_checkpoint

RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "tensorboard")


@dataclass
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def final(self) -> Path:
        return self.root / "final"


def remove_stale_temps(root: Path) -> list[Path]:
    """Delete temp/old directories an interrupted atomic save left (``.X.tmp-*``, ``.X.old-*``); returns them."""
    stale = []
    for parent in (root, root / "checkpoints"):
        if parent.is_dir():
            stale += [
                p for p in parent.iterdir() if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name)
            ]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    return stale


def unfinished(run: RunDir) -> bool:
    """True for a run that stopped before its first complete checkpoint (restartable from step 0)."""
    root = run.root
    if not run.config.exists() or run.final.exists() or latest_checkpoint(root) is not None:
        return False
    return all(p.name in RUN_FILES for p in _entries(root))


def _entries(root: Path) -> list[Path]:
    """What `root` holds, without the lock file."""
    return [p for p in root.iterdir() if p.name != LOCK_NAME] if root.is_dir() else []


def prepare(run: RunDir, cfg: TrainConfig, resume: bool, is_writer: bool) -> tuple[bool, str | None]:
    """Check ``--out`` against ``resume``; returns ``(resume_from_checkpoint, note for the log)``.

    Raises ``TrainingError`` for a run that must not be touched and ``ConfigError`` for a resume with a changed config.
    Only stale temp directories are removed here; an unfinished run's files are cleared by `clear_unfinished` once
    the new run has loaded its models (a run refused on the way loses nothing).
    """
    root = run.root
    for name in (*RUN_FILES, "final"):  # nothing is written or deleted through a link out of the run
        check_no_escape(root, root / name)
    if is_writer:
        remove_stale_temps(root)
    has_files = bool(_entries(root))
    if not has_files:  # --resume on a new directory starts the run (so one command line starts and continues it)
        return False, (f"--resume: {root} holds no run yet; starting a new run" if resume else None)
    if unfinished(run):
        return False, (
            f"{root} holds a run that stopped before its first complete checkpoint; restarting it from "
            "step 0 (its metrics were dropped)"
        )
    if not resume:
        raise TrainingError(
            f"--out {root} already holds a run; pass --resume to continue it or choose another "
            "--out (nothing was overwritten)"
        )
    if latest_checkpoint(root) is None:
        raise TrainingError(_no_checkpoint(run))
    check_same_config(run, cfg)
    read_metrics(run.metrics)  # an edited metrics.jsonl is refused before any model loads
    return True, None


def _no_checkpoint(run: RunDir) -> str:
    """Why a run without a complete checkpoint cannot be resumed, and what to do instead."""
    info = run.final / "training.json"
    try:
        step = json.loads(info.read_text()).get("step") if info.is_file() else None
    except (OSError, ValueError):
        step = None
    if step is not None:
        return (
            f"--resume: {run.root} finished at step {step} (its model is {run.final}) and kept no checkpoint to "
            "continue from (save_every was 0, or keep_checkpoints false); to train further, start a new --out from that model (--set "
            f"student={run.final}), and set save_every (e.g. --set save_every=50) to make a run resumable"
        )
    return (
        f"--resume: {run.root} has no complete checkpoint (checkpoints/step-N) and no final model; start a new "
        "--out, with save_every set (e.g. --set save_every=50) to make the run resumable"
    )


def clear_unfinished(run: RunDir) -> None:
    """Drop the files of a run that stopped before its first checkpoint (its config.yaml is rewritten next)."""
    if unfinished(run):
        for name in ("metrics.jsonl", "checkpoints", "tensorboard"):
            remove_own(run.root / name)


def remove_own(p: Path) -> None:
    """Delete a file or directory the run wrote; a symbolic link goes, never what it points to."""
    if p.is_symlink() or not p.is_dir():
        p.unlink(missing_ok=True)
    else:
        shutil.rmtree(p)


def check_same_config(run: RunDir, cfg: TrainConfig) -> None:
    """Refuse a resume whose config differs from the run's config.yaml outside ``RESUME_MUTABLE``."""
    if not run.config.exists():
        return
    old = {**TrainConfig(student=cfg.student).to_dict(), **read_run_config(run)}
    mutable = RESUME_MUTABLE if cfg.lr_schedule == "constant" else tuple(k for k in RESUME_MUTABLE if k != "steps")
    diff = config_diff(old, cfg.to_dict(), mutable)  # a decaying lr is laid out over `steps`: it cannot grow
    if diff:
        raise ConfigError(
            f"--resume {run.root}: the config differs from the run's config.yaml in {'; '.join(diff)}; "
            f"only {', '.join(mutable)} may change on resume — start a new --out instead"
        )


def truncate_metrics(path: Path, step: int) -> str | None:
    """On resume: keep the metric lines up to ``step``; a truncated LAST line (a killed write) is dropped.

    Returns a note when a line was dropped; a malformed line before the last raises ``TrainingError``.
    """
    if not path.exists():
        return None
    records, note = read_metrics(path)
    keep = [ln for ln, rec in records if rec.get("step", 0) <= step]
    atomic_text(path, "".join(ln + "\n" for ln in keep))  # a kill or a full disk mid-rewrite loses no line
    return note


def read_metrics(path: Path) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
    """(line, record) of every metrics line and a note for a dropped truncated last line; `TrainingError` for a
    malformed line before the last or a line that is not a metrics record (read before anything is loaded)."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.is_file() else []
    records, note = [], None
    for i, ln in enumerate(lines):
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                note = f"{path}: dropped a truncated last line (an interrupted write)"
                continue
            raise TrainingError(f"{path} line {i + 1} is not JSON; repair or delete the line, then --resume") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("step", 0), int):
            raise TrainingError(
                f"{path} line {i + 1} is not a metrics record ({ln[:40]!r}); repair or delete the line, then --resume"
            )
        records.append((ln, rec))
    return records, note


def read_run_config(run: RunDir) -> dict[str, Any]:
    """The run's config.yaml as a mapping; an unreadable or non-mapping file is one `TrainingError`."""
    try:
        data = yaml.safe_load(run.config.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise TrainingError(
            f"{run.config} is unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "restore it (checkpoints/step-N/trainer_state.json holds the run's config) or start a "
            "new --out"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TrainingError(
            f"{run.config} holds a {type(data).__name__}, not the run's config mapping; restore it "
            "(checkpoints/step-N/trainer_state.json holds the run's config) or start a new --out"
        )
    return data


PATH_KEYS = ("organism_dir", "student", "teacher")
DATA_OPTIONS = ("path", "context_file", "other_context_file", "file", "pool")  # task_options that name a file


def _local(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and not value.startswith("organism:") and Path(value).exists()


def record_paths(cfg: TrainConfig, run: RunDir, resume: bool) -> tuple[TrainConfig, str | None]:
    """`cfg` with its local paths absolute (see the module docstring); on resume, relative values read as the run's."""
    changes: dict[str, Any] = {"organism_dir": str(Path(cfg.organism_dir).resolve())}
    changes.update({k: str(Path(getattr(cfg, k)).resolve()) for k in ("student", "teacher") if _local(getattr(cfg, k))})
    opts = dict(cfg.task_options)
    opts.update({k: str(Path(v).resolve()) for k, v in opts.items() if k in DATA_OPTIONS and _local(v)})
    changes["task_options"] = opts
    notes = []
    if resume and run.config.is_file():
        old = read_run_config(run)
        recorded = old.get("task_options")
        old_opts = recorded if isinstance(recorded, dict) else {}
        pairs = [(k, getattr(cfg, k), old.get(k)) for k in PATH_KEYS] + [
            (f"task_options.{k}", v, old_opts.get(k)) for k, v in cfg.task_options.items() if k in DATA_OPTIONS
        ]
        for key, typed, recorded in pairs:
            if (
                not isinstance(typed, str)
                or not isinstance(recorded, str)
                or Path(typed).is_absolute()
                or typed.startswith("organism:")
                or typed == recorded
            ):
                continue
            mine = str(Path(typed).resolve()) if _local(typed) or key == "organism_dir" else typed
            if mine != recorded:
                notes.append(f"{key} {typed!r} read as the run's {recorded}")
                (opts if key.startswith("task_options.") else changes)[key.split(".")[-1]] = recorded
    note = ("paths are the run's, not the current directory's: " + "; ".join(notes)) if notes else None
    return dataclasses.replace(cfg, **changes), note


def keep_foreign(final: Path):
    """A `models.atomic_save` writer that copies into the new ``final/`` every file of the old one the save did not
    write (an evaluation report, a user's notes): a resume never deletes what it did not write."""

    def writer(tmp: Path) -> None:
        if not final.is_dir():
            return
        for p in final.iterdir():
            if not (tmp / p.name).exists():
                (shutil.copytree if p.is_dir() else shutil.copy2)(p, tmp / p.name)

    return writer


def acquire(run: RunDir, is_writer: bool) -> contextlib.ExitStack:
    """Hold ``run``'s lock (`runlock.hold`; rank 0 only) after checking it is not inside a checkpoint or another
    run; `release` it when the run ends."""
    check_out_place(run.root, "train")
    stack = contextlib.ExitStack()
    if is_writer:
        stack.enter_context(hold(run.root, "train"))
    return stack


def release(stack: contextlib.ExitStack) -> None:
    """Release `acquire`'s lock (inside an ``except`` / ``finally``: a failed run's refusal leaves the dir as it was)."""
    stack.__exit__(*sys.exc_info())


def releasing_on_error(stack: contextlib.ExitStack, fn, *args: Any) -> None:
    """``fn(*args)``; the lock is released if it raises (a refused run holds nothing)."""
    try:
        fn(*args)
    except BaseException:
        release(stack)
        raise


def write_config(cfg: TrainConfig, run: RunDir) -> None:
    """config.yaml, atomically (a full disk leaves the previous one)."""
    atomic_text(run.config, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def atomic_text(path: Path, text: str) -> None:
    """`text` into `path` through a temp file and a rename (permissions from the umask, as a plain write)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_items(task: Any, cfg: TrainConfig) -> None:
    """The training pool and the periodic evaluation fit the task's item space (`Task.max_items`)."""
    check_item_count(task, "train", cfg.pool_size)
    if cfg.eval_every:
        check_item_count(task, "test", cfg.eval_n)
