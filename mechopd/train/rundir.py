"""A training run's directory: its files, what state a previous run left it in, the metrics log.

States of ``--out`` at start (decided by `prepare`, rank 0 writes, every rank reads):
  empty / absent                        a new run
  config.yaml, no complete checkpoint,  an earlier run stopped before its first complete checkpoint: it is
  no final                              restartable (with or without --resume); its metrics are dropped
  a complete checkpoints/step-N         resumable with --resume (the config must equal config.yaml except for
                                        ``config.RESUME_MUTABLE``); refused without it
  anything else                         refused (nothing is overwritten)
Interrupted checkpoint writes leave dot-prefixed temp directories (``.step-N.tmp-*``); they are removed at start.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mechopd.config import RESUME_MUTABLE, TrainConfig, config_diff
from mechopd.errors import ConfigError, TrainingError
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
            stale += [p for p in parent.iterdir() if p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name)]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def unfinished(run: RunDir) -> bool:
    """True for a run that stopped before its first complete checkpoint (restartable from step 0)."""
    root = run.root
    if not run.config.exists() or run.final.exists() or latest_checkpoint(root) is not None:
        return False
    return all(p.name in RUN_FILES for p in root.iterdir())


def prepare(run: RunDir, cfg: TrainConfig, resume: bool, is_writer: bool) -> tuple[bool, str | None]:
    """Check ``--out`` against ``resume``; returns ``(resume_from_checkpoint, note for the log)``.

    Raises ``TrainingError`` for a run that must not be touched and ``ConfigError`` for a resume with a changed config.
    Only stale temp directories are removed here; an unfinished run's files are cleared by `clear_unfinished` once
    the new run has loaded its models (a run refused on the way loses nothing).
    """
    root = run.root
    if is_writer:
        remove_stale_temps(root)
    has_files = root.is_dir() and any(root.iterdir())
    if not has_files:
        if resume:
            raise TrainingError(f"--resume: {root} holds no run; start a new run without --resume")
        return False, None
    if unfinished(run):
        return False, (f"{root} holds a run that stopped before its first complete checkpoint; restarting it from "
                       "step 0 (its metrics were dropped)")
    if not resume:
        raise TrainingError(f"--out {root} already holds a run; pass --resume to continue it or choose another "
                            "--out (nothing was overwritten)")
    if latest_checkpoint(root) is None:
        raise TrainingError(f"--resume: {root} has no complete checkpoint (checkpoints/step-N); start a new run "
                            "or set save_every")
    check_same_config(run, cfg)
    return True, None


def clear_unfinished(run: RunDir) -> None:
    """Drop the files of a run that stopped before its first checkpoint (its config.yaml is rewritten next)."""
    if unfinished(run):
        for name in ("metrics.jsonl", "checkpoints", "tensorboard"):
            p = run.root / name
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)


def check_same_config(run: RunDir, cfg: TrainConfig) -> None:
    """Refuse a resume whose config differs from the run's config.yaml outside ``RESUME_MUTABLE``."""
    if not run.config.exists():
        return
    old = {**TrainConfig(student=cfg.student).to_dict(), **(yaml.safe_load(run.config.read_text()) or {})}
    mutable = RESUME_MUTABLE if cfg.lr_schedule == "constant" else tuple(k for k in RESUME_MUTABLE if k != "steps")
    diff = config_diff(old, cfg.to_dict(), mutable)  # a decaying lr is laid out over `steps`: it cannot grow
    if diff:
        raise ConfigError(f"--resume {run.root}: the config differs from the run's config.yaml in {'; '.join(diff)}; "
                          f"only {', '.join(mutable)} may change on resume — start a new --out instead")


def truncate_metrics(path: Path, step: int) -> str | None:
    """On resume: keep the metric lines up to ``step``; a truncated LAST line (a killed write) is dropped.

    Returns a note when a line was dropped; a malformed line before the last raises ``TrainingError``.
    """
    if not path.exists():
        return None
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    keep, note = [], None
    for i, ln in enumerate(lines):
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                note = f"{path}: dropped a truncated last line (an interrupted write)"
                continue
            raise TrainingError(f"{path} line {i + 1} is not JSON; repair or delete the line, then --resume") from None
        if rec.get("step", 0) <= step:
            keep.append(ln)
    path.write_text("".join(ln + "\n" for ln in keep))
    return note


class Logger:
    """metrics.jsonl always; TensorBoard only when asked. Same signature either way (the loop never branches)."""

    def __init__(self, path: Path, enabled: bool, tensorboard: bool):
        self.path, self.enabled, self.tb = path, enabled, None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("log_tensorboard=true needs the tensorboard package: pip install tensorboard") from None
            self.tb = SummaryWriter(str(path.parent / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, record["step"])
