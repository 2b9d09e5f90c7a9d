"""The claims table's probe rows (`mechopd.report.claims`): two-view cosine, logit lens, gradient orthogonality, where the
update sits, teachability. Criteria fixed here before any run (docs/method.md §8); each decided by the interval rule
(`mechopd.report.verdicts.decide`) on a scale where the quantity is unbounded (`mechopd.core.stats.scaled_stat`):

  * the two-view cosine and the lens KL are item-level: their rows use the seeds × items interval (t over seeds, the
    probe's items as the floor; ratios on the log scale) (`seed_items.table_stat`, from ``similarity_examples.csv`` / ``lens_examples.csv``), a statistic of
    per-token means recomputed on every resample; without those tables (an older run), the seed-level rule below;
  * positive quantities (KLs, norm ratios, the distances 1 − cos) on PAIRED per-seed LOG RATIOS: "NCA's lens KL is
    below OPD's" is ``KL_NCA / KL_OPD < 1`` with the t-interval of ``log(KL_NCA / KL_OPD)`` over seeds; a ratio that
    spans orders of magnitude is read as a ratio, never as an additive difference;
  * cosines near 1 on the scale of ``log(1 − cos)`` (their interval never passes 1);
  * degeneracy (teachability) counted per seed: the row is decided on the seeds where the diagnostic can speak.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mechopd.core.stats import fmt_stat, scaled_stat, seed_stat
from mechopd.probes.registry import probe_result
from mechopd.report import preconditions as pre
from mechopd.report.claim_rules import (
    MIN_LAYERS_FOR_DEPTH,
    depth_ratio,
    layer_cosines,
    lens_kls,
    mean_cos,
    null_depth_ratio,
    null_qk_ratio,
    over_null,
    qk_ratio,
    quartile_spread,
    update_norms,
)
from mechopd.report.seed_items import probe_tables, table_stat
from mechopd.report.verdicts import FAILS, NA, RULE, Decision, all_of, decide
from mechopd.runset import RunSet

NCA_COSINE_FLOOR = 0.997  # the paper: NCA ≥ 0.997 at every layer ...
PAPER_BASE_COSINE = 0.953  # ... of a model whose base sits at 0.953 (Qwen3-4B)
PAPER_DIST_RATIO = (1 - NCA_COSINE_FLOOR) / (1 - PAPER_BASE_COSINE)  # NCA leaves 6.4 % of the base's distance
CONCENTRATED = 1.5  # "concentrated in X": X's relative update at least 1.5× the rest's (a stated convention)
ORTHOGONAL_ABS_COS = 0.1  # "nearly orthogonal": |cos| ≤ 0.1 (a stated convention; the paper gives no number)
LENS_BASE_SHARE = 0.1  # a lens site speaks where the BASE's views differ: its KL ≥ 10 % of its output KL
LENS_BASE_OUTPUT = 0.1  # ... and only when the base's output KL between views is at least 0.1 nats
Row = dict[str, Any]  # {"measured", "verdict", "criterion", "headline"}


def _column_mean(k: int) -> Callable[[np.ndarray], np.ndarray]:
    """Per-token means ``[B, roles, sites]`` -> role k's mean over sites ``[B]``."""
    return lambda a: a[:, k].mean(-1)


def _site_ratio(k: int) -> Callable[[np.ndarray], np.ndarray]:
    """Per-token means ``[B, 2, sites]`` -> site k's ratio of role 1 to role 0 ``[B]``."""
    return lambda m: m[:, 1, k] / np.maximum(m[:, 0, k], 1e-300)


def _stat(runs: Sequence[RunSet], values: Sequence[float | None], scale: str = "linear") -> dict[str, Any]:
    return {**scaled_stat(values, scale), "of": len(runs)}


def _row(measured: str, d: Decision | str, crit: str, headline: str) -> Row:
    if isinstance(d, str):
        return {"measured": measured, "verdict": d, "criterion": crit, "headline": headline}
    return {"measured": measured + d.note, "verdict": d.verdict, "criterion": crit, "headline": headline}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 or a < 0 else a / b


def _dist(c: float | None) -> float | None:
    return None if c is None else 1.0 - c


def _layers(study: RunSet, role: str = "nca") -> list[str]:
    return [f"layers.{i}.resid_post" for i in range(len(layer_cosines(study, role)))]


def _cos_tables(runs: Sequence[RunSet], roles: Sequence[str]) -> list[Any]:
    return probe_tables(runs, "similarity_examples.csv", "cos_mean", roles, _layers, mean_column=True)


def claim_cosine_order(runs: Sequence[RunSet]) -> Row:
    """Distance 1 − c (c: the two-view cosine averaged over decoder layers at the predicting positions): paired per
    seed and item, (1 − c_OPD)/(1 − c_base) < 1 AND (1 − c_NCA)/(1 − c_OPD) < 1."""
    roles = ("base", "opd", "nca")
    ratio = lambda lo, hi: lambda m: (1 - m[:, hi].mean(-1)) / np.maximum(1 - m[:, lo].mean(-1), 1e-12)  # noqa: E731
    tables = _cos_tables(runs, roles)  # read once: every statistic below bootstraps the same items
    steps = {
        f"{hi}/{lo}": table_stat(tables, ratio(roles.index(lo), roles.index(hi)), "log")
        for lo, hi in (("base", "opd"), ("opd", "nca"))
    }
    cos = {m: table_stat(tables, _column_mean(k)) for k, m in enumerate(roles)}
    if any(s["mean"] is None for s in (*cos.values(), *steps.values())):  # no per-item table: seed-level
        cos = {m: _stat(runs, [mean_cos(r, m) for r in runs], "log1m") for m in roles}
        steps = {
            f"{hi}/{lo}": _stat(runs, [_ratio(_dist(mean_cos(r, hi)), _dist(mean_cos(r, lo))) for r in runs], "log")
            for lo, hi in (("base", "opd"), ("opd", "nca"))
        }
    crit = (
        "two-view cosine c averaged over decoder layers (predicting positions), paired per seed and item on the "
        f"distance 1 − c: OPD's / base's < 1 and NCA's / OPD's < 1; {RULE}"
    )
    measured = ", ".join(f"{m} {fmt_stat(s, 4)}" for m, s in cos.items())
    if any(s["mean"] is None for s in (*cos.values(), *steps.values())):
        return _row(measured, NA, crit, "n/a")
    if deaf := pre.nca_alive(runs):  # a deaf context view closes the two-view distance by construction
        return _row(f"{measured}; {deaf[1]}", deaf[0], crit, "n/a")
    measured += "; distance ratio " + ", ".join(f"{k} {fmt_stat(s, 3)}" for k, s in steps.items())
    d = all_of(*(decide(s, 1.0, "<", f"(1 − c) {k}") for k, s in steps.items()))
    return _row(
        measured,
        d,
        crit,
        f"cosine base {cos['base']['mean']:.4f} → OPD {cos['opd']['mean']:.4f} → NCA {cos['nca']['mean']:.4f}",
    )


def _dist_ratios(study: RunSet) -> float | None:
    """Seed-level: max over decoder layers of (1 − c_NCA) / (1 − c_base)."""
    nca, base = layer_cosines(study, "nca"), layer_cosines(study, "base")
    if not nca or len(nca) != len(base) or any(b >= 1 for b in base):
        return None
    return max((1 - n) / (1 - b) for n, b in zip(nca, base))


def claim_nca_cosine(runs: Sequence[RunSet]) -> Row:
    """Relative to this model's own base (the paper's 0.997 is a 36-layer model's whose base sits at 0.953): at every
    decoder layer, (1 − c_NCA) / (1 − c_base) ≤ (1 − 0.997) / (1 − 0.953) — NCA closes at least the share of the
    base's two-view distance the paper's NCA closes. Per seed and item (the max over layers of the ratio, log scale);
    seed-level log-ratio t-interval without the table."""
    worst = lambda m: ((1 - m[:, 1]) / np.maximum(1 - m[:, 0], 1e-12)).max(-1)  # noqa: E731
    st = table_stat(_cos_tables(runs, ("base", "nca")), worst, "log")
    if st["mean"] is None:
        st = _stat(runs, [_dist_ratios(r) for r in runs], "log")
    low = table_stat(_cos_tables(runs, ("nca",)), lambda m: m[:, 0].min(-1), "log1m")
    crit = (
        f"relative to this model's base: at every decoder layer (1 − c_NCA) / (1 − c_base) ≤ {PAPER_DIST_RATIO:.4f} "
        f"= (1 − {NCA_COSINE_FLOOR}) / (1 − {PAPER_BASE_COSINE}), the share of the base's distance the paper's "
        f"NCA leaves (36-layer Qwen3-4B); per seed and item, max over layers, log scale; {RULE}"
    )
    measured = (
        f"NCA / base two-view distance, worst layer {fmt_stat(st, 4)}; NCA's lowest layer cosine {fmt_stat(low, 4)}"
    )
    if st["mean"] is None:
        return _row(measured, NA, crit, "n/a")
    if deaf := pre.nca_alive(runs):
        return _row(f"{measured}; {deaf[1]}", deaf[0], crit, "n/a")
    return _row(
        measured, decide(st, PAPER_DIST_RATIO, "<="), crit, f"NCA / base distance at its worst layer {fmt_stat(st, 4)}"
    )


def lens_sites(study: RunSet) -> list[int]:
    """Indices into `claim_rules.lens_kls` of the sites the lens claim reads: every decoder layer but the last (whose
    lens IS the output) and the output, where the BASE's two views differ materially (its KL there ≥
    `LENS_BASE_SHARE` × its output KL, which must be ≥ `LENS_BASE_OUTPUT`)."""
    base = lens_kls(study, "base")
    if not base or base[-1] < LENS_BASE_OUTPUT:  # the context barely moves the base's prediction: nothing to read
        return []
    keep = [i for i in range(len(base)) if i != len(base) - 2 or len(base) < 2]  # drop the last layer, keep output
    return [i for i in keep if base[i] >= LENS_BASE_SHARE * base[-1]]


def _lens_site(i: int, n: int) -> str:
    return "final_norm" if i == n - 1 else f"layers.{i}.resid_post"


def claim_nca_lens(runs: Sequence[RunSet]) -> Row:
    """At every site where the base's views differ, paired per seed and item: KL_NCA / KL_OPD < 1."""
    crit = (
        f"logit-lens KL(p_c ‖ p_x) between views, paired per seed and item: NCA / OPD < 1 at every site where the "
        f"base's views differ (base KL ≥ {LENS_BASE_SHARE:g} × its output KL; the last decoder layer is the "
        f"output, counted once); {RULE}"
    )
    per = [(lens_sites(r), lens_kls(r, "opd"), lens_kls(r, "nca")) for r in runs]
    if any(not o or not n for _, o, n in per):
        return _row("n/a", NA, crit, "n/a")
    sites = sorted(set.intersection(*(set(s) for s, _, _ in per)))
    if not sites:
        return _row("the base's views differ at no site", NA, crit, "n/a")
    n_all = len(per[0][1])
    names = {i: "output" if i == n_all - 1 else f"layer {i}" for i in sites}
    tables = probe_tables(
        runs, "lens_examples.csv", "kl_sum", ("opd", "nca"), lambda r: [_lens_site(i, n_all) for i in sites]
    )  # read once, every site's column
    stats = {}
    for k, i in enumerate(sites):  # per item where the tables exist, else seed-level log ratios
        st = table_stat(tables, _site_ratio(k), "log")
        stats[i] = st if st["mean"] is not None else _stat(runs, [_ratio(n[i], o[i]) for _, o, n in per], "log")
    d: Decision | str = all_of(*(decide(stats[i], 1.0, "<", names[i]) for i in sites))
    if deaf := pre.nca_alive(runs):  # NCA's loss pushes the views together; a deaf view does it trivially
        d = deaf[0]
    measured = (
        f"read {len(sites)} of {n_all} depths (the others: the base's views agree there); NCA/OPD lens KL "
        + ", ".join(f"{names[i]} {fmt_stat(stats[i], 3)}" for i in sites)
        + (f"; {deaf[1]}" if deaf else "")
    )
    return _row(measured, d, crit, f"NCA/OPD lens KL at the output {fmt_stat(stats[sites[-1]], 3)}")


def _grad(study: RunSet) -> tuple[float | None, float | None]:
    """(|cos(∇OPD, ∇NCA)|, split-half null cos) of the gradients probe at the OPD checkpoint."""
    g = probe_result("gradients", study.probes_dir)
    if g is None or g.model != study.name("opd") or not math.isfinite(g.cos):
        return None, None
    return abs(g.cos), (g.null_cos if math.isfinite(getattr(g, "null_cos", math.nan)) else None)


def _converged(study: RunSet) -> bool | None:
    return pre.converged(study)


def claim_orthogonal(runs: Sequence[RunSet]) -> Row:
    """|cos(∇OPD, ∇NCA)| ≤ 0.1 at an OPD-CONVERGED checkpoint (the paper's reading; a seed whose OPD did not converge
    is counted apart, never a veto), measurable where OPD's own split-half null exceeds it."""
    ok = [r for r in runs if _converged(r) is not False]
    per = [_grad(r) for r in ok]
    cos = _stat(runs, [c for c, _ in per], "logit")  # |cos| in (0, 1): its interval stays there
    null = _stat(runs, [n for _, n in per], "fisher")  # a cosine in (−1, 1): its interval stays there
    gap = {**seed_stat([None if c is None or n is None else n - c for c, n in per]), "of": len(runs)}
    crit = (
        f"at the OPD checkpoint (gradients probe) of the seeds where OPD converged relative to its teacher (Acc_x ≥ "
        f"{pre.CONVERGED_SHARE:g} × the base's Acc_xc): "
        f"|cos(∇OPD, ∇NCA)| ≤ {ORTHOGONAL_ABS_COS}; {RULE}; measurable where the OPD gradient is not noise: its "
        "split-half null cos(∇OPD[even], ∇OPD[odd]) exceeds |cos| (paired per seed)"
    )
    skipped = len(runs) - len(ok)
    measured = f"|cos| {fmt_stat(cos)}; split-half null {fmt_stat(null)}; null − |cos| {fmt_stat(gap, signed=True)}" + (
        f"; {skipped} of {len(runs)} seeds left out: OPD did not converge there" if skipped else ""
    )
    if not ok:
        return _row(measured, pre.NA_UNCONVERGED, crit, "n/a")
    if cos["mean"] is None or gap["mean"] is None:
        return _row(measured, NA, crit, "n/a")
    signal = decide(gap, 0.0, ">", "null − |cos|")
    if signal.verdict == FAILS:
        return _row(measured, NA + " (the OPD gradient cannot be told from noise here)", crit, "n/a")
    return _row(
        measured,
        all_of(signal, decide(cos, ORTHOGONAL_ABS_COS, "<=", "|cos|")),
        crit,
        f"|cos| {fmt_stat(cos)} against a split-half null of {fmt_stat(null)}",
    )


def _normed(runs: Sequence[RunSet], ratio: Callable, null: Callable) -> dict[str, dict[str, dict[str, Any]]]:
    """Per model: the raw ratio, its Adam null and ratio / null over seeds (log-ratio t-intervals)."""
    out = {}
    for m in ("opd", "nca"):
        raw, nul = [ratio(r, m) for r in runs], [null(r, m) for r in runs]
        out[m] = {
            "raw": _stat(runs, raw, "log"),
            "null": _stat(runs, nul, "log"),
            "over": _stat(runs, [over_null(a, b) for a, b in zip(raw, nul)], "log"),
        }
    return out


def _null_cells(stats: dict[str, dict[str, dict[str, Any]]], what: str) -> str:
    return ", ".join(
        f"{m} {what} {fmt_stat(s['raw'], 2)} (Adam null {fmt_stat(s['null'], 2)}; ÷ null {fmt_stat(s['over'], 2)})"
        for m, s in stats.items()
    )


def claim_shallow(runs: Sequence[RunSet]) -> Row:
    """Shallow/deep update ratio over its Adam null ≥ `CONCENTRATED` for OPD AND for NCA (log-ratio interval on
    each); needs ≥ 6 decoder layers."""
    stats = _normed(runs, depth_ratio, null_depth_ratio)
    norms = update_norms(runs[0], "opd")
    depth = len(norms[0]) if norms else 0
    crit = (
        f"‖ΔW‖/‖W0‖ of the first third of the layers over the last third, divided by its optimiser null (the same "
        f"ratio of 1/rms(W0): what Adam's ~lr-per-coordinate step gives any objective), ≥ {CONCENTRATED} for OPD and "
        f"NCA (concentrated: a stated convention; log-ratio interval); {RULE}; needs ≥ {MIN_LAYERS_FOR_DEPTH} "
        f"decoder layers"
    )
    measured = f"{depth} decoder layers; " + _null_cells(stats, "shallow/deep")
    if norms is not None and (shallow := pre.depth(depth)):
        return _row(measured, shallow[0], crit, "n/a")
    if any(s["over"]["mean"] is None for s in stats.values()):
        return _row(measured, NA, crit, "n/a")
    return _row(
        measured,
        all_of(*(decide(s["over"], CONCENTRATED, ">=", f"{m} ÷ null") for m, s in stats.items())),
        crit,
        ", ".join(f"{m} shallow/deep ÷ null {fmt_stat(s['over'], 2)}" for m, s in stats.items()),
    )


def claim_qk(runs: Sequence[RunSet]) -> Row:
    """q,k / other-projection update ratio over its Adam null ≥ `CONCENTRATED` for OPD AND for NCA (log-ratio
    interval on each)."""
    stats = _normed(runs, qk_ratio, null_qk_ratio)
    crit = (
        f"mean ‖ΔW‖/‖W0‖ of q_proj, k_proj over that of v/o/gate/up/down_proj, divided by its optimiser null (the same "
        f"ratio of 1/rms(W0)), ≥ {CONCENTRATED} for OPD and NCA (concentrated: a stated convention — every module "
        f"moves; log-ratio interval); {RULE}"
    )
    measured = _null_cells(stats, "q,k / other")
    if any(s["over"]["mean"] is None for s in stats.values()):
        return _row(measured, NA, crit, "n/a")
    head = ", ".join(f"{m} q,k / other ÷ null {fmt_stat(s['over'], 2)}" for m, s in stats.items())
    return _row(
        measured, all_of(*(decide(s["over"], CONCENTRATED, ">=", f"{m} ÷ null") for m, s in stats.items())), crit, head
    )


def _degenerate(study: RunSet) -> list[str]:
    t = probe_result("teachability", study.probes_dir)
    return list((getattr(t, "degeneracy", None) or {}).get("reasons", [])) if t is not None else []


def claim_teachability(runs: Sequence[RunSet]) -> Row:
    """Paired per seed: quartile spread of D^L − that of raw KL > 0, over the seeds where the diagnostic can speak
    (degeneracy counted per seed, never a veto of the others)."""
    bad = {k: _degenerate(r) for k, r in enumerate(runs)}
    ok = [r for k, r in enumerate(runs) if not bad[k]]
    diff = {
        **seed_stat(
            [
                None
                if (a := quartile_spread(r, "DL")) is None or (b := quartile_spread(r, "kl_full")) is None
                else a - b
                for r in ok
            ]
        ),
        "of": len(runs),
    }
    crit = (
        f"mean gain of the top minus the bottom quartile, paired per seed: D^L's spread − raw KL's > 0; {RULE}; "
        "decided on the seeds where C carries information and the rescored model has not converged"
    )
    n_bad = sum(bool(v) for v in bad.values())
    why = "; ".join(sorted({w for v in bad.values() for w in v}))
    measured = f"D^L − raw KL spread {fmt_stat(diff, 3, True)} on {len(ok)} of {len(runs)} seeds" + (
        f"; degenerate on {n_bad}: {why}" if n_bad else ""
    )
    if not ok:
        return _row(measured, NA, crit, "n/a")
    if diff["mean"] is None:
        return _row(measured, NA, crit, "n/a")
    return _row(measured, decide(diff, 0.0, ">"), crit, f"D^L − raw KL spread {fmt_stat(diff, 3, True)}")


__all__ = [
    "NCA_COSINE_FLOOR",
    "ORTHOGONAL_ABS_COS",
    "LENS_BASE_SHARE",
    "claim_cosine_order",
    "claim_nca_cosine",
    "claim_nca_lens",
    "claim_orthogonal",
    "claim_shallow",
    "claim_qk",
    "claim_teachability",
    "lens_sites",
]
