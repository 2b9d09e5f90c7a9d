"""The per-seed values the claims table decides on (`mechopd.report.claims`), one run (`RunSet`) at a time, read by ROLE
through the typed study: the similarity probe's per-layer two-view cosines, the training logs' gradient statistics,
the deltas probe's pooled update norms, the teachability buckets' quartile spread, the lens probe's KL by depth, and
the ratios the rows compare with their bars:

    depth_ratio = mean ‖ΔW‖/‖W0‖ over the first third of the decoder layers / that over the last third
    qk_ratio    = pooled ‖ΔW‖/‖W0‖ of q_proj, k_proj / that of v, o, gate, up, down_proj

and their OPTIMISER NULL (#53): after a few dozen Adam steps every coordinate moves by about the learning rate
whatever its gradient, so ‖ΔW_t‖² ≈ c² · numel_t and a group's relative update is c · sqrt(Σ numel / Σ ‖W0‖²) =
c / rms(W0): the same ratios computed on 1 / rms(W0) per group (`null_norms`) are what Adam gives ANY objective, and
the rows decide on ratio / null (the ratio of rms(ΔW), the update per coordinate).

Each returns None (or []) where the artifact is absent or the quantity undefined; the claims turn None into
"not measurable here".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechopd.probes.delta_rows import read_table
from mechopd.probes.registry import probe_result
from mechopd.runset import RunSet

NOISE_NORM_RATIO = 1e-3  # a gradient below 1e-3 of the other's norm is noise: that step is left out
MIN_LAYERS_FOR_DEPTH = 6  # "shallow vs deep" needs at least two layers in each third of the depth
QK = ("q_proj", "k_proj")
OTHER_PROJ = ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _as_study(study: RunSet | str | Path) -> RunSet:
    return study if isinstance(study, RunSet) else RunSet.load(study)


def layer_cosines(study: RunSet | Path, role: str) -> list[float]:
    """Per-token mean two-view cosine of ``role`` after each decoder layer, in layer order (the similarity probe's
    typed result); [] when the probe did not run or the study lacks the role."""
    study = _as_study(study)
    result, name = probe_result("similarity", study.probes_dir), study.name(role)
    return [] if result is None or name is None else result.layer_cosines(name)


def grad_steps(study: RunSet | Path, role: str, a: str = "opd", b: str = "nca") -> list[tuple[int, float, float]]:
    """(step, cos(∇a, ∇b), ‖∇a‖/‖∇b‖) on every gradient-statistics step of the training log of ``role`` (steps
    where the cosine is undefined — a term with zero weight — are left out)."""
    study = _as_study(study)
    out = []
    for r in study.metrics(role):
        cos = r.get(f"grad/cos/{a}__{b}", r.get(f"grad/cos/{b}__{a}"))
        na, nb = r.get(f"grad/norm/{a}"), r.get(f"grad/norm/{b}")
        if cos is None or na is None or nb is None:
            continue
        out.append((int(r["step"]), float(cos), float(na) / float(nb) if nb else math.inf))
    return out


def update_norms(study: RunSet | Path, role: str) -> tuple[dict[int, float], dict[str, float]] | None:
    """Relative update ‖ΔW‖/‖W0‖ of ``role`` vs the base, pooled per decoder layer and per module (the deltas
    probe's typed result, `DeltaSummary.update_norms`); None when the probe did not run."""
    study = _as_study(study)
    result, name, base = probe_result("deltas", study.probes_dir), study.name(role), study.name("base")
    return None if result is None or name is None else result.update_norms(name, base or "base")


def null_norms(study: RunSet | Path, role: str) -> tuple[dict[int, float], dict[str, float]] | None:
    """Adam's null relative update of ``role``'s tensors (up to the common factor c), pooled per decoder layer and per
    module as `update_norms` pools them: sqrt(Σ numel / Σ ‖W0‖²) over the group's tensors that ``role`` updated;
    None without the deltas table or a numel column."""
    from mechopd.probes.deltas import CSV_NAME

    study = _as_study(study)
    path, name = study.probes_dir / CSV_NAME, study.name(role)
    if name is None or not path.is_file():
        return None
    rows = [r for r in read_table(path) if r.layer is not None]
    moved = {r.site + "." + r.param for r in rows if r.model == name and r.metric == "delta_norm"}
    w0 = [r for r in rows if r.metric == "w0_norm" and r.site + "." + r.param in moved and (r.numel or 0) > 0]
    if not w0:
        return None
    out: tuple[dict[int, float], dict[str, float]] = ({}, {})
    for key, table in ((lambda r: r.layer, out[0]), (lambda r: r.module, out[1])):
        sums: dict[Any, list[float]] = {}
        for r in w0:
            acc = sums.setdefault(key(r), [0.0, 0.0])
            acc[0] += float(r.numel)
            acc[1] += float(r.value) ** 2
        table.update({k: math.sqrt(n / sq) for k, (n, sq) in sums.items() if sq > 0})
    return out


def _third_ratio(per_layer: dict[int, float]) -> float | None:
    vals = [per_layer[k] for k in sorted(per_layer)]
    if len(vals) < MIN_LAYERS_FOR_DEPTH:
        return None
    third = len(vals) // 3
    return (sum(vals[:third]) / third) / (sum(vals[-third:]) / third)


def _qk_of(modules: dict[str, float]) -> float | None:
    qk, other = _pooled(modules, QK), _pooled(modules, OTHER_PROJ)
    return None if qk is None or not other else qk / other


def null_depth_ratio(study: RunSet, role: str) -> float | None:
    """`depth_ratio` under Adam's null (`null_norms`)."""
    null = null_norms(study, role)
    return None if null is None else _third_ratio(null[0])


def null_qk_ratio(study: RunSet, role: str) -> float | None:
    """`qk_ratio` under Adam's null (`null_norms`)."""
    null = null_norms(study, role)
    return None if null is None else _qk_of(null[1])


def _pooled(norms: dict[str, float], names: Sequence[str]) -> float | None:
    vals = [norms[n] for n in names if n in norms and math.isfinite(norms[n])]
    return sum(vals) / len(vals) if vals else None


def quartile_spread(study: RunSet | Path, signal: str) -> float | None:
    """Mean absolute gain in the top quartile of `signal` minus the bottom quartile (teachability buckets)."""
    study = _as_study(study)
    result = probe_result("teachability", study.probes_dir)
    return None if result is None else result.quartile_spread(signal)


def lens_kls(study: RunSet | Path, role: str) -> list[float]:
    """Lens KL(p_c ‖ p_x) between the views of ``role`` after each decoder layer and at the output, in depth order
    (the lens probe's typed result; the embedding is left out: identical ids give 0 there); [] when the probe did not
    run or the study lacks the role."""
    study = _as_study(study)
    result, name = probe_result("lens", study.probes_dir), study.name(role)
    return [] if result is None or name is None else result.kl_by_depth(name)


def mean_cos(study: RunSet, role: str) -> float | None:
    vals = layer_cosines(study, role)
    return sum(vals) / len(vals) if vals else None


def orthogonality(study: RunSet, role: str = "nca") -> tuple[float | None, int, int]:
    """Mean |cos(∇OPD, ∇NCA)| over the informative gradient-statistics steps of ``role``'s training run."""
    steps = grad_steps(study, role)
    kept = [abs(c) for _, c, ratio in steps if NOISE_NORM_RATIO <= ratio <= 1 / NOISE_NORM_RATIO]
    return (sum(kept) / len(kept) if kept else None), len(kept), len(steps)


def depth_ratio(study: RunSet, role: str) -> float | None:
    norms = update_norms(study, role)
    return None if norms is None else _third_ratio(norms[0])


def qk_ratio(study: RunSet, role: str) -> float | None:
    norms = update_norms(study, role)
    return None if norms is None else _qk_of(norms[1])


def over_null(ratio: float | None, null: float | None) -> float | None:
    """ratio / its Adam null (None where either is undefined)."""
    return None if ratio is None or null is None or null <= 0 else ratio / null
