"""Training runs as the unit of replication: the seed tables of `mechopd aggregate`.

Each seed run is a complete demo run directory (``demo.json``, ``eval/*.json``, ``train/<method>/metrics.jsonl``,
``probes/``). A removability metric (Acc_x, Acc_xc, Harm, ...) is a statistic of per-item outcomes: its cell is the
mean over seeds with a 95 % seeds × items interval (`mechopd.report.seed_items`: Student-t over the seeds, each
seed's item noise as its floor, clipped to the metric's range). A scalar measured once per run (a kept fraction) gets a Student-t interval over the n seeds:

    mean = (1/n) Σ_k v_k,   s = sqrt(Σ_k (v_k − mean)² / (n − 1)),   interval = mean ± t_{0.975, n−1} · s / sqrt(n)

The statistics are `mechopd.core.stats` (a leaf); this module is the orchestration: it reads the seed runs as typed studies
(`mechopd.runset`, roles -> run names), writes the aggregate directory, draws and reports. The item-bootstrap intervals of each run's own report stay in that run's ``report.md``; the tables here
are over training runs only.

    from mechopd.report.aggregate import aggregate
    aggregate(["runs/demo/seed-0", "runs/demo/seed-1", "runs/demo/seed-2"], "runs/demo")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechopd.core.artifacts import write_json
from mechopd.core.errors import DataError
from mechopd.core.runcheck import check_seed_runs
from mechopd.core.stats import seed_stat
from mechopd.evaluation.removability import METRICS
from mechopd.plots import draw_all
from mechopd.report import write_aggregate_report
from mechopd.report.seed_items import metric_stat
from mechopd.runset import MANIFEST_FILE, RunSet, runsets
from mechopd.runset.checks import check_seeds

AGGREGATE_NAME = "aggregate.json"


# ------------------------------------------------------------------------------------------------- aggregation
def seed_studies(runs: Sequence[str | Path | RunSet], study: str | Path | None = None) -> list[RunSet]:
    """The seed runs as studies; DataError naming a directory that is not a demo run (no demo.json)."""
    if not runs:
        raise DataError("aggregate: no run directories given; pass RUN_DIRS written by `mechopd demo`")
    for r in runs:
        if not isinstance(r, RunSet) and not (Path(r) / MANIFEST_FILE).is_file():
            raise DataError(f"{r} has no demo.json; pass run directories written by `mechopd demo`")
    return check_seeds(runsets(runs, study))  # roles, task, labels, every seed's blocks: before anything is written


def check_runs(runs: Sequence[RunSet]) -> RunSet:
    """The first of the seed studies, after checking that they agree (task, roles); DataError when they do not."""
    if not runs:
        raise DataError("aggregate: no run directories given; pass RUN_DIRS written by `mechopd demo`")
    first = runs[0]
    for s in runs:
        if s.task != first.task or s.roles != first.roles:
            raise DataError(
                f"aggregate: {s.root} has task {s.task!r} and roles {s.roles}, but {first.root} has "
                f"{first.task!r} and {first.roles}; aggregate runs of one study"
            )
    return first


def summarise_runs(runs: Sequence[str | Path | RunSet], study: str | Path | None = None) -> dict[str, Any]:
    """Per run (by role; keyed by the first seed's run name) and removability metric, the seed statistic of the runs'
    point estimates; per trained run the seed statistic of the kept fraction."""
    seeds = seed_studies(runs, study)
    first = check_runs(seeds)
    table: dict[str, Any] = {}
    for run in first:
        reps = [s.eval(run.role) for s in seeds]
        if all(r is None for r in reps):
            continue
        row: dict[str, Any] = {
            m: metric_stat(seeds, run.role, m) for m in METRICS
        }  # seeds × items: t over seeds, item floor
        row["regimes"] = [r.summary.regime if r else None for r in reps]
        table[run.name] = row
    trained = [r for r in first if r.role != "base"]
    kept = {r.name: seed_stat([s.kept_fraction(r.role) for s in seeds]) for r in trained}
    return {
        "task": first.task,
        "methods": first.methods,
        "models": table,
        "kept_fraction": {m: s for m, s in kept.items() if s["n"]},
        "interval": "95 % hierarchical over seeds and items: Student-t over seeds, item-bootstrap floor",
        "runs": [str(s.root) for s in seeds],
    }


def aggregate(
    runs: Sequence[str | Path], out: str | Path, study: str | Path | None = None, report: bool = True
) -> Path:
    """Write ``out/aggregate.json``, ``out/demo.json`` (``seed_runs`` lists the runs), ``out/study.yaml`` (the seed
    runs' roles), the seed-band figures and ``out/report.md``; returns the report path. ``study``: a study YAML
    applied to every run dir (roles -> run names)."""
    out = Path(out)
    check_seed_runs([Path(r) for r in runs], out)  # distinct seeds of one study; out no input
    seeds = seed_studies([Path(r) for r in runs], study)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise_runs(seeds)
    first = seeds[0]
    labels = dict(first.manifest.get("labels", {}))
    for m, stat in summary["kept_fraction"].items():
        labels[m] = relabel_kept(labels.get(m, m), stat["mean"])
    manifest = {k: v for k, v in first.manifest.items() if k not in ("wall_s",)}
    manifest.update({"labels": labels, "seed_runs": [str(s.root.resolve()) for s in seeds], "aggregate": True})
    write_json(out / AGGREGATE_NAME, summary)  # atomic, strict JSON (non-finite -> null)
    write_json(out / "demo.json", manifest)
    RunSet(out, first.task, first.runs, manifest).write()
    draw_all(out)
    return write_aggregate_report(out) if report else out / "report.md"  # the demo writes it once, with its wall time


def relabel_kept(label: str, kept: float | None) -> str:
    """``"TA-OPD (ρ=0.10, kept 0.18)"`` -> the same label with `kept` (2 decimals) in place of the old value."""
    if kept is None or "kept " not in label:
        return label
    head, _, tail = label.partition("kept ")
    return f"{head}kept {kept:.2f}{tail[tail.find(')') :] if ')' in tail else ''}"
