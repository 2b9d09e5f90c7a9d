"""Synthetic seed runs for the claims tests: per-item evaluation records (both views, other contexts with their reply
classes) whose summaries are the library's own (`removability.summarize`, `following.summarize_following`), and the
probe artifacts every claim row reads (tests/unit/claim_probes.py, written through the probes' own writers where
they have one)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from mechopd.evaluation.following import apply_retention, summarize_following
from mechopd.evaluation.removability import summarize
from tests.unit.claim_probes import N, records, write_probes

METHODS = ["opd", "nca", "nca_const", "ta_opd", "nca_follow"]
TRAINED, HELD = ["shift:2", "shift:3"], ["repeat:2", "reverse"]  # the follow run's contexts / the held-out ones

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
    write_probes(run, spec)
    for method in METHODS:
        d = run / "train" / method
        d.mkdir(parents=True)
        lines = [{"step": s, "kept_fraction": spec["kept"] if method == "ta_opd" else 1.0} for s in range(1, 4)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def seed_runs(root: Path, *per_seed: dict) -> list[Path]:
    """One run per seed, each GOOD with that seed's changes (`spec_with`)."""
    return [make_run(root, spec_with(**{"seed": k, **changes}), f"seed-{k}") for k, changes in enumerate(per_seed)]
