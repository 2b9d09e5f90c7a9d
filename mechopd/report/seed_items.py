"""Item-level statistics over training seeds: the per-item outcomes of each seed's evaluation reports, read by ROLE
through the typed study, and their mean over seeds with a seeds × items interval (`mechopd.core.stats.hier_bootstrap`:
Student-t over the seeds' values, each seed's item-bootstrap variance as a floor; docs/method.md §8).

Every bounded quantity the report and the claims show (Acc_x, Acc_xc, Harm, Help, BothCorrect, follow_other, ...) is
a statistic of per-item outcomes, noisy within a seed as well as between seeds: its interval takes the small-sample t
quantile over seeds and keeps the item level as a floor; a proportion's is clipped to [0, 1]. Two models of one seed
are compared on the items both evaluated (paired by ``(uid, sample)``), resampled together. Where the evaluation saved
each item's cluster (``"cluster"`` in its records: the fact a paraphrase asks about, the ``facts`` task), the item
level resamples whole clusters (`eval_clusters`, `other_clusters`; docs/method.md §8).

    from mechopd.report.seed_items import metric_stat, paired_stat
    metric_stat(runs, "opd", "harm")                                   # mean over seeds [t over seeds, item floor]
    paired_stat(runs, ("nca", "opd"), lambda a: harm(a[0:2]) - 0.5 * harm(a[2:4]))
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mechopd.core.stats import CI, exact_se, hier_bootstrap
from mechopd.evaluation.config import EvalConfig
from mechopd.evaluation.following import _matrices, _mean_over_contexts
from mechopd.evaluation.removability import batched_metrics, paired_arrays
from mechopd.runset import RunSet

Arrays = tuple[np.ndarray, ...]
FIELDS = 4  # per role: correct_x, correct_xc, len_x, len_xc


def _keyed(study: RunSet, role: str) -> dict[tuple[str, int], tuple[bool, bool, float, float]] | None:
    """(uid, sample) -> (correct_x, correct_xc, len_x, len_xc) of the role's evaluation report; None without one."""
    rep = study.eval(role)
    if rep is None or not rep.records:
        return None
    cx, cxc, lx, lxc = paired_arrays(rep.records)
    keys = [(str(r.get("uid")), int(r.get("sample", 0) or 0)) for r in rep.records]
    return {k: (bool(a), bool(b), float(c), float(d)) for k, a, b, c, d in zip(keys, cx, cxc, lx, lxc)}


def eval_arrays(study: RunSet, roles: Sequence[str]) -> Arrays | None:
    """Per role in order, ``correct_x, correct_xc, len_x, len_xc`` (``[n]`` each) on the items every role evaluated
    (sorted by key, so pairs line up); None when a role lacks its report or no item is shared."""
    keyed = [_keyed(study, r) for r in roles]
    present = [k for k in keyed if k is not None]
    if len(present) != len(keyed):
        return None
    common = sorted(set.intersection(*(set(k) for k in present)))
    if not common:
        return None
    out: list[np.ndarray] = []
    for k in present:
        rows = np.array([k[key] for key in common], dtype=np.float64)
        out += [rows[:, 0] > 0.5, rows[:, 1] > 0.5, rows[:, 2], rows[:, 3]]
    return tuple(out)


def _common_keys(study: RunSet, roles: Sequence[str]) -> list[tuple[str, int]] | None:
    keyed = [_keyed(study, r) for r in roles]
    if any(k is None for k in keyed):
        return None
    return sorted(set.intersection(*(set(k) for k in keyed if k is not None))) or None


def _cluster_of(study: RunSet, role: str) -> dict[tuple[str, int], str] | None:
    """(uid, sample) -> the item's saved cluster; None unless every record of the role's report carries one."""
    rep = study.eval(role)
    if rep is None or not rep.records or any(r.get("cluster") is None for r in rep.records):
        return None
    return {(str(r.get("uid")), int(r.get("sample", 0) or 0)): str(r["cluster"]) for r in rep.records}


def eval_clusters(study: RunSet, roles: Sequence[str]) -> np.ndarray | None:
    """The cluster id (``[n]``, int codes) of each item of `eval_arrays` output, in its order; None where the first
    role's records carry no cluster (a task whose items are independent: the item resample)."""
    by_key = _cluster_of(study, roles[0])
    common = None if by_key is None else _common_keys(study, roles)
    if common is None or by_key is None or any(k not in by_key for k in common):
        return None
    return np.unique([by_key[k] for k in common], return_inverse=True)[1]


def metric_of(arrays: Arrays, metric: str, role: int = 0) -> np.ndarray:
    """``metric`` (`removability.METRICS`) of role number ``role`` of `eval_arrays` output, batched ``[B, n]``."""
    return batched_metrics(*arrays[FIELDS * role : FIELDS * role + FIELDS])[metric]


def paired_stat(
    runs: Sequence[RunSet],
    roles: Sequence[str],
    fn: Callable[[Arrays], np.ndarray],
    seed: int = EvalConfig.seed,
    bounds: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Mean over seeds of ``fn`` on the roles' paired item arrays, seeds × items interval; ``"of"``: the
    study's seed count (`verdicts.decide` calls a statistic defined in one of several seeds fragile). ``bounds``
    (−1, 1): a per-item difference of two 0/1 outcomes, whose every item at ±1 in every seed gets the exact bound."""
    units = None if bounds is None else (lambda a: np.full(a[0].shape[0], a[0].shape[1], np.float64))
    return {
        **hier_bootstrap(
            [eval_arrays(r, roles) for r in runs],
            fn,
            seed=seed,
            bounds=bounds,
            trials=units,
            clusters=[eval_clusters(r, roles) for r in runs],
        ),
        "of": len(runs),
    }


def units_of(arrays: Arrays, metric: str, role: int = 0) -> np.ndarray:
    """The informative units (the denominator) of a proportion ``metric`` of role number ``role``, batched ``[B]``:
    every item for Acc_x, Acc_xc, BothCorrect; the items right without the context for Harm; those wrong without it
    for Help."""
    cx = arrays[FIELDS * role]
    n = np.full(cx.shape[0], cx.shape[1], np.float64)
    return {"harm": cx.sum(1).astype(np.float64), "help": n - cx.sum(1)}.get(metric, n)


def metric_stat(runs: Sequence[RunSet], role: str, metric: str) -> dict[str, Any]:
    """One role's removability metric over seeds (seeds × items interval; a proportion at 0 or 1 in every seed gets
    the exact bound on its pooled units, `units_of`)."""
    bounds = None if metric == "delta_len" else (0.0, 1.0)
    units = None if metric == "delta_len" else (lambda a: units_of(a, metric))
    return {
        **hier_bootstrap(
            [eval_arrays(r, (role,)) for r in runs],
            lambda a: metric_of(a, metric),
            bounds=bounds,
            trials=units,
            clusters=[eval_clusters(r, (role,)) for r in runs],
        ),
        "of": len(runs),
    }


def diff_stat(runs: Sequence[RunSet], a: str, b: str, metric: str, scale_b: float = 1.0) -> dict[str, Any]:
    """Paired per seed and item: metric(a) − scale_b · metric(b), on the items both evaluated (an accuracy difference
    in (−1, 1), with its exact bound when every item moves the same way)."""
    whole = metric in ("acc_x", "acc_xc", "both_correct") and scale_b == 1.0
    fn = lambda x: metric_of(x, metric, 0) - scale_b * metric_of(x, metric, 1)  # noqa: E731
    st = paired_stat(runs, (a, b), fn, bounds=(-1.0, 1.0) if whole else None)
    if st.get("degenerate") and metric in ("harm", "help"):  # both at a bound in every seed: each side's exact bound
        sa, sb = metric_stat(runs, a, metric), metric_stat(runs, b, metric)
        if sa.get("exact") and sb.get("exact"):
            st.pop("degenerate")
            low, high = sa["low"] - scale_b * sb["high"], sa["high"] - scale_b * sb["low"]
            st.update(low=low, high=high, exact=f"{sa['exact']} against {sb['exact']}")
            exact_se(st, CI)
    return st


# ----------------------------------------------------------------------------------------------- other contexts
def other_matrix(
    study: RunSet, role: str, field: str = "follow", labels: Sequence[str] | None = None
) -> np.ndarray | None:
    """``[units, contexts]`` of the role's other-context records (``field``: follow, stick, compose, other as 0/1;
    NaN where a unit lacks a context), restricted to ``labels`` when given; None without records."""
    rep = study.eval(role)
    records = [
        r for r in (rep.extra.get("other_records") or [] if rep else []) if labels is None or r.get("label") in labels
    ]
    if not records or any(field not in r for r in records):
        return None
    names, follow, _ = _matrices([{**r, "follow": r[field], "stick": False} for r in records])
    return follow


def other_clusters(study: RunSet, role: str, labels: Sequence[str] | None = None) -> np.ndarray | None:
    """The cluster id of each unit (row) of `other_matrix`, from the role's evaluation records (the unit's uid);
    None without clusters."""
    rep = study.eval(role)
    records = [
        r for r in (rep.extra.get("other_records") or [] if rep else []) if labels is None or r.get("label") in labels
    ]
    by_uid = {k[0]: c for k, c in (_cluster_of(study, role) or {}).items()}
    units = list(dict.fromkeys((r["uid"], r["sample"]) for r in records))  # `following._matrices`' row order
    if not units or any(str(u) not in by_uid for u, _ in units):
        return None
    return np.unique([by_uid[str(u)] for u, _ in units], return_inverse=True)[1]


def other_stat(
    runs: Sequence[RunSet], role: str, field: str = "follow", labels: Sequence[str] | None = None
) -> dict[str, Any]:
    """Mean over the other contexts (each context's mean over units) of ``field``, over seeds (seeds × units
    interval)."""
    seeds = [other_matrix(r, role, field, labels) for r in runs]
    return {
        **hier_bootstrap(
            [None if m is None else (m,) for m in seeds],
            lambda a: _mean_over_contexts(a[0]),
            bounds=(0.0, 1.0),
            trials=lambda a: (
                np.isfinite(a[0]).any(-1).sum(-1).astype(np.float64)
            ),  # units (replies of one are not independent)
            clusters=[other_clusters(r, role, labels) for r in runs],
        ),
        "of": len(runs),
    }


def other_diff_stat(
    runs: Sequence[RunSet],
    a: str,
    b: str,
    field: str = "follow",
    labels: Sequence[str] | None = None,
    scale_b: float = 1.0,
) -> dict[str, Any]:
    """Paired per seed and unit: mean over contexts of ``field`` for role a minus ``scale_b`` × that of role b."""

    def pair(study: RunSet) -> Arrays | None:
        ma, mb = other_matrix(study, a, field, labels), other_matrix(study, b, field, labels)
        if ma is None or mb is None or ma.shape != mb.shape:
            return None
        return ma, mb

    whole = scale_b == 1.0  # a difference of two 0/1 outcomes per unit and context: exact when no unit differs
    st = {
        **hier_bootstrap(
            [pair(r) for r in runs],
            lambda x: _mean_over_contexts(x[0]) - scale_b * _mean_over_contexts(x[1]),
            bounds=(-1.0, 1.0) if whole else None,
            trials=(lambda x: np.isfinite(x[0]).any(-1).sum(-1).astype(np.float64)) if whole else None,
            clusters=[other_clusters(r, a, labels) for r in runs],
        ),
        "of": len(runs),
    }
    if st.get("degenerate"):  # both at a bound on every unit (OPD follows 0 of N, the base N of N): each exact bound
        sa, sb = other_stat(runs, a, field, labels), other_stat(runs, b, field, labels)
        if sa.get("exact") and sb.get("exact"):
            st.pop("degenerate")
            st.update(
                low=sa["low"] - scale_b * sb["high"],
                high=sa["high"] - scale_b * sb["low"],
                exact=f"{sa['exact']} against {sb['exact']}",
            )
            exact_se(st, CI)
    return st


# ---------------------------------------------------------------------------------------- probes' per-item tables
def probe_items(
    study: RunSet, file: str, value: str, roles: Sequence[str], sites: Sequence[str], mean_column: bool = False
) -> Arrays | None:
    """``(sums, counts)``, each ``[items, roles, sites]``, of a probe's per-item table (``similarity_examples.csv``:
    ``cos_mean`` per item and site, ``mean_column=True``; ``lens_examples.csv``: ``kl_sum``), so that a per-token mean
    over any resample of the items is ``sums.sum(0) / counts.sum(0)``. Items every role has, in uid order; None when
    the table, a role or a site is missing (or a cell is not a finite number)."""
    path = study.probes_dir / file
    if not path.is_file() or not sites:
        return None
    names = [study.name(r) for r in roles]
    cells: dict[tuple[str, str, str], tuple[float, int]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                n, v = int(row["n_tokens"]), float(row[value])
            except (KeyError, TypeError, ValueError):
                return None
            if not math.isfinite(v):
                return None
            cells[(row["model"], row["uid"], row["site"])] = (v * n if mean_column else v, n)
    uids = sorted({u for (m, u, _) in cells if m == names[0]})
    known = [n for n in names if n is not None]
    if not uids or len(known) != len(names) or any((m, u, s) not in cells for m in known for u in uids for s in sites):
        return None
    sums = np.array([[[cells[(m, u, s)][0] for s in sites] for m in known] for u in uids], np.float64)
    counts = np.array([[[cells[(m, u, s)][1] for s in sites] for m in known] for u in uids], np.float64)
    return sums, counts


def token_means(arrays: Arrays) -> np.ndarray:
    """``[B, items, roles, sites]`` resampled sums and counts -> ``[B, roles, sites]`` per-token means."""
    sums, counts = arrays
    return sums.sum(1) / np.maximum(counts.sum(1), 1)


def probe_tables(
    runs: Sequence[RunSet],
    file: str,
    value: str,
    roles: Sequence[str],
    sites_of: Callable[[RunSet], Sequence[str]],
    mean_column: bool = False,
) -> list[Arrays | None]:
    """Per seed, `probe_items` of one probe table (read once; every statistic of a row bootstraps these)."""
    return [probe_items(r, file, value, roles, sites_of(r), mean_column) for r in runs]


def table_stat(
    tables: Sequence[Arrays | None], fn: Callable[[np.ndarray], np.ndarray], scale: str = "linear"
) -> dict[str, Any]:
    """Mean over seeds of ``fn(per-token means [B, roles, sites])`` with the seeds × items interval
    (`stats.hier_bootstrap`: t over seeds, the probe's items as the floor) on `probe_tables` output; ``scale="log"``
    for a ratio (geometric mean, interval on the log of the per-seed ratios)."""
    return {**hier_bootstrap(list(tables), lambda a: fn(token_means(a)), scale=scale), "of": len(tables)}
