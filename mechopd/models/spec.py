"""Model specs: what every command that takes a model (``--student``, ``--teacher``, a probe's ``--model``, a
study's ``student``) resolves to a directory or a hub id, in one place.

``organism:<task>``: the embedded organism under an ``organism_dir`` (``<organism_dir>/<task>``); ``model:NAME``: a
fetched pretrained model (`fetch.resolve_fetched`, fetched on first use); anything else: unchanged (a checkpoint
directory or a hub id). Pretraining an organism on demand is the caller's: `organisms.pretrain` sits above this layer,
so a command that may pretrain passes ``make`` (`organisms.pretrain.pretrain_organism`). A run records its specs as
given; `recorded_model` reads them back relative to the run directory, never the current one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mechopd.config.sections import ScaleOptions
from mechopd.core.errors import ModelError
from mechopd.models.fetch import fetched_name, resolve_fetched


def organism_task(spec: str) -> str | None:
    """``"organism:rules"`` -> ``"rules"``; None for any other model spec."""
    return spec.split(":", 1)[1] if isinstance(spec, str) and spec.startswith("organism:") else None


def is_named(spec: str) -> bool:
    """``organism:<task>`` or ``model:NAME``: a model named by mechopd, resolved by `resolve_spec`."""
    return organism_task(spec) is not None or fetched_name(spec) is not None


def resolve_spec(
    spec: str,
    organism_dir: str = ScaleOptions.organism_dir,
    *,
    make: Callable[[str, Path], object] | None = None,
    main: bool = True,
    barrier: Callable[[], None] = lambda: None,
) -> str:
    """``organism:<task>`` -> ``<organism_dir>/<task>``; ``model:NAME`` -> its fetched directory
    (`fetch.resolve_fetched`: fetched on first use); any other spec unchanged. Every command that takes a model spec
    resolves it here.

    make: ``make(task, path)`` builds the organism unless it is cached (`organisms.pretrain.pretrain_organism`), on
    the ``main`` process, then ``barrier()`` so every process waits for it; None: it must exist already (a probe or
    a figure never trains a model).
    """
    if fetched_name(spec) is not None:
        return resolve_fetched(spec, main=main, barrier=barrier)
    task = organism_task(spec)
    if task is None:
        return spec
    path = Path(organism_dir) / task
    if make is not None:
        if main:
            make(task, path)
        barrier()
    elif not (path / "config.json").is_file():
        raise ModelError(f"{spec}: no pretrained organism at {path}; run `mechopd pretrain --task {task}` first")
    return str(path)


# -- paths a run records: absolute, or relative to the RUN directory (never to the current directory) ------------------
def run_path(value: str, run_dir: str | Path, key: str = "organism_dir") -> str:
    """A local directory a run recorded (``organism_dir``, demo.json's ``organism``): absolute as written; relative ->
    against `run_dir`. A relative value that exists only against the current directory (a run written by an older
    mechopd, which recorded paths as typed) is refused, not silently read from wherever the command runs."""
    p = Path(value)
    if p.is_absolute():
        return str(p)
    here = Path(run_dir) / p
    if not here.exists() and p.exists():
        raise ModelError(
            f"{run_dir} records {key} {value!r} relative to the directory it was started from (an older "
            f"mechopd); write the absolute path {p.resolve()} into the run's file, then rerun"
        )
    return str(here.resolve())


def recorded_model(spec: str, organism_dir: str, run_dir: str | Path) -> str:
    """A model spec recorded in a run (``student``, ``teacher``): ``organism:<task>`` under the run's organism_dir,
    ``model:NAME`` as `resolve_spec` reads it, an absolute or run-relative local checkpoint, else a hub id
    unchanged."""
    if is_named(spec):
        return resolve_spec(spec, run_path(organism_dir, run_dir))
    p = Path(spec)
    if p.is_absolute() or (Path(run_dir) / p).exists():
        return run_path(spec, run_dir, "the model")
    if p.exists():
        return run_path(spec, run_dir, "the model")  # refused: a cwd-relative local path
    return spec  # a hub id
