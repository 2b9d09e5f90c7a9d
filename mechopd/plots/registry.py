"""The figure registry: a new figure is one file, ``register_figure(...)`` at the end of its plot module.

A figure is ``plot(run_dir, out_dir) -> list[Path]`` (writes ``<out_dir>/<name>.png`` and ``.pdf``; [] when its
artifact is absent) with a name (file stem), a title and a caption (``report.md``). Report order: the run's figures
(group "run"), the probes' (group "probe"), then the rest (group "tail"); inside a group by ``order``, then by
registration. The registry imports no plot module by name: the first `figures` call imports every module of the
``mechopd.plots`` package (`_discover`); a plot module calls the registry only in its last statements, so no import
cycle arises. Third-party figures: call `register_figure` in your module and import it before drawing.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from mechopd.core.errors import ConfigError

Plot = Callable[[Any, Path], list[Path]] | str
GROUPS = ("run", "probe", "tail")


class FigureInfo(NamedTuple):
    """One figure of the set: ``name`` (file stem: ``figures/<name>.png``), ``title``, ``caption`` (what is drawn)."""

    name: str
    title: str
    caption: str


class _Entry(NamedTuple):
    info: FigureInfo
    plot: Plot
    group: str
    order: float


_REGISTRY: dict[str, _Entry] = {}
_loaded = False


def register_figure(
    name: str,
    title: str,
    caption: str,
    plot: Plot,
    *,
    group: str = "tail",
    order: float = 1000.0,
    replace: bool = False,
) -> FigureInfo:
    """Add a figure to `mechopd.plots.draw_all`, `figure_index` and ``report.md``: ``plot(run_dir, out_dir)`` (or
    ``"module:function"``). ``group``: run | probe | tail; ``order``: its place inside the group. A taken name
    raises unless ``replace``."""
    if group not in GROUPS:
        raise ConfigError(f"figure {name!r}: group {group!r} is unknown; use one of {', '.join(GROUPS)}")
    if not replace and name in _REGISTRY and _REGISTRY[name].plot is not plot:
        raise ConfigError(f"figure {name!r} is already registered; pick another name or pass replace=True")
    info = FigureInfo(name, title, caption)
    _REGISTRY[name] = _Entry(info, plot, group, order)
    return info


def unregister_figure(name: str) -> None:
    _REGISTRY.pop(name, None)


def _discover() -> None:
    """Import every module of the ``mechopd.plots`` package once (each registers its figures at its end)."""
    global _loaded
    if _loaded:
        return
    _loaded = True

    package = __name__.rpartition(".")[0]  # mechopd.plots, by its directory
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        importlib.import_module(f"{package}.{info.name}")


def _resolve(plot: Plot) -> Callable[..., list[Path]]:
    if callable(plot):
        return plot
    module, _, name = plot.partition(":")
    return getattr(importlib.import_module(module), name)


def figures() -> list[tuple[FigureInfo, Callable[..., list[Path]]]]:
    """Every registered figure with its plot function, in report order."""
    _discover()
    entries = sorted(_REGISTRY.values(), key=lambda e: (GROUPS.index(e.group), e.order))
    return [(e.info, _resolve(e.plot)) for e in entries]
