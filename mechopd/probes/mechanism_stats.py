"""Item-level statistics of the intervention probes over training seeds (docs/method.md §8 and "Interventions and update
geometry"): the per-item outcomes the probes save (``weightpatch_items.jsonl``: per model and row key
``layer/module[/draw]`` the pair [correct_x, correct_xc]; ``localization_items.jsonl``: ``right_x``, ``flips_clean``
and per site ``flips``), and their mean over seeds with the seeds × items interval (Student-t over seeds, item-bootstrap floor;
`mechopd.core.stats.hier_bootstrap`), as every bounded quantity of the claims table.

Weight patching, one seed, the items i of its held-out set, row r (qk = q_proj+k_proj reverted in every layer; the
controls vo and ctrl_qk, the latter with draws d = 1..D):

    rule_removed(r) = Acc_x(none) − Acc_x(r),   harm_removed(r) = Harm(none) − Harm(r)
    margin_rule(ctrl) = rule_removed(qk) − mean_d rule_removed(ctrl_d) = mean_d Acc_x(ctrl_d) − Acc_x(qk)
    margin_harm(ctrl) = mean_d Harm(ctrl_d) − Harm(qk)                   (Harm(r) = P(wrong with c | right without c))

Every row of one seed decodes the SAME items, so a bootstrap replicate draws one item resample and applies it to every
row (paired). Localization, one seed, items R right without c:

    Harm_tf(s) = Σ_i right_i · flip_i(s) / Σ_i right_i,   removal(s) = Harm_tf(s) − (1 − share) · Harm_tf(clean)

``removal(s)`` is paired item by item (the same resample for the patched and the unpatched flips); site s REMOVES the
harm when the whole 95 % interval of removal(s) is ≤ 0 (the interval rule), and the shallowest such site is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mechopd.core.stats import hier_bootstrap
from mechopd.probes.causal_items import read_items
from mechopd.probes.weightpatch_plan import NONE
from mechopd.runset import RunSet

QK_KEY = "all/qk"
Arrays = tuple[np.ndarray, ...]


def _items(study: RunSet | Path, probe: str) -> list[dict[str, Any]] | None:
    """A probe's item records of a seed (a `RunSet`, or a run directory: the figures read no study)."""
    probes = study.probes_dir if isinstance(study, RunSet) else Path(study) / "probes"
    path = probes / f"{probe}_items.jsonl"
    if not path.is_file():
        return None

    return read_items(path)


# --------------------------------------------------------------------------------------------------- weight patching
def weightpatch_outcomes(study: RunSet, role: str) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """row key -> (correct_x, correct_xc), ``[n]`` bool each, of ``role``'s model in ``weightpatch_items.jsonl``;
    None without the file, the role, or per-item outcomes (an items file written before they were saved)."""
    recs, name = _items(study, "weightpatch"), study.name(role)
    if not recs or name is None or any(name not in (r.get("outcomes") or {}) for r in recs):
        return None
    keys = list(recs[0]["outcomes"][name])
    if any(set(r["outcomes"][name]) != set(keys) for r in recs):
        return None
    pairs = {k: np.array([r["outcomes"][name][k] for r in recs], bool) for k in keys}
    return {k: (v[:, 0], v[:, 1]) for k, v in pairs.items()}


def _acc_x(cx: np.ndarray, cxc: np.ndarray) -> np.ndarray:
    return cx.mean(1)


def _harm(cx: np.ndarray, cxc: np.ndarray) -> np.ndarray:
    right = cx.sum(1).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(right > 0, (cx & ~cxc).sum(1) / np.maximum(right, 1), np.nan)


METRIC = {"acc_x": _acc_x, "acc_xc": lambda cx, cxc: cxc.mean(1), "harm": _harm}
REMOVED = {"rule_removed": "acc_x", "harm_removed": "harm"}


def _group(out: dict[str, tuple[np.ndarray, np.ndarray]], control: str) -> list[str]:
    prefix = f"all/{control}"
    return [k for k in out if k == prefix or k.startswith(prefix + "/")]


def qk_margin_arrays(study: RunSet, role: str, control: str) -> Arrays | None:
    """(qk_x, qk_xc, ctrl1_x, ctrl1_xc, ...) of one seed (every draw of ``control``); None when a row is missing."""
    out = weightpatch_outcomes(study, role)
    if out is None or QK_KEY not in out or not _group(out, control):
        return None
    return tuple(a for k in [QK_KEY, *_group(out, control)] for a in out[k])


def _margin_fn(key: str):
    metric = METRIC[REMOVED[key]]

    def fn(a: Arrays) -> np.ndarray:
        ctrl = np.mean([metric(a[j], a[j + 1]) for j in range(2, len(a), 2)], axis=0)
        return ctrl - metric(a[0], a[1])

    return fn


def qk_margin_stat(runs: Sequence[RunSet], role: str, control: str, key: str = "rule_removed") -> dict[str, Any]:
    """``key`` removed by q_proj+k_proj (every layer) minus that removed by ``control`` (mean over its draws), mean over
    seeds with the hierarchical interval over seeds and items (t over seeds, item floor; paired: one item resample
    for every row)."""
    return {**hier_bootstrap([qk_margin_arrays(r, role, control) for r in runs], _margin_fn(key)), "of": len(runs)}


def group_stat(runs: Sequence[RunSet], role: str, group: str, metric: str) -> dict[str, Any]:
    """``metric`` (acc_x, acc_xc, harm) of ``role``'s model with the row group ``layer/module`` reverted (a drawn
    control: the mean over its draws), over seeds and items; ``none/none``: the unpatched model."""

    def arrays(study: RunSet) -> Arrays | None:
        out = weightpatch_outcomes(study, role)
        keys = [] if out is None else [k for k in out if k == group or k.startswith(group + "/")]
        return tuple(a for k in keys for a in out[k]) if keys else None  # type: ignore[index]

    fn = METRIC[metric]
    return {
        **hier_bootstrap(
            [arrays(r) for r in runs],
            lambda a: np.mean([fn(a[j], a[j + 1]) for j in range(0, len(a), 2)], axis=0),
            bounds=(0.0, 1.0),
        ),
        "of": len(runs),
    }


def unpatched_stat(runs: Sequence[RunSet], role: str, metric: str) -> dict[str, Any]:
    """Acc_x / Harm of ``role``'s unpatched model (row ``none/none``) over seeds and items."""
    return group_stat(runs, role, f"{NONE}/{NONE}", metric)


def row_groups(study: RunSet, role: str) -> list[str]:
    """The ``layer/module`` groups of ``role``'s rows in table order (draws of a control pooled)."""
    out = weightpatch_outcomes(study, role) or {}
    return list(dict.fromkeys("/".join(k.split("/")[:2]) for k in out))


# ------------------------------------------------------------------------------------------------------ localization
def localization_arrays(study: RunSet | Path) -> tuple[list[str], Arrays] | None:
    """(sites, (right, clean flips, flips of site 1, ...)) of one seed's ``localization_items.jsonl``; None without
    the file or its per-item fields."""
    recs = _items(study, "localization")
    if not recs or any(k not in r for r in recs for k in ("right_x", "flips_clean", "flips")):
        return None
    sites = list(recs[0]["flips"])
    if any(set(r["flips"]) != set(sites) for r in recs):
        return None
    cols = [np.array([r["right_x"] for r in recs], bool), np.array([r["flips_clean"] for r in recs], bool)]
    cols += [np.array([r["flips"][s] for r in recs], bool) for s in sites]
    return sites, tuple(cols)


def _tf_harm(right: np.ndarray, flips: np.ndarray) -> np.ndarray:
    n = right.sum(1).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (right & flips).sum(1) / np.maximum(n, 1), np.nan)


def _site_arrays(runs: Sequence[RunSet | Path], site: str | None) -> list[Arrays | None]:
    """Per seed (right, clean flips, the site's flips); site None: the unpatched flips twice."""
    out: list[Arrays | None] = []
    for r in runs:
        got = localization_arrays(r)
        if got is None or (site is not None and site not in got[0]):
            out.append(None)
            continue
        sites, a = got
        out.append((a[0], a[1], a[1] if site is None else a[2 + sites.index(site)]))
    return out


def site_harm_stat(runs: Sequence[RunSet | Path], site: str | None) -> dict[str, Any]:
    """Teacher-forced Harm after patching ``site`` (None: unpatched) over seeds and items."""
    stat = hier_bootstrap(_site_arrays(runs, site), lambda a: _tf_harm(a[0], a[2]), bounds=(0.0, 1.0))
    return {**stat, "of": len(runs)}


def removal_stat(runs: Sequence[RunSet | Path], site: str, share: float) -> dict[str, Any]:
    """Paired per seed and item: Harm_tf(site) − (1 − share) · Harm_tf(unpatched); ≤ 0 removes ``share`` of it."""
    return {
        **hier_bootstrap(_site_arrays(runs, site), lambda a: _tf_harm(a[0], a[2]) - (1 - share) * _tf_harm(a[0], a[1])),
        "of": len(runs),
    }


__all__ = [
    "group_stat",
    "localization_arrays",
    "qk_margin_stat",
    "removal_stat",
    "row_groups",
    "site_harm_stat",
    "unpatched_stat",
    "weightpatch_outcomes",
]
