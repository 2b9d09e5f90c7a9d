"""Synthetic seed runs for the claims tests: per-item evaluation records (both views, other contexts with their reply
classes) whose summaries are the library's own (`removability.summarize`, `following.summarize_following`), and the
probe artifacts every claim row reads, written through the probes' own writers where they have one."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from mechopd.evaluation.following import apply_retention, summarize_following
from mechopd.evaluation.removability import summarize

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
METHODS = ["opd", "nca", "nca_const", "ta_opd", "nca_follow"]
TRAINED, HELD = ["shift:2", "shift:3"], ["repeat:2", "reverse"]  # the follow run's contexts / the held-out ones
N = 200

# A study where every claim holds (on one seed and on several); each test perturbs one field.
GOOD: dict = {
    "acc_x": {"base": 0.0, "opd": 0.95, "nca": 0.96, "nca_const": 0.9, "ta_opd": 0.95, "nca_follow": 0.96},
    "acc_xc": {"base": 1.0, "opd": 0.65, "nca": 0.96, "nca_const": 0.9, "ta_opd": 0.8, "nca_follow": 0.96},
    "harm": {"base": None, "opd": 0.3, "nca": 0.0, "nca_const": 0.0, "ta_opd": 0.15, "nca_follow": 0.0},
    # other contexts: per role, the share of replies that follow (trained / held-out contexts), then stick, compose
    "follow": {
        "base": (1.0, 1.0),
        "opd": (0.9, 0.9),
        "nca": (0.95, 0.95),
        "nca_const": (0.5, 0.5),
        "ta_opd": (0.9, 0.9),
        "nca_follow": (0.95, 0.9),
    },
    "stick": {},
    "compose": {},
    "follow_contexts": TRAINED,
    "cos": {"base": [0.9, 0.8, 0.7], "opd": [0.99, 0.97, 0.95], "nca": [0.999, 0.998, 0.9975]},
    "lens": {"base": [0.05, 2.0, 3.0, 3.0], "opd": [0.04, 0.5, 0.6, 0.6], "nca": [0.04, 0.05, 0.1, 0.1]},
    "gcos": (0.02, 0.4),  # |cos(∇OPD, ∇NCA)| and the split-half null at the OPD checkpoint
    "layers": 3,
    "update": {"opd": 0.1, "nca": 0.2},  # relative update of every parameter; q/k get qk_factor times that
    "qk_factor": 2.0,
    "shallow_factor": 1.0,  # relative update of layer i scaled by shallow_factor ** -i
    "spread": {"DL": 5.0, "kl_full": 2.0},
    "degenerate": [],
    "kept": 0.1,
    # weight patching of OPD (every layer): per row (acc_x, acc_xc, harm) of the patched model; "items": False leaves
    # the per-item outcomes out of weightpatch_items.jsonl (an items file of an older probe)
    "wp": {
        "none": (0.95, 0.65, 0.3),
        "qk": (0.2, 0.2, 0.0),
        "vo": (0.9, 0.6, 0.3),
        "ctrl": (0.93, 0.63, 0.3),
        "items": True,
    },
    # OPD's update geometry (deltas --svd): MLP ‖ΔW‖² per unit of q_proj's, energy90 share, top-k overlap
    "svd": {"mlp": 9.0, "e90": 0.05, "overlap": 0.1},
    # localization of OPD's harm: the unpatched flip share and per site (embed, layers.0, final_norm) after patching
    "loc": {"clean": 0.6, "sites": (0.5, 0.3, 0.0)},
}


def spec_with(**changes) -> dict:
    """GOOD with `changes` merged into its dicts (a non-dict value, or a key ending in ``!``, replaces)."""
    spec = copy.deepcopy(GOOD)
    for key, value in changes.items():
        whole = key.endswith("_")
        key = key.rstrip("_")
        if isinstance(value, dict) and isinstance(spec.get(key), dict) and not whole:
            spec[key].update(value)
        else:
            spec[key] = value
    return spec


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


def other_records(role: str, spec: dict) -> list[dict]:
    """Replies under the other contexts: the first share follow, then stick, then compose, the rest other."""
    f_tr, f_held = spec["follow"][role]
    stick, compose = spec["stick"].get(role, 0.0), spec["compose"].get(role, 0.0)
    out = []
    for label in TRAINED + HELD:
        f = f_tr if label in TRAINED else f_held
        cuts = [round(f * N), round((f + stick) * N), round((f + stick + compose) * N)]
        for i in range(N):
            reply = "follows" if i < cuts[0] else "sticks" if i < cuts[1] else "composes" if i < cuts[2] else "other"
            out.append(
                {
                    "uid": f"u{i:03d}",
                    "sample": 0,
                    "label": label,
                    "follow": reply == "follows",
                    "stick": reply == "sticks",
                    "compose": reply == "composes",
                    "other": reply == "other",
                    "reply": reply,
                    "len": 5,
                    "response": "1 2 3",
                }
            )
    return out


def _reports(spec: dict) -> dict[str, dict]:
    reps = {}
    for role in ["base", *METHODS]:
        if spec["acc_x"].get(role) is None:
            continue
        recs = records(spec["acc_x"][role], spec["acc_xc"][role], spec["harm"].get(role))
        summary = summarize(recs, n_boot=50)
        doc = {"summary": summary, "records": recs, "settings": {"model": role}}
        if spec["follow"].get(role) is not None:
            others = other_records(role, spec)
            s, rows = summarize_following(others, n_boot=50)
            summary.update(s)
            doc.update(other_contexts=rows, other_records=others)
        reps[role] = doc
    apply_retention(reps)
    return reps


def _probes(run: Path, spec: dict) -> None:
    probes = run / "probes"
    cos, null = spec["gcos"]
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
    with (probes / "similarity.csv").open("w") as fh:
        fh.write("model,site,layer,cos_mean\n")
        for model, vals in spec["cos"].items():
            fh.write(f"{model},embed,,1.0\n")
            fh.writelines(f"{model},layers.{i}.resid_post,{i},{v}\n" for i, v in enumerate(vals))
    _examples(probes, spec)
    (probes / "similarity.json").write_text(
        json.dumps({"models": list(spec["cos"]), "mean_cos": {}, "sites": [], "responses_from": "opd", "n_items": 1})
    )
    with (probes / "lens.csv").open("w") as fh:
        fh.write("model,site,depth,kl_c_x\n")
        for model, vals in spec["lens"].items():
            sites = ["embed"] + [f"layers.{i}.resid_post" for i in range(len(vals) - 1)] + ["final_norm"]
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
    _write_deltas(probes / "deltas.csv", spec)
    if spec["wp"] is not None:
        _write_weightpatch(probes, spec["wp"])
    if spec["svd"] is not None:
        _write_svd(probes, spec["svd"])
    if spec["loc"] is not None:
        _write_localization(probes, spec["loc"])
    buckets = {
        sig: [{"quartile": 1, "mean_gain_abs": 1.0}, {"quartile": 4, "mean_gain_abs": 1.0 + spread}]
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
    """The per-item tables the cosine and lens rows bootstrap over (every item at the layer's value, 5 tokens each;
    ``spec["per_item"] = False`` leaves them out: the rows fall back to the seed-level rule)."""
    if not spec.get("per_item", True):
        return
    with (probes / "similarity_examples.csv").open("w") as fh:
        fh.write("model,example,uid,site,depth,layer,n_tokens,cos_mean\n")
        for model, vals in spec["cos"].items():
            fh.writelines(
                f"{model},{k},u{k:03d},layers.{i}.resid_post,{i + 1},{i},5,{v}\n"
                for k in range(items)
                for i, v in enumerate(vals)
            )
    with (probes / "lens_examples.csv").open("w") as fh:
        fh.write("model,example,uid,site,n_tokens,kl_sum\n")
        for model, vals in spec["lens"].items():
            sites = [f"layers.{i}.resid_post" for i in range(len(vals) - 1)] + ["final_norm"]
            fh.writelines(f"{model},{k},u{k:03d},{s},5,{5 * v}\n" for k in range(items) for s, v in zip(sites, vals))


def _write_deltas(path: Path, spec: dict) -> None:
    """Per-tensor rows (weight only) through the probe's own writer, as `mechopd probe deltas` writes them."""
    from mechopd.probes.deltas import DeltaRow, summarize_deltas, write_table

    rows = []
    for i in range(spec["layers"]):
        for mod in MODULES:
            site, w0 = f"layers.{i}.{mod}", 2.0
            rows.append(DeltaRow("base", "", site, i, mod, "weight", 4, "", "w0_norm", w0))
            for model, rel in spec["update"].items():
                rel *= (spec["qk_factor"] if mod in ("q_proj", "k_proj") else 1.0) * spec["shallow_factor"] ** -i
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


def _write_svd(probes: Path, svd: dict) -> None:
    """deltas_svd.csv / .json of OPD (one attention and one MLP matrix) through the probe's summary."""
    from mechopd.core.artifacts import write_csv, write_json
    from mechopd.probes.delta_svd import COLUMNS, CSV, JSON, summarize_svd

    rows = [
        {
            "model": "opd",
            "vs": "base",
            "site": f"layers.0.{module}",
            "layer": 0,
            "module": module,
            "rows": 16,
            "cols": 16,
            "k": 4,
            "eff_rank": 3.0,
            "topk_energy": 0.9,
            "frac_above_0.01": 1.0,
            "frac_above_0.1": 0.5,
            "frac_above_1": 0.0,
            "energy90_frac": svd["e90"],
            "overlap_k": svd["overlap"],
            "overlap_random": 0.25,
            "delta_sq": dsq,
            "w0_sq": 10.0,
        }
        for module, dsq in (("q_proj", 1.0), ("down_proj", svd["mlp"]))
    ]
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


def make_run(root: Path, spec: dict, name: str = "run") -> Path:
    """One synthetic seed run directory (demo.json, eval/, probes/, train/*/metrics.jsonl) from `spec`."""
    run = root / name
    (run / "eval").mkdir(parents=True)
    (run / "probes").mkdir()
    runs = {
        "ta_opd": {"selector": "ta_opd", "budget": 0.1},
        "nca_follow": {"method": "nca", "follow_weight": 1.0, "follow_contexts": spec["follow_contexts"]},
    }
    (run / "demo.json").write_text(
        json.dumps(
            {
                "task": "rules",
                "methods": METHODS,
                "labels": {"ta_opd": "TA-OPD (ρ=0.10, kept 0.50)"},
                "thresholds": {"drop_min": 0.02, "harm_high": 0.1, "gain_min": 0.02},
                "runs": runs,
            }
        )
    )
    for role, rep in _reports(spec).items():
        (run / "eval" / f"{role}.json").write_text(json.dumps(rep))
    _probes(run, spec)
    for method in METHODS:
        d = run / "train" / method
        d.mkdir(parents=True)
        lines = [{"step": s, "kept_fraction": spec["kept"] if method == "ta_opd" else 1.0} for s in range(1, 4)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def seed_runs(root: Path, *per_seed: dict) -> list[Path]:
    """One run per seed, each GOOD with that seed's changes (`spec_with`)."""
    return [make_run(root, spec_with(**changes), f"seed-{k}") for k, changes in enumerate(per_seed)]
