"""Shared plumbing of the figure set: style, deterministic saving, run metadata, colours and artifact readers.

Non-standard things here:
  * No pyplot. Every figure is a ``matplotlib.figure.Figure`` with an Agg canvas attached explicitly, so importing
    mechopd.plots never switches the user's backend (a notebook keeps its inline backend) and no global figure
    registry grows when many figures are drawn.
  * The seaborn theme (``sns.set_theme(context="paper", style="whitegrid", palette="colorblind")``) is applied inside
    ``matplotlib.rc_context``: the user's rcParams are restored when a figure is done.
  * Deterministic files: PNG without the "Software" (version) chunk and no timestamp, PDF with ``CreationDate=None``,
    SVG with a fixed ``svg.hashsalt``. Redrawing the same artifacts gives byte-identical PNG and PDF files.
  * Units: proportions (accuracy, harm, ...) are drawn in percent.
"""

from __future__ import annotations

import csv
import functools
import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib as mpl
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mechopd.core.artifacts import atomic_write
from mechopd.core.artifacts import read_csv as artifact_csv
from mechopd.core.artifacts import read_json as artifact_json
from mechopd.core.errors import DataError
from mechopd.runset import RunSet

log = logging.getLogger("mechopd.plots")

FORMATS = ("png", "pdf")
DPI = 150
HASHSALT = "mechopd"
BASE = "base"
GREY = 7  # index of the grey in seaborn's "colorblind" palette: reserved for the base model
PNG_METADATA: dict[str, Any] = {"Software": None}  # drops the version chunk; Agg writes no timestamp
PDF_METADATA: dict[str, Any] = {"CreationDate": None, "Creator": "mechopd", "Producer": None}


# ----------------------------------------------------------------------------------------------------------- style
@contextmanager
def style() -> Iterator[None]:
    """Seaborn whitegrid theme, colour-blind palette, fixed SVG hash salt; the caller's rcParams come back after."""
    with mpl.rc_context():
        sns.set_theme(context="paper", style="whitegrid", palette="colorblind")
        mpl.rcParams["svg.hashsalt"] = HASHSALT
        mpl.rcParams["pdf.compression"] = 6
        yield


def styled(build: Callable[..., Figure | None]) -> Callable[..., Figure | None]:
    """Decorator: build a figure inside `style()`, so a ``figure_*`` call looks the same in a notebook as on disk."""

    @functools.wraps(build)
    def wrapper(*args: Any, **kwargs: Any) -> Figure | None:
        with style():
            return build(*args, **kwargs)

    return wrapper


def new_figure(width: float, height: float) -> Figure:
    """An Agg-backed figure with constrained layout (no pyplot). Call inside `style()`."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def fitted_legend(fig: Figure, ncols: int, **kwargs: Any) -> Any:
    """``fig.legend(ncols=k, **kwargs)`` with the largest k ≤ ``ncols`` whose legend fits inside the figure's width
    (long model labels otherwise run off both edges of an ``outside lower center`` legend)."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas has it; FigureCanvasBase's stub not
    for k in range(max(1, ncols), 0, -1):
        legend = fig.legend(ncols=k, **kwargs)
        if k == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return legend
        legend.remove()
    return None


def label_bars(ax: Any, xs: Sequence[float], heights: Sequence[float], fontsize: str = "x-small") -> None:
    """Tell a zero bar from a missing one: "0" over a bar of height 0, "n/a" where the value is undefined (NaN)."""
    for x, h in zip(xs, heights):
        if math.isnan(h) or h == 0:
            ax.text(
                x,
                0,
                "n/a" if math.isnan(h) else "0",
                ha="center",
                va="bottom",
                fontsize=fontsize,
                rotation=90 if math.isnan(h) else 0,
                color="0.25",
            )


def save(fig: Figure | None, out_dir: Path, name: str) -> list[Path]:
    """Write ``<out_dir>/<name>.png`` and ``.pdf`` deterministically; returns both paths ([] when ``fig`` is None:
    its builder found no artifact and logged why)."""
    if fig is None:
        return []
    with style():
        return _save(fig, Path(out_dir), name)


def _save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    engine = fig.get_layout_engine()
    if engine is not None:  # constrained layout runs once (Agg text metrics) and both formats reuse its positions
        engine.execute(fig)
        fig.set_layout_engine("none")
    paths = []
    for fmt in FORMATS:
        path = out_dir / f"{name}.{fmt}"
        meta = PNG_METADATA if fmt == "png" else PDF_METADATA
        atomic_write(path, lambda fh: fig.savefig(fh, format=fmt, dpi=DPI, metadata=dict(meta)), binary=True)  # noqa: B023
        paths.append(path)  # written whole or not at all (a killed `mechopd figures` leaves no truncated image)
    return paths


def percent(value: float | None) -> float:
    """Proportion -> percent; None (undefined) -> NaN, which matplotlib leaves undrawn."""
    return math.nan if value is None else 100.0 * float(value)


# ---------------------------------------------------------------------------------------------------------- colours
def palette(names: Sequence[str]) -> dict[str, tuple[float, float, float]]:
    """One colour per model name, stable for a given order: ``base`` is grey, the others take the colour-blind
    palette in order (grey skipped). Use the same list of names in every figure so a method keeps its colour."""
    colours = sns.color_palette("colorblind")
    others = [c for i, c in enumerate(colours) if i != GREY]
    out, k = {}, 0
    for name in names:
        if name in out:
            continue
        if name == BASE:
            out[name] = colours[GREY]
        else:
            out[name] = others[k % len(others)]
            k += 1
    return out


# --------------------------------------------------------------------------------------------------------- run info
@dataclass
class RunInfo:
    """What the run's study says (`run_info`).

    methods: names of the trained runs in order (the base model excluded); labels: display names (``opd`` ->
    ``OPD``); thresholds: the regime thresholds (proportions) or None; study: the typed study it was read from.
    """

    root: Path
    task: str
    methods: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    thresholds: dict[str, float] | None = None
    study: RunSet | None = None

    def label(self, name: str) -> str:
        return self.labels.get(name, "Base" if name == BASE else name)

    @property
    def models(self) -> list[str]:
        """``base`` followed by the methods."""
        return [BASE] + [m for m in self.methods if m != BASE]


def read_json(path: Path) -> Any:
    """Parsed JSON, or DataError naming the file (`mechopd.core.artifacts.read_json`: malformed, not UTF-8, too deep)."""
    return artifact_json(path)


def run_info(run_dir: Path | RunSet) -> RunInfo:
    """What the run's study says (`mechopd.runset.RunSet.load`: ``study.yaml``, else ``demo.json``, else the
    ``train/*`` folders or ``eval/*.json`` names): the trained runs by name in role order, their labels, thresholds.
    ``run_dir`` may be a `RunSet` (a user study YAML) in place of a directory."""
    study = run_dir if isinstance(run_dir, RunSet) else RunSet.load(Path(run_dir))  # str or Path
    return RunInfo(study.root, study.task, study.methods, study.given_labels, study.thresholds, study)


def missing(figure: str, path: Path) -> None:
    """Log why a figure is skipped (the artifact it needs is absent)."""
    log.info("figure %s skipped: %s not found", figure, path)


# ---------------------------------------------------------------------------------------------------------- readers
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """One object per non-empty line; DataError naming the file and line otherwise."""
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path} line {i}: not valid JSON ({err.msg}); each line must be one JSON object") from None
        except RecursionError:
            raise DataError(f"{path} line {i}: nests too deeply; each line must be one flat JSON object") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path} line {i}: expected a JSON object, got {type(rec).__name__}")
        out.append(rec)
    return out


def read_csv(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
    """Rows of a CSV with a header; DataError naming the first missing column (and, through
    `mechopd.core.artifacts.read_csv`, a file that is not UTF-8 or has rows longer or shorter than its header)."""
    rows = artifact_csv(path)
    with Path(path).open(newline="", encoding="utf-8") as fh:  # read whole above: UTF-8 and CSV already checked
        header = next(csv.reader(fh), [])
    absent = [c for c in required if c not in header]
    if absent:
        raise DataError(
            f"{path} lacks column {absent[0]!r} (has {', '.join(header) or 'no header'}); "
            "rewrite it with the mechopd probe that owns it"
        )
    return rows


def to_float(text: str | None) -> float:
    """CSV cell -> float; empty / 'None' / unparsable -> NaN."""
    if text in (None, "", "None"):
        return math.nan
    try:
        return float(text)
    except ValueError:
        return math.nan


def summary_of(path: Path) -> dict[str, Any]:
    """The ``summary`` object of a removability report (``eval/<name>.json``), checked for the fields drawn."""
    report = read_json(path)
    summary = report.get("summary") if isinstance(report, dict) else None
    if not isinstance(summary, dict):
        raise DataError(f"{path} has no 'summary' object; write it with mechopd eval")
    for key in ("acc_x", "acc_xc", "harm", "both_correct", "delta_len"):
        entry = summary.get(key)
        if not isinstance(entry, dict) or "value" not in entry:
            raise DataError(f"{path}: summary.{key} must be an object with 'value', 'low', 'high'")
    return summary


def eval_summaries(info: RunInfo) -> dict[str, dict[str, Any]]:
    """Model name -> removability summary, in `RunInfo.models` order, for the reports that exist."""
    out = {}
    runs = {r.name: r for r in info.study} if info.study is not None else {}
    for name in info.models:
        path = runs[name].eval_path if name in runs else info.root / "eval" / f"{name}.json"
        if path.is_file():
            out[name] = summary_of(path)
    return out
