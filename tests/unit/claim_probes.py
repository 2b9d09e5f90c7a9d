"""The probe artifacts of the synthetic claim runs (tests/unit/claim_runs.py): gradients, similarity, lens, deltas,
weight patching, the deltas' SVD, localization and teachability, each as the claim rows read it and written through
the probe's own writer where it has one; and the paired per-item records (`records`) that both the runs' evaluation
reports and weight patching's per-item outcomes are built from."""

from __future__ import annotations

import json
from pathlib import Path

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
N = 200


def records(acc_x: float, acc_xc: float, harm: float | None) -> list[dict]:
    """N paired records with (as near as N allows) these Acc_x, Acc_xc and Harm."""
    rx = round(acc_x * N)
    harmed = round((harm or 0.0) * rx)
    helped = min(max(round(acc_xc * N) - (rx - harmed), 0), N - rx)
    out = []
    for i in range(N):
        cx = i < rx
        cxc = (i >= harmed) if cx else (i - rx < helped)
        out.append({"uid": f"u{i:03d}", "sample": 0, "correct_x": cx, "correct_xc": cxc, "len_x": 5, "len_xc": 5})
    return out


def _seed(spec: dict) -> float:
    """Seed k's factor on its seed-level probe values, 1 + 0.002 k (``spec["seed"]``, set by `claim_runs.seed_runs`):
    seeds vary, as trained ones do (identical seeds make no interval)."""
    return 1 + 0.002 * spec.get("seed", 0)


def write_probes(run: Path, spec: dict) -> None:
    """Every probe artifact a claim row reads, under ``run/probes``."""
    probes = run / "probes"
    _write_gradients(probes, spec)
    _write_similarity_and_lens(probes, spec)
    _write_deltas(probes / "deltas.csv", spec)
    if spec["wp"] is not None:
        _write_weightpatch(probes, spec["wp"])
    if spec["svd"] is not None:
        _write_svd(probes, spec["svd"], spec)
    if spec["loc"] is not None:
        _write_localization(probes, spec["loc"])
    _write_teachability(probes, spec)


def _write_gradients(probes: Path, spec: dict) -> None:
    """gradients.json at the OPD checkpoint: |cos(∇OPD, ∇NCA)| and its split-half null (``spec["gcos"]``)."""
    cos, null = spec["gcos"]
    cos, null = cos * _seed(spec), null * _seed(spec)
    (probes / "gradients.json").write_text(
        json.dumps(
            {
                "term_a": "opd",
                "term_b": "nca",
                "model": "opd",
                "cos": cos,
                "norm_ratio": 0.5,
                "value_a": 0.1,
                "value_b": 0.2,
                "response_tokens": 100,
                "null_cos": null,
            }
        )
    )


def _write_similarity_and_lens(probes: Path, spec: dict) -> None:
    """similarity.csv / .json and lens.csv / .json per model and layer (``spec["cos"]``, ``spec["lens"]``), and their
    per-item tables (`_examples`)."""
    with (probes / "similarity.csv").open("w") as fh:
        fh.write("model,site,layer,cos_mean\n")
        for j, (model, vals) in enumerate(spec["cos"].items()):  # seeds vary, not in lockstep across models
            fh.write(f"{model},embed,,1.0\n")
            fh.writelines(
                f"{model},layers.{i}.resid_post,{i},{1 - (1 - v) * _seed(spec) ** (j + 1)}\n"
                for i, v in enumerate(vals)
            )
    _examples(probes, spec)
    (probes / "similarity.json").write_text(
        json.dumps({"models": list(spec["cos"]), "mean_cos": {}, "sites": [], "responses_from": "opd", "n_items": 1})
    )
    with (probes / "lens.csv").open("w") as fh:
        fh.write("model,site,depth,kl_c_x\n")
        for j, (model, vals) in enumerate(spec["lens"].items()):
            sites = ["embed"] + [f"layers.{i}.resid_post" for i in range(len(vals) - 1)] + ["final_norm"]
            vals = [v * _seed(spec) ** (j + 1) for v in vals]
            fh.writelines(f"{model},{s},{d},{v}\n" for d, (s, v) in enumerate(zip(sites, [0.0, *vals])))
    (probes / "lens.json").write_text(
        json.dumps(
            {
                "probe": "lens",
                "settings": {},
                "summary": {"models": list(spec["lens"]), "output_kl": {}, "promoted": {}},
            }
        )
    )


def _write_teachability(probes: Path, spec: dict) -> None:
    """teachability_summary.json: the gain buckets per signal (``spec["spread"]``) and the degeneracy reasons."""
    buckets = {
        sig: [{"quartile": 1, "mean_gain_abs": 1.0}, {"quartile": 4, "mean_gain_abs": 1.0 + spread * _seed(spec)}]
        for sig, spread in spec["spread"].items()
    }
    (probes / "teachability_summary.json").write_text(
        json.dumps(
            {
                "buckets": buckets,
                "n_tokens": 1,
                "n_sequences": 1,
                "means": {},
                "gap": {},
                "regression": {},
                "degeneracy": {"reasons": spec["degenerate"]},
            }
        )
    )


def _examples(probes: Path, spec: dict, items: int = 8) -> None:
    """The per-item tables the cosine and lens rows bootstrap over (items spread ±2 % around the layer's value, 5 tokens each;
    ``spec["per_item"] = False`` leaves them out: the rows fall back to the seed-level rule)."""
    if not spec.get("per_item", True):
        return
    with (probes / "similarity_examples.csv").open("w") as fh:
        fh.write("model,example,uid,site,depth,layer,n_tokens,cos_mean\n")
        for j, (model, vals) in enumerate(spec["cos"].items()):
            fh.writelines(
                f"{model},{k},u{k:03d},layers.{i}.resid_post,{i + 1},{i},5,{1 - (1 - v) * _spread(k, items, j)}\n"
                for k in range(items)
                for i, v in enumerate(vals)
            )
    with (probes / "lens_examples.csv").open("w") as fh:
        fh.write("model,example,uid,site,n_tokens,kl_sum\n")
        for j, (model, vals) in enumerate(spec["lens"].items()):
            sites = [f"layers.{i}.resid_post" for i in range(len(vals) - 1)] + ["final_norm"]
            fh.writelines(
                f"{model},{k},u{k:03d},{s},5,{5 * v * _spread(k, items, j)}\n"
                for k in range(items)
                for s, v in zip(sites, vals)
            )


def _spread(k: int, items: int, model: int, share: float = 0.02) -> float:
    """Item k's factor on its layer's value for the model numbered ``model``: spread ±share around 1, mean 1 over the
    items, in another item order per model (items vary, as measured ones do, and not in lockstep across models: a
    table of identical items has no informative unit)."""
    k = (k + 3 * model) % items
    return 1 + share * (2 * k - (items - 1)) / (items - 1)


def _write_deltas(path: Path, spec: dict) -> None:
    """Per-tensor rows (weight only) through the probe's own writer, as `mechopd probe deltas` writes them."""
    from mechopd.probes.delta_rows import DeltaRow, write_table
    from mechopd.probes.deltas import summarize_deltas

    rows = []
    for i in range(spec["layers"]):
        for mod in MODULES:
            site, w0 = f"layers.{i}.{mod}", spec.get("qk_w0", 2.0) if mod in ("q_proj", "k_proj") else 2.0
            rows.append(DeltaRow("base", "", site, i, mod, "weight", 4, "", "w0_norm", w0))
            for model, rel in spec["update"].items():
                rel *= (spec["qk_factor"] if mod in ("q_proj", "k_proj") else 1.0) * spec["shallow_factor"] ** -i
                rel *= _seed(spec) if mod in ("q_proj", "k_proj") or i == 0 else 1.0  # the ratios vary by seed
                rows.append(DeltaRow(model, "base", site, i, mod, "weight", 4, "", "delta_norm", rel * w0))
    write_table(rows, path)
    summarize_deltas(rows, None, {}).save(path.parent)


def _write_weightpatch(probes: Path, wp: dict) -> None:
    """weightpatch.csv / .json / _items.jsonl of OPD as the probe writes them: per row its per-item outcomes
    (`records`), the table's point values from them; the control ctrl_qk with two draws."""
    from mechopd.core.artifacts import write_csv, write_json, write_jsonl
    from mechopd.evaluation.removability import batched_metrics, paired_arrays
    from mechopd.probes.weightpatch import COLUMNS, summarize

    plan = [
        ("none", "none", "", wp["none"]),
        ("all", "qk", "", wp["qk"]),
        ("all", "vo", "", wp["vo"]),
        *(("all", "ctrl_qk", j, wp["ctrl"]) for j in range(2)),
    ]
    ref = None
    rows, outcomes = [], {}
    for layer, module, draw, (ax, axc, harm) in plan:
        recs = records(ax, axc, harm)
        m = {k: float(v[0]) for k, v in batched_metrics(*(x[None] for x in paired_arrays(recs))).items()}
        ref = ref or m
        row = {c: None for c in COLUMNS}
        row.update(
            model="opd",
            donor="base",
            layer=layer,
            module=module,
            draw=draw,
            n_params=100,
            n=N,
            acc_x=m["acc_x"],
            acc_xc=m["acc_xc"],
            harm=m["harm"],
            d_acc_x=m["acc_x"] - ref["acc_x"],
            d_acc_xc=m["acc_xc"] - ref["acc_xc"],
            d_harm=m["harm"] - ref["harm"],
        )
        rows.append(row)
        outcomes[f"{layer}/{module}" + (f"/{draw}" if draw != "" else "")] = [
            [r["correct_x"], r["correct_xc"]] for r in recs
        ]
    write_csv(probes / "weightpatch.csv", rows, COLUMNS)
    write_json(probes / "weightpatch.json", {"probe": "weightpatch", "settings": {}, "summary": summarize(rows)})
    write_jsonl(
        probes / "weightpatch_items.jsonl",
        [
            {
                "uid": f"u{i:03d}",
                "prompt_ids_x": [1],
                "prompt_ids_c": [2, 1],
                "response_ids": [3],
                **({"outcomes": {"opd": {k: v[i] for k, v in outcomes.items()}}} if wp.get("items", True) else {}),
            }
            for i in range(N)
        ],
    )


def svd_rows(mlp_dsq: float, e90: float, overlap: float) -> list[dict]:
    """deltas_svd rows of OPD: one attention matrix (q_proj, ‖ΔW‖² 1) and one MLP matrix (down_proj, ‖ΔW‖² mlp_dsq)."""
    fixed = {"model": "opd", "vs": "base", "layer": 0, "rows": 16, "cols": 16, "k": 4, "eff_rank": 3.0}
    fixed.update({"topk_energy": 0.9, "frac_above_0.01": 1.0, "frac_above_0.1": 0.5, "frac_above_1": 0.0})
    return [
        {
            **fixed,
            "site": f"layers.0.{module}",
            "module": module,
            "energy90_frac": e90,
            "overlap_k": overlap,
            "overlap_random": 0.25,
            "delta_sq": dsq,
            "w0_sq": 10.0,
        }
        for module, dsq in (("q_proj", 1.0), ("down_proj", mlp_dsq))
    ]


def _write_svd(probes: Path, svd: dict, spec: dict) -> None:
    """deltas_svd.csv / .json of OPD (one attention and one MLP matrix) through the probe's summary."""
    from mechopd.core.artifacts import write_csv, write_json
    from mechopd.probes.delta_svd import COLUMNS, CSV, JSON, summarize_svd

    rows = svd_rows(svd["mlp"] * _seed(spec), svd["e90"] * _seed(spec), svd["overlap"] * _seed(spec))
    write_csv(probes / CSV, rows, COLUMNS)
    write_json(probes / JSON, {"settings": {}, "summary": summarize_svd(rows)})


def _write_localization(probes: Path, loc: dict, n: int = 40) -> None:
    """localization.csv / .json / _items.jsonl of OPD (donor: its own no-context view; every item right without c)
    through the probe's own row writer."""
    import numpy as np

    from mechopd.core.artifacts import write_csv, write_json, write_jsonl
    from mechopd.probes.localization import COLUMNS, curve_rows, removed_at

    sites = ("embed", "layers.0.resid_post", "final_norm")
    right, clean = np.ones(n, bool), np.arange(n) < round(loc["clean"] * n)
    flips = {s: np.arange(n) < round(h * n) for s, h in zip(sites, loc["sites"])}
    rows = curve_rows("opd", "x", right, clean, flips, 1, 50, 0)
    write_csv(probes / "localization.csv", rows, COLUMNS)
    write_json(
        probes / "localization.json",
        {
            "probe": "localization",
            "settings": {},
            "summary": {
                "model": "opd",
                "donor": "x",
                "harm_clean": rows[0]["harm_clean"],
                "n_right": n,
                "removed_share": 0.9,
                "removed_at": removed_at(rows, 0.9),
            },
        },
    )
    write_jsonl(
        probes / "localization_items.jsonl",
        [
            {
                "uid": f"u{i:03d}",
                "prompt_ids_x": [1],
                "prompt_ids_c": [2, 1],
                "response_ids": [3],
                "right_x": True,
                "flips_clean": bool(clean[i]),
                "flips": {s: bool(f[i]) for s, f in flips.items()},
            }
            for i in range(n)
        ],
    )
