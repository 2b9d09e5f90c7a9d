"""The aggregate report's probe section: the probes' headline numbers over the seed runs (mean and 95 % Student-t
interval over seeds on a scale that keeps the quantity in its range: log(1 − c) for cosines, log for KLs;
`mechopd.core.stats.scaled_stat`), read through each seed run's typed probe results by ROLE.

Two-view hidden-state cosine (docs/method.md §6, §7): ONE number per model, per decoder layer (``layers.{i}.resid_post``)
and its mean over decoder layers, the number the claims read; ``embed`` (1 by construction: both views embed the same
response tokens) and ``final_norm`` are reported apart and labelled. The logit-lens output KL between views, when
that probe ran. Each seed's full probe section is in its own ``report.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mechopd.core.stats import fmt_stat, scaled_stat
from mechopd.probes.registry import probe_result
from mechopd.report.mechanism_claims import localization_table, weightpatch_table
from mechopd.runset import RunSet

COSINE_ROLES = ("base", "opd", "nca")


def _cosines(study: RunSet) -> dict[str, tuple[list[float], dict[str, float]]]:
    """role -> (cosine after each decoder layer, the sites reported apart) of one seed run's similarity probe, read
    once; roles the probe did not cover are absent."""
    res = probe_result("similarity", study.probes_dir)
    out = {}
    for role in COSINE_ROLES:
        name = study.name(role)
        if res is not None and name is not None and res.per_layer.get(name):
            out[role] = (list(res.per_layer[name]), dict(res.apart.get(name, {})))
    return out


def cosine_table(runs: Sequence[RunSet]) -> list[str]:
    """Markdown rows: per model, the cosine after each decoder layer, their mean, and the sites reported apart."""
    per_seed = [_cosines(s) for s in runs]
    roles = [r for r in COSINE_ROLES if any(r in c for c in per_seed)]
    if not roles:
        return []
    layers = {r: [c[r][0] if r in c else [] for c in per_seed] for r in roles}
    aparts = {r: [c[r][1] if r in c else {} for c in per_seed] for r in roles}
    depth = max(len(v) for r in roles for v in layers[r])
    apart = sorted({site for r in roles for a in aparts[r] for site in a})
    head = [f"layer {i}" for i in range(depth)] + ["mean over decoder layers"] + [f"{site} (apart)" for site in apart]
    out = ["| model | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for role in roles:
        cos = lambda vals: fmt_stat(scaled_stat(vals, "log1m"), 4)  # noqa: E731  (the interval never passes 1)
        cells = [cos([v[i] if i < len(v) else None for v in layers[role]]) for i in range(depth)]
        cells.append(cos([_mean(v) for v in layers[role]]))
        cells += [cos([a.get(site) for a in aparts[role]]) for site in apart]
        out.append(f"| {runs[0].label(role)} | " + " | ".join(cells) + " |")
    return out


def _mean(vals: Sequence[float | None]) -> float | None:
    kept = [v for v in vals if v is not None]
    return sum(kept) / len(kept) if kept else None


def _over_seeds(
    runs: Sequence[RunSet], roles: Sequence[str], fn: Callable[[RunSet, str], float | None], digits: int = 4
) -> str:
    return "; ".join(
        f"{runs[0].label(r)} {fmt_stat(scaled_stat([fn(s, r) for s in runs], 'log'), digits)}"
        for r in roles
        if any(fn(s, r) is not None for s in runs)
    )


def _lens_output(study: RunSet, role: str) -> float | None:
    res, name = probe_result("lens", study.probes_dir), study.name(role)
    if res is None or name is None:
        return None
    kls = res.kl_by_depth(name)
    return kls[-1] if kls else None


def probe_lines(runs: Sequence[RunSet]) -> list[str]:
    """The aggregate report's "Mechanistic probes over seeds" section (empty when no seed run has probes)."""
    table = cosine_table(runs)
    lens = _over_seeds(runs, COSINE_ROLES, _lens_output)
    interventions = weightpatch_table(runs) + localization_table(runs)  # over seeds and items
    if not table and not lens:
        return interventions
    out = ["## Mechanistic probes over seeds", ""]
    if table:
        out += [
            "**Two-view hidden-state cosine** (per-token mean over the predicting positions, after each decoder "
            "layer, and "
            "their mean over decoder layers: the number the claims read; `embed` — 1 by construction, both views "
            "embed the same response tokens — and `final_norm` reported apart):",
            "",
            *table,
            "",
        ]
    if lens:
        out += [f"- Logit-lens output KL(p_c ‖ p_x) between views: {lens} (`seed-k/probes/lens.csv`, per depth)."]
    out += [
        "- Every probe of each seed (patching, attention, gradients, deltas, teachability): `seed-k/report.md`.",
        "",
        "Cells: mean over seeds [95 % Student-t interval over seeds, made on log(1 − c) for cosines and on log "
        "for KLs (geometric means), so no interval leaves the quantity's range].",
        "",
    ]
    return out + interventions
