"""Checks on run directories before a command writes: where an output may go, whether inputs are really seeds, a full
disk as one line, item counts within a task's item space. A leaf: it imports only `errors` and the standard library.

- `check_out_place`: an ``--out`` never lies inside a checkpoint (``config.json`` + weights) or inside another training
  run (``config.yaml`` + its checkpoints/metrics), and a demo never writes into a training run or a checkpoint.
- `check_demo_out`: a demo directory that already holds a demo is continued only by the same demo config (seed, task,
  steps, fast, ...); anything else is refused with the keys that differ — the skip-if-done stages must never mix
  seeds. ``--sweep`` may be added to a finished demo (it adds a stage).
- `check_seed_runs` (``aggregate``): the inputs are distinct demo runs of ONE config and task that differ only in
  their training seed (no directory twice, no two copies of one seed, no fast demo next to a full one, no aggregate as
  an input) and ``--out`` is none of them and inside none of them. It runs before ``--out`` is created. A run whose
  demo.json records no config (made by hand) is checked by path only.
- `disk_error`: ENOSPC / EDQUOT as a `DiskFullError` (one line: what was being written and the fix); every writer is
  atomic (temp file or dir, then rename), so the older artifacts are intact and the same command completes once there
  is space again.
- `check_item_count`: a request for more items than a task's item space holds (`Task.max_items`) is refused with the
  size, instead of looping for ever.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mechopd.core.errors import ConfigError, DataError, MechopdError, TaskError

DEMO_FILE = "demo.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
RUN_MARKS = ("metrics.jsonl", "checkpoints", "final")
DEMO_FREE_KEYS = ("out", "sweep", "workers", "full_stages")  # may change between runs of one demo directory
SEED_KEYS = ("out", "seed", "seeds", "sweep", "workers", "full_stages")  # may differ between the seed runs of one study


class DiskFullError(MechopdError):
    """No space left (or the quota is exhausted) while writing an artifact."""


# ------------------------------------------------------------------------------------------------ where outputs go
def is_checkpoint(d: Path) -> bool:
    return (d / "config.json").is_file() and any((d / w).is_file() for w in WEIGHT_FILES)


def is_training_run(d: Path) -> bool:
    return (d / "config.yaml").is_file() and any((d / m).exists() for m in RUN_MARKS)


def real_path(path: str | os.PathLike, flag: str = "--out") -> Path:
    """``path`` resolved; a symbolic link loop on the way is a `ConfigError` naming it (not Python's RuntimeError)."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as e:  # "Symlink loop from ..." (Python < 3.13: RuntimeError; later: OSError ELOOP)
        where = getattr(e, "filename", None) or str(e).rsplit("from ", 1)[-1].strip("'")
        raise ConfigError(
            f"{flag} {path}: {where} is a symbolic link loop; remove the link or pass another path"
        ) from None


def check_no_escape(root: str | os.PathLike, target: str | os.PathLike, flag: str = "--out") -> None:
    """Every existing step from ``root`` down to ``target`` (a path under it) that is a symbolic link resolves inside
    ``root``: mechopd never writes, nor deletes, through a link that leads out of its run (a `ConfigError` otherwise;
    a link loop too)."""
    base = real_path(root, flag)
    p = Path(root)
    for part in Path(target).relative_to(root).parts:
        p = p / part
        if not p.is_symlink():
            if not p.exists():
                return
            continue
        real = real_path(p, flag)
        if real != base and base not in real.parents:
            raise ConfigError(
                f"{flag} {root}: {p} is a symbolic link to {real}, outside the run; mechopd writes only inside its "
                "run: remove the link (nothing was written or deleted) or pass another --out"
            )


def check_out_place(out: str | os.PathLike, verb: str, flag: str = "--out") -> None:
    """Refuse an output directory inside a checkpoint or inside another training run (or, for a demo, that is one)."""
    p = real_path(out, flag)
    for anc in [p, *p.parents]:
        if is_checkpoint(anc) and not (verb == "pretrain" and anc == p):
            raise ConfigError(
                f"{flag} {out} is {'a' if anc == p else 'inside the'} checkpoint {anc}; {verb} writes "
                "into a directory of its own: pass another --out"
            )
        if is_training_run(anc) and (anc != p or verb != "train"):
            raise ConfigError(
                f"{flag} {out} is {'' if anc == p else 'inside '}the training run {anc}; {verb} "
                "writes into a directory of its own: pass another --out"
            )


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DataError(
            f"{path} is unreadable ({getattr(e, 'msg', None) or e}); delete it or pass another --out"
        ) from None
    if not isinstance(doc, dict):
        raise DataError(f"{path} is not a JSON object; delete it or pass another --out")
    return doc


def _diff(old: Mapping[str, Any], new: Mapping[str, Any], free: Sequence[str]) -> list[str]:
    """``"key old -> new"`` for the keys both configs have (a key added by a later mechopd is not a difference)."""
    keys = sorted((set(old) & set(new)) - set(free))
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def _check_one_demo(run: Path, cfg: Mapping[str, Any], aggregate: bool) -> None:
    path = run / DEMO_FILE
    if not path.is_file():
        return
    doc = _read_manifest(path)
    if bool(doc.get("aggregate")) != aggregate:
        what = "the aggregate of a multi-seed demo" if doc.get("aggregate") else "a single-seed demo"
        raise ConfigError(f"--out {run} holds {what} ({path}); pass another --out (nothing was changed)")
    recorded = doc.get("config")
    old = recorded if isinstance(recorded, dict) else {}
    if old and "job_threads" not in old:  # written before the thread counts were pinned (mechopd/pipeline/pool.py)
        raise ConfigError(
            f"--out {run} holds a demo written before mechopd pinned its thread counts (its numbers "
            "depend on the thread count it ran with); pass another --out (nothing was changed)"
        )
    free = SEED_KEYS if aggregate else DEMO_FREE_KEYS
    diff = _diff(old, cfg, free)
    if diff:
        raise ConfigError(
            f"--out {run} holds a demo of another config ({'; '.join(diff)}); its finished stages "
            "would be reused as this one's: pass another --out, or rerun with that demo's flags"
        )


def check_demo_out(cfg: Mapping[str, Any]) -> None:
    """A demo's ``--out`` (and, with ``seeds`` > 1, every ``seed-k``) holds nothing or a demo of the same config."""
    out = Path(cfg["out"])
    check_out_place(out, "demo")
    if int(cfg.get("seeds", 1)) > 1:
        _check_one_demo(out, {**cfg, "seeds": 1, "seed": 0}, aggregate=True)
        for k in range(int(cfg["seeds"])):
            _check_one_demo(out / f"seed-{k}", {**cfg, "out": str(out / f"seed-{k}"), "seed": k, "seeds": 1}, False)
    else:
        _check_one_demo(out, cfg, aggregate=False)


# ------------------------------------------------------------------------------------------------------ aggregate
def check_seed_runs(runs: Sequence[str | os.PathLike], out: str | os.PathLike) -> None:
    """Refuse inputs that are not distinct seeds of one demo config, and an ``--out`` that is (inside) an input."""
    paths = [Path(r) for r in runs]
    real = [p.resolve() for p in paths]
    target = Path(out).resolve()
    for p, r in zip(paths, real):
        if target == r or r in target.parents:
            raise ConfigError(
                f"aggregate --out {out} is {'the input' if target == r else 'inside the input'} {p}; "
                "the aggregate would overwrite its report and figures: pass another --out"
            )
    for i, r in enumerate(real):
        if r in real[:i]:
            raise ConfigError(
                f"aggregate: {paths[real.index(r)]} and {paths[i]} are the same run; pass each seed run once"
            )
    docs = []
    for p in paths:
        if not (p / DEMO_FILE).is_file():
            raise DataError(f"{p} has no demo.json; pass run directories written by `mechopd demo`")
        doc = _read_manifest(p / DEMO_FILE)
        if doc.get("aggregate"):
            raise ConfigError(f"aggregate: {p} is itself an aggregate; pass its seed runs ({p}/seed-k)")
        docs.append(doc)
    _check_same_study(paths, docs)


def _check_same_study(paths: list[Path], docs: list[dict[str, Any]]) -> None:
    first = docs[0].get("config") or {}
    seeds: dict[Any, Path] = {}
    for p, doc in zip(paths, docs):
        cfg = doc.get("config") or {}
        diff = _diff(first, cfg, SEED_KEYS)
        if doc.get("task") != docs[0].get("task") or doc.get("methods") != docs[0].get("methods"):
            diff.insert(
                0,
                f"task/methods {docs[0].get('task')}/{docs[0].get('methods')} -> "
                f"{doc.get('task')}/{doc.get('methods')}",
            )
        if diff:
            raise ConfigError(
                f"aggregate: {paths[0]} and {p} are not seeds of one study ({'; '.join(diff)}); "
                "aggregate runs that differ only in --seed"
            )
        seed = cfg.get("seed")
        if seed is None:  # a run dir not written by `mechopd demo` (hand-made, synthetic): no seed to compare
            continue
        if seed in seeds:
            raise ConfigError(
                f"aggregate: {seeds[seed]} and {p} are both seed {seed} (a copy of one run?); aggregate distinct seeds"
            )
        seeds[seed] = p


# ------------------------------------------------------------------------------------------------------ full disk
def disk_error(err: BaseException) -> MechopdError | None:
    """A `DiskFullError` for ENOSPC / EDQUOT, safetensors' own error type for them included (None for any other
    error)."""
    err = as_disk_error(err)
    if not isinstance(err, OSError) or err.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = f" writing {err.filename}" if err.filename else ""
    what = "no space left on the device" if err.errno == errno.ENOSPC else "disk quota exceeded"
    return DiskFullError(
        f"{what}{where}; the earlier artifacts are intact (every write is atomic): free space, then "
        "rerun the same command (a training run: add --resume)"
    )


def as_disk_error(err: BaseException) -> BaseException:
    """An ENOSPC / EDQUOT `OSError` for a serializer's own error type that says the disk is full (safetensors'
    ``SafetensorError … No space left on device (os error 28)``); `err` itself otherwise."""
    text = str(err)
    for code, words in ((errno.ENOSPC, "No space left on device"), (errno.EDQUOT, "Disk quota exceeded")):
        if not isinstance(err, OSError) and (words in text or f"os error {code})" in text):
            return OSError(code, words)
    return err


# ------------------------------------------------------------------------------------------------------ item space
def check_item_count(task: Any, split: str, n: int) -> None:
    """Refuse ``n`` items of ``split`` when the task's item space (`Task.max_items`) holds fewer."""
    size = task.max_items(split, n) if hasattr(task, "max_items") else None
    if size is not None and n > size:
        raise TaskError(
            f"task {task.name!r} has at most {size} {split} items, asked for {n}; ask for at most {size} "
            "(eval/probe --n, train pool_size / eval_n) or widen the task's item space (--option)"
        )


# ------------------------------------------------------------------------------------------- default report places
def default_eval_report(model: str, task: str) -> Path:
    """Where ``eval --model M`` writes by default: never inside the checkpoint (a resume replaces ``final/``).

    ``RUN/final`` or ``RUN/checkpoints/step-N`` of a training run -> ``RUN/eval/<task>.json`` /
    ``RUN/eval/step-N-<task>.json``; another local checkpoint ``M`` -> ``M-eval/<task>.json`` next to it; a hub id or
    ``organism:<task>`` -> ``runs/eval/<task>.json``.
    """
    if ":" in model or not Path(model).exists():
        return Path("runs/eval") / f"{task}.json"
    ckpt = Path(model.rstrip("/"))
    for run in ckpt.resolve().parents:
        if is_training_run(run):
            check_no_escape(run, run / "eval", "--model")  # the run's eval/ is never a link out of it
            stem = task if ckpt.resolve() == run / "final" else f"{ckpt.name}-{task}"
            return Path(os.path.relpath(run, Path.cwd())) / "eval" / f"{stem}.json"
    return ckpt.with_name(f"{ckpt.name}-eval") / f"{task}.json"
