"""The weight-patching probe's evaluation of one model (`mechopd.probes.weightpatch`, whose docstring has the
definitions): every row of the plan patched in place from the donor, both views decoded by the evaluation itself, and
the row's differences to the unpatched model paired over the same item resamples.

    d_acc_x(r) = Acc_x(r) − Acc_x(none)   d_acc_xc(r), d_harm(r) likewise (`removability.resample_blocks`)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mechopd.core.errors import DataError
from mechopd.evaluation.removability import batched_metrics, paired_arrays, resample_blocks
from mechopd.probes.weightpatch_plan import Donor, Row, patched

DELTAS = ("acc_x", "acc_xc", "harm")


def paired_deltas(
    ref: Sequence[Mapping], rec: Sequence[Mapping], n_boot: int, seed: int, ci_level: float = 0.95
) -> dict[str, tuple[float | None, float | None, float | None]]:
    """metric -> (value, low, high) of metric(rec) − metric(ref) for acc_x, acc_xc, harm on the same items; the
    percentile interval over the same item resamples (a resample where either Harm is undefined is skipped)."""
    a, b = paired_arrays(ref), paired_arrays(rec)
    if len(a[0]) != len(b[0]):
        raise DataError("paired_deltas: the two evaluations hold different numbers of items")
    point = {
        m: batched_metrics(*(x[None] for x in b))[m][0] - batched_metrics(*(x[None] for x in a))[m][0] for m in DELTAS
    }
    parts: dict[str, list[np.ndarray]] = {m: [] for m in DELTAS}
    for idx in resample_blocks(len(a[0]), n_boot, seed):
        ma, mb = batched_metrics(*(x[idx] for x in a)), batched_metrics(*(x[idx] for x in b))
        for m in DELTAS:
            parts[m].append(mb[m] - ma[m])
    out = {}
    for m in DELTAS:
        v = np.concatenate(parts[m]) if parts[m] else np.empty(0)
        v = v[np.isfinite(v)]
        lo, hi = np.quantile(v, [(1 - ci_level) / 2, 1 - (1 - ci_level) / 2]) if len(v) >= 10 else (None, None)
        out[m] = (
            None if not np.isfinite(point[m]) else float(point[m]),
            None if lo is None else float(lo),
            None if hi is None else float(hi),
        )
    return out


def _evaluate(model, run, cfg, follow: bool) -> dict[str, Any]:
    from mechopd.evaluation.evaluate import evaluate_model

    rep = evaluate_model(model, run.tokenizer, run.task, cfg, run.items.spec)
    if follow:
        from mechopd.evaluation.following import add_following

        add_following(rep, model, run.tokenizer, run.task, cfg, run.items.spec)
    return rep


def _row(label: str, donor: str, row: Row, n_params: int, rep: dict, ref: dict | None, cfg) -> dict[str, Any]:
    s = rep["summary"]
    out: dict[str, Any] = {
        "model": label,
        "donor": donor,
        "layer": row.layer,
        "module": row.module,
        "draw": "" if row.draw is None else row.draw,
        "n_params": n_params,
        "n": s["n"],
        "help": s["help"]["value"],
        "both_correct": s["both_correct"]["value"],
        "regime": s["regime"],
    }
    for m in ("acc_x", "acc_xc", "harm", "follow_other"):
        e = s.get(m) or {}
        out.update({m: e.get("value"), f"{m}_low": e.get("low"), f"{m}_high": e.get("high")})
    deltas = paired_deltas(ref["records"] if ref else rep["records"], rep["records"], cfg.n_boot, cfg.seed)
    for m, (v, lo, hi) in deltas.items():
        out.update({f"d_{m}": v, f"d_{m}_low": lo, f"d_{m}_high": hi})
    return out


def weightpatch_model(
    model,
    run,
    label: str,
    donor: Donor,
    donor_label: str,
    rows: Sequence[Row],
    cfg,
    follow: bool = False,
    progress: bool = True,
) -> tuple[list[dict], dict[str, list]]:
    """Every row on one loaded model (patched in place, restored after each); (table rows, outcomes by row key)."""
    from tqdm.auto import tqdm

    shapes = {n: p.shape for n, p in model.named_parameters()}
    table, outcomes, ref = [], {}, None
    for row in tqdm(rows, desc=f"weightpatch {label}", disable=not progress):
        with patched(model, donor, row):
            rep = _evaluate(model, run, cfg, follow)
        ref = ref or rep  # the first row is the unpatched model
        table.append(_row(label, donor_label, row, row.n_params(shapes), rep, ref, cfg))
        outcomes[row.key] = [[bool(r["correct_x"]), bool(r["correct_xc"])] for r in rep["records"]]
    return table, outcomes
