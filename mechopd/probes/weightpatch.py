"""Weight patching: which WEIGHTS carry the internalised context and the harm (docs/method.md "Interventions and update
geometry").

For a trained model θ, a donor θ_D (default the base W0; or another checkpoint such as NCA) and a row r = (layer,
module group) (`mechopd.probes.weightpatch_plan`), θ^r is θ with the row's parameters set to the donor's. Both views
of the same held-out items are decoded greedily by the evaluation itself (`evaluate.evaluate_model`: the one sampler,
the task's scorer) for θ (row ``layer = none``) and every θ^r:

    Acc_x(r), Acc_xc(r), Harm(r) = P(wrong with c | right without c)   (removability.summarize, paired bootstrap)
    d_acc_x(r) = Acc_x(r) − Acc_x(none)   d_acc_xc(r), d_harm(r) likewise: paired over the SAME item resamples
                 (`removability.resample_blocks`), so their intervals are those of the differences
    follow_other(r)   with ``follow`` and a task with other contexts (`following.add_following`)

Reverting a group to W0 that lowers Acc_x removes internalised rule; one that lowers Harm removes the harm.
The q/k question is causal through the matched controls ``vo`` (same parameter count) and ``ctrl_qk`` (random rows of
the other matrices, same count): `WeightpatchSummary.qk_control`.

Files: ``weightpatch.csv`` (`COLUMNS`), ``weightpatch_items.jsonl`` (per item: ``uid``, ``prompt_ids_x``,
``prompt_ids_c``, ``response_ids`` = the unpatched first model's greedy no-context reply, and ``outcomes``: per model
and row key ``layer/module[/draw]`` the pair [correct_x, correct_xc]), ``weightpatch.json`` (settings + summary).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mechopd.core.artifacts import read_float, write_csv
from mechopd.core.errors import ConfigError, DataError
from mechopd.core.options import GE0, GE1, option
from mechopd.evaluation.removability import batched_metrics, paired_arrays, resample_blocks
from mechopd.models import num_layers
from mechopd.probes import causal_items as ci
from mechopd.probes.options import Role, models_option, normalise
from mechopd.probes.registry import ProbeSpec, register_probe
from mechopd.probes.weightpatch_plan import (
    ALL,
    CONTROL,
    MODULES,
    NONE,
    Donor,
    Row,
    parse_layers,
    parse_modules,
    patched,
    plan_rows,
)

DELTAS = ("acc_x", "acc_xc", "harm")  # the paired differences a row reports

COLUMNS = (
    "model",
    "donor",
    "layer",
    "module",
    "draw",
    "n_params",
    "n",
    "acc_x",
    "acc_x_low",
    "acc_x_high",
    "acc_xc",
    "acc_xc_low",
    "acc_xc_high",
    "harm",
    "harm_low",
    "harm_high",
    "help",
    "both_correct",
    *(f"d_{m}{s}" for m in DELTAS for s in ("", "_low", "_high")),
    "follow_other",
    "follow_other_low",
    "follow_other_high",
    "regime",
)


@dataclass(frozen=True)
class WeightpatchOptions:
    """`mechopd probe weightpatch`'s options (`mechopd.probes.options`)."""

    models: list[Role] | None = models_option("trained models to patch (default: every trained model of the run)")
    donor: Role = option(
        "base", "whose weights go in: a label of the run (base, nca, ...) or a checkpoint dir (base reverts to W0)"
    )
    layers: str | None = option(None, "comma-separated decoder layers and/or 'all' (default: every layer, then all)")
    modules: Sequence[str] = option(
        MODULES,
        "module groups: q_proj,k_proj,v_proj,o_proj, qk, vo, attn (all four), mlp "
        "(gate/up/down), norms, ctrl_qk (random rows of v/o/gate/up/down with q+k's parameter "
        "count: the matched control)",
    )
    draws: int = option(3, "draws of ctrl_qk", flag="--control-draws", range=GE1)
    follow: bool = option(
        False, "also follow_other per row (the task's other contexts; one more generation per item and context)"
    )
    n_boot: int = option(1000, "paired bootstrap resamples", range=GE0)

    def __post_init__(self) -> None:  # the lists' syntax before any model loads (the layers' range once it is known)
        normalise(self, modules=lambda text, flag: parse_modules(text))
        if self.layers is not None:
            parse_layers(self.layers, 1 << 30)


def run_weightpatch(
    setup: Any, out_dir: str | Path, opts: WeightpatchOptions | None = None, *, progress: bool = True
) -> list[str]:
    """`mechopd probe weightpatch`: every model (default: the run's trained models) patched row by row from
    ``opts.donor`` (a label or dir, default ``base``); writes weightpatch.csv / .json / _items.jsonl; returns the
    lines `mechopd probe weightpatch` prints. ``opts.layers`` is read against each model's depth (``all``, negative
    indices); its syntax was checked when ``opts`` was built."""
    from mechopd.evaluation.evaluate import EvalConfig

    opts = opts or WeightpatchOptions()
    module_list, layers, draws, n_boot, follow = list(opts.modules), opts.layers, opts.draws, opts.n_boot, opts.follow
    if draws < 1 or n_boot < 0:
        raise ConfigError(f"weightpatch: --control-draws {draws} must be >= 1 and --n-boot {n_boot} >= 0")
    if setup.split not in (None, "test"):
        raise ConfigError("weightpatch evaluates held-out items: drop --split (or pass --split test)")
    donor_label, donor_dir = setup.model(opts.donor, "base")
    picked = setup.pick(opts.models, setup.trained or [k for k in setup.models if k != "teacher"])
    setup = setup.replace(responses_from=next(iter(picked)))
    run = ci.resolve(setup, picked, probe="weightpatch", out=out_dir, greedy=True)
    cfg = EvalConfig(n=len(run.items.examples), seed=setup.seed, n_boot=n_boot)
    _check_items(run, cfg)
    src, table, outcomes = Donor(donor_dir), [], {}
    for label, model in run.each_model():
        rows = plan_rows(model, parse_layers(layers, num_layers(model)), module_list, draws, setup.seed)
        t, o = weightpatch_model(model, run, label, src, donor_label, rows, cfg, follow, progress)
        table += t
        outcomes[label] = o
    out = Path(out_dir)
    write_csv(out / "weightpatch.csv", table, COLUMNS)
    records = ci.item_records(
        run,
        outcomes=[
            {m: {k: v[i] for k, v in o.items()} for m, o in outcomes.items()} for i in range(len(run.items.examples))
        ],
    )
    settings = run.settings(
        donor=donor_label,
        donor_path=donor_dir,
        modules=module_list,
        layers=layers,
        draws=draws,
        follow=follow,
        n_boot=n_boot,
        decoding="greedy, both views (evaluate.evaluate_model)",
    )
    ci.save(out, "weightpatch", run, settings, summarize(table), records)
    return [f"weightpatch table: {out / 'weightpatch.csv'}"] + WeightpatchSummary.load(out).lines()


def _check_items(run, cfg) -> None:
    """The evaluation draws task.examples("test", n, seed): the items the runner saved, checked uid by uid."""
    drawn = [e.uid for e in run.task.examples("test", cfg.n, cfg.seed)]
    if drawn != [e.uid for e in run.items.examples]:
        raise DataError(
            "weightpatch: the evaluation's held-out items differ from the probe's items; rerun without --split"
        )


# --------------------------------------------------------------------------------------------------------- summary
def _f(v: Any) -> float | None:
    x = read_float(v) if isinstance(v, str) else v
    return None if x is None or x != x else float(x)


def qk_control(rows: Sequence[Mapping[str, Any]], model: str, layer: str = ALL) -> dict[str, Any] | None:
    """The matched-parameter comparison at ``layer`` for ``model``: per group (qk, vo, ctrl_qk = mean over draws)
    the drop in Acc_x (−d_acc_x: internalised rule removed) and in Harm (−d_harm), and the parameter counts."""
    mine = [r for r in rows if r["model"] == model and str(r["layer"]) == layer]
    out: dict[str, Any] = {"layer": layer}
    for group in ("qk", "vo", CONTROL):
        g = [r for r in mine if r["module"] == group]
        if not g:
            continue
        mean = lambda key, g=g: (lambda v: float(np.mean(v)) if v else None)(  # noqa: E731
            [x for x in (_f(r[key]) for r in g) if x is not None]
        )
        dx, dh = mean("d_acc_x"), mean("d_harm")
        out[group] = {
            "rule_removed": None if dx is None else 0.0 - dx,
            "harm_removed": None if dh is None else 0.0 - dh,
            "n_params": int(float(g[0]["n_params"])),
            "draws": len(g),
        }
    return out if "qk" in out else None


def _top(rows: Sequence[Mapping[str, Any]], model: str, key: str, k: int = 3) -> list[dict[str, Any]]:
    scored = [(x, r) for r in rows if r["model"] == model and r["layer"] != NONE and (x := _f(r[key])) is not None]
    mine = [r for _, r in sorted(scored, key=lambda xr: -abs(xr[0]))]  # stable, as the sort of the rows was
    return [
        {
            "layer": r["layer"],
            "module": r["module"],
            "draw": r["draw"],
            key: _f(r[key]),
            "acc_x": _f(r["acc_x"]),
            "acc_xc": _f(r["acc_xc"]),
            "harm": _f(r["harm"]),
        }
        for r in mine[:k]
    ]


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    models = list(dict.fromkeys(r["model"] for r in rows))
    return {
        "models": models,
        "donor": rows[0]["donor"] if rows else None,
        "unpatched": {
            m: {k: _f(r[k]) for k in ("acc_x", "acc_xc", "harm")}
            for m in models
            for r in rows
            if r["model"] == m and r["layer"] == NONE
        },
        "top_acc_x": {m: _top(rows, m, "d_acc_x") for m in models},
        "top_harm": {m: _top(rows, m, "d_harm") for m in models},
        "qk_control": {m: qk_control(rows, m) for m in models},
    }


class WeightpatchSummary(ci.CausalSummary):
    """The weight-patching result: ``value(model, layer, module, key)``, ``qk_control(model)`` and ``lines()``."""

    PROBE = "weightpatch"

    def value(self, model: str, layer: str, module: str, key: str) -> float | None:
        row = next((r for r in self.rows if (r["model"], r["layer"], r["module"]) == (model, layer, module)), None)
        return None if row is None else _f(row[key])

    def qk_control(self, model: str, layer: str = ALL) -> dict[str, Any] | None:
        return qk_control(self.rows, model, layer)

    def lines(self) -> list[str]:
        s, out = self.summary, []
        for m in s["models"]:
            u = s["unpatched"].get(m) or {}
            top = s["top_acc_x"].get(m) or []
            parts = [f"{t['layer']}/{t['module']} Acc_x {_fmt(t['acc_x'])}, Harm {_fmt(t['harm'])}" for t in top]
            out.append(
                f"- **Weight patching** {m} ← {s['donor']} (`probes/weightpatch.csv`): unpatched Acc_x "
                f"{_fmt(u.get('acc_x'))}, Acc_xc {_fmt(u.get('acc_xc'))}, Harm {_fmt(u.get('harm'))}; "
                f"largest Acc_x changes: {'; '.join(parts) or 'none'}"
            )
            qk = s["qk_control"].get(m)
            if qk and CONTROL in qk:
                out.append(
                    f"  - reverting q_proj+k_proj ({qk['layer']} layers, {qk['qk']['n_params']} parameters) "
                    f"removes rule {_fmt(qk['qk']['rule_removed'], '+.3f')} / harm "
                    f"{_fmt(qk['qk']['harm_removed'], '+.3f')}; v+o: rule "
                    f"{_fmt((qk.get('vo') or {}).get('rule_removed'), '+.3f')}; random rows of the other "
                    f"matrices ({qk[CONTROL]['n_params']} parameters, mean of {qk[CONTROL]['draws']}): rule "
                    f"{_fmt(qk[CONTROL]['rule_removed'], '+.3f')} / harm "
                    f"{_fmt(qk[CONTROL]['harm_removed'], '+.3f')}"
                )
        return out


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "n/a" if v is None else format(v, spec)


register_probe(
    ProbeSpec(
        "weightpatch",
        "revert (or transplant) weights per layer x module group to a donor's, re-evaluate both views",
        run_weightpatch,
        options=WeightpatchOptions,
        order=90,
        outputs=("weightpatch.csv", "weightpatch.json", "weightpatch_items.jsonl"),
        demo={"models": ["opd"], "donor": "base", "layers": "all", "modules": "qk,vo,attn,mlp,ctrl_qk"},
        role_options=("models", "donor"),
        summary=WeightpatchSummary,
    )
)


# ------------------------------------------------------------------- evaluating one model under the plan's rows
# Every row patched in place from the donor, both views decoded by the evaluation itself, and the row's differences
# to the unpatched model paired over the same item resamples:
#     d_acc_x(r) = Acc_x(r) − Acc_x(none)   d_acc_xc(r), d_harm(r) likewise (`removability.resample_blocks`)


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
