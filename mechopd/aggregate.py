"""Training runs as the unit of replication: mean and a 95 % Student-t interval over seeds (`mechopd aggregate`).

Each seed run is a complete demo run directory (``demo.json``, ``eval/*.json``, ``train/<method>/metrics.jsonl``,
``probes/``). For a scalar measured once per run (a final accuracy, a mean cosine, a kept fraction) over n seeds:

    mean = (1/n) Σ_k v_k,   s = sqrt(Σ_k (v_k − mean)² / (n − 1)),   interval = mean ± t_{0.975, n−1} · s / sqrt(n)

The t quantile is computed (numeric integration of the t density, bisection), not looked up; with one seed there is no
interval (None). Undefined values (a Harm with no item right without the context) are left out and ``n`` counts the
defined ones. The item-bootstrap intervals of each run's own report stay in that run's ``report.md``; the tables here
are over training runs only.

    from mechopd.aggregate import aggregate
    aggregate(["runs/demo/seed-0", "runs/demo/seed-1", "runs/demo/seed-2"], "runs/demo")
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mechopd.artifacts import read_json, write_json
from mechopd.errors import DataError

CI = 0.95
INTERVAL_NAME = "95 % Student-t interval over seeds (mean ± t·s/√n)"
AGGREGATE_NAME = "aggregate.json"


# ---------------------------------------------------------------------------------------------------- statistics
def _t_cdf(x: float, df: int) -> float:
    """P(T ≤ x) for Student's t with `df` degrees of freedom (x ≥ 0), by Simpson's rule on the density."""
    logc = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    grid = np.linspace(0.0, x, 4001)
    dens = np.exp(logc - (df + 1) / 2 * np.log1p(grid ** 2 / df))
    h = x / 4000
    area = h / 3 * (dens[0] + dens[-1] + 4 * dens[1:-1:2].sum() + 2 * dens[2:-1:2].sum())
    return 0.5 + float(area)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (p in (0.5, 1)) of Student's t with `df` ≥ 1 degrees of freedom (bisection on `_t_cdf`)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def seed_stat(values: Sequence[float | None], ci: float = CI) -> dict[str, Any]:
    """``{"mean", "low", "high", "n", "values"}`` over the defined values; mean None when none is defined,
    low / high None with fewer than two."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    out: dict[str, Any] = {"mean": None, "low": None, "high": None, "n": len(vals), "values": vals}
    if not vals:
        return out
    mean = sum(vals) / len(vals)
    out["mean"] = mean
    if len(vals) >= 2:
        sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        half = t_quantile(0.5 + ci / 2, len(vals) - 1) * sd / math.sqrt(len(vals))
        out["low"], out["high"] = mean - half, mean + half
    return out


def fmt_stat(stat: dict[str, Any] | None, digits: int = 3, signed: bool = False) -> str:
    """``mean [low, high]`` (``n/a`` when undefined, the mean alone with one seed)."""
    if not stat or stat.get("mean") is None:
        return "n/a"
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    text = f.format(stat["mean"])
    if stat.get("low") is not None:
        text += f" [{f.format(stat['low'])}, {f.format(stat['high'])}]"
    return text


# --------------------------------------------------------------------------------------------- per-run readers
def read_manifest(run: Path) -> dict[str, Any]:
    """A run's ``demo.json``; DataError naming the directory when it is absent or malformed."""
    path = Path(run) / "demo.json"
    if not path.is_file():
        raise DataError(f"{run} has no demo.json; pass run directories written by `mechopd demo`")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not valid JSON ({err.msg}); rerun `mechopd demo --out {run}`") from None
    if not isinstance(data, dict) or not isinstance(data.get("methods"), list):
        raise DataError(f"{path}: expected an object with a 'methods' list")
    return data


def metric_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a metrics.jsonl ([] when absent); a step logged twice keeps its last line."""
    if not Path(path).is_file():
        return []
    by_step: dict[Any, dict[str, Any]] = {}
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise DataError(f"{path} line {i}: not valid JSON; each line must be one JSON object") from None
        by_step[(rec.get("step"), "eval/acc_x" in rec)] = rec
    return [by_step[k] for k in sorted(by_step, key=lambda k: (k[0] if k[0] is not None else -1, k[1]))]


def mean_kept_fraction(run: Path, method: str) -> float | None:
    """Mean of ``kept_fraction`` over the training steps of ``RUN/train/<method>/metrics.jsonl`` (None if never
    logged): the share of response positions the selector actually trained on."""
    vals = [r["kept_fraction"] for r in metric_lines(Path(run) / "train" / method / "metrics.jsonl")
            if r.get("kept_fraction") is not None]
    return sum(vals) / len(vals) if vals else None


def eval_summary(run: Path, name: str) -> dict[str, Any] | None:
    path = Path(run) / "eval" / f"{name}.json"
    return read_json(path)["summary"] if path.is_file() else None


# ------------------------------------------------------------------------------------------------- aggregation
def check_runs(runs: Sequence[Path]) -> dict[str, Any]:
    """The common manifest of the seed runs (task, methods); DataError when they disagree."""
    if not runs:
        raise DataError("aggregate: no run directories given; pass RUN_DIRS written by `mechopd demo`")
    manifests = [read_manifest(r) for r in runs]
    first = manifests[0]
    for run, m in zip(runs, manifests):
        if m.get("task") != first.get("task") or m["methods"] != first["methods"]:
            raise DataError(f"aggregate: {run} has task {m.get('task')!r} and methods {m['methods']}, but "
                            f"{runs[0]} has {first.get('task')!r} and {first['methods']}; aggregate runs of one study")
    return first


def summarise_runs(runs: Sequence[Path]) -> dict[str, Any]:
    """Per model and removability metric, the seed statistic of the runs' point estimates; per selector method the
    seed statistic of the kept fraction."""
    from mechopd.removability import METRICS

    manifest = check_runs(runs)
    models = ["base"] + [m for m in manifest["methods"] if m != "base"]
    table: dict[str, Any] = {}
    for name in models:
        sums = [eval_summary(r, name) for r in runs]
        if all(s is None for s in sums):
            continue
        row = {m: seed_stat([s[m]["value"] if s else None for s in sums]) for m in METRICS}
        row["regimes"] = [s["regime"] if s else None for s in sums]
        table[name] = row
    kept = {m: seed_stat([mean_kept_fraction(r, m) for r in runs]) for m in manifest["methods"]}
    return {"task": manifest.get("task"), "methods": manifest["methods"], "models": table,
            "kept_fraction": {m: s for m, s in kept.items() if s["n"]}, "interval": INTERVAL_NAME,
            "runs": [str(r) for r in runs]}


def aggregate(runs: Sequence[str | Path], out: str | Path) -> Path:
    """Write ``out/aggregate.json``, ``out/demo.json`` (``seed_runs`` lists the runs), the seed-band figures and
    ``out/report.md``; returns the report path."""
    from mechopd.plots import draw_all
    from mechopd.report import write_aggregate_report

    runs = [Path(r) for r in runs]
    out = Path(out)
    __import__("mechopd.runcheck").runcheck.check_seed_runs(runs, out)  # distinct seeds of one study; out no input
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise_runs(runs)
    first = read_manifest(runs[0])
    labels = dict(first.get("labels", {}))
    for m, stat in summary["kept_fraction"].items():
        labels[m] = relabel_kept(labels.get(m, m), stat["mean"])
    manifest = {k: v for k, v in first.items() if k not in ("wall_s",)}
    manifest.update({"labels": labels, "seed_runs": [str(r.resolve()) for r in runs], "aggregate": True})
    write_json(out / AGGREGATE_NAME, summary)  # atomic, strict JSON (non-finite -> null)
    write_json(out / "demo.json", manifest)
    draw_all(out)
    return write_aggregate_report(out)


def relabel_kept(label: str, kept: float | None) -> str:
    """``"TA-OPD (ρ=0.10, kept 0.18)"`` -> the same label with `kept` (2 decimals) in place of the old value."""
    if kept is None or "kept " not in label:
        return label
    head, _, tail = label.partition("kept ")
    return f"{head}kept {kept:.2f}{tail[tail.find(')'):] if ')' in tail else ''}"
