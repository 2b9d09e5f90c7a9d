"""A synthetic demo run (every artifact the figures read) for the plot tests, and small figure helpers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from safetensors.torch import save_file

from mechopd.core.artifacts import json_safe, write_rows
from mechopd.core.sites import sites_for
from mechopd.evaluation.following import summarize_following
from mechopd.evaluation.removability import summarize
from mechopd.probes import (
    delta_rows,
    delta_sums,
    deltas,
    grad_align,
    gradients,
    similarity,
    teachability,
    teachability_rescore,
    view_cosine,
)

from .causal_artifacts import write_causal
from .intervention_artifacts import write_interventions

METHODS = ("opd", "nca", "ta_opd")
LABELS = {"base": "Base", "opd": "OPD", "nca": "NCA", "ta_opd": "TA-OPD"}
THRESHOLDS = {"drop_min": 0.02, "harm_high": 0.10, "gain_min": 0.02}
N_LAYERS = 3
MODULES = ("input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SELECTORS = ("ta_opd", "random", "entropy")
BUDGETS = (0.05, 0.1, 0.3, 0.5)
EVAL_STEPS = (0, 3, 6)
GRAD_METHODS = ("opd", "nca")
GRAD_STEPS = (1, 4)


# --------------------------------------------------------------------------------------------- synthetic run dir
def _param_names() -> list[str]:
    names = ["model.embed_tokens.weight"]
    for i in range(N_LAYERS):
        for m in MODULES:
            part = "self_attn" if m.endswith("proj") and m[0] in "qkvo" else "mlp" if m.endswith("proj") else ""
            names.append(f"model.layers.{i}.{part + '.' if part else ''}{m}.weight")
    return names + ["model.norm.weight"]


def _records(rng: np.random.Generator, p_x: float, p_xc: float, n: int = 40) -> list[dict]:
    cx, cxc = rng.random(n) < p_x, rng.random(n) < p_xc
    return [
        {
            "correct_x": bool(a),
            "correct_xc": bool(b),
            "len_x": float(rng.integers(5, 15)),
            "len_xc": float(rng.integers(5, 20)),
        }
        for a, b in zip(cx, cxc)
    ]


def _write_eval(run: Path, rng: np.random.Generator) -> None:
    probs = {"base": (0.5, 0.7), "opd": (0.8, 0.6), "nca": (0.8, 0.8), "ta_opd": (0.0, 0.3)}  # ta_opd: Harm undefined
    (run / "eval").mkdir(parents=True)
    for name, (px, pxc) in probs.items():
        recs = _records(rng, px, pxc)
        report = {"summary": summarize(recs, n_boot=40, seed=0), "records": recs, "settings": {"task": "rules"}}
        fol = {"base": 0.95, "opd": 0.1, "nca": 0.3, "ta_opd": 0.6}[
            name
        ]  # context following (mechopd.evaluation.following)
        others = [
            {
                "uid": f"u{i}",
                "sample": 0,
                "label": lab,
                "follow": bool(rng.random() < fol),
                "stick": bool(rng.random() < 1 - fol),
            }
            for i in range(20)
            for lab in ("shift:2", "reverse")
        ]
        extra, report["other_contexts"] = summarize_following(others, n_boot=40)
        report["summary"].update(extra)
        (run / "eval" / f"{name}.json").write_text(json.dumps(report))


def _write_metrics(run: Path, rng: np.random.Generator) -> None:
    for method in METHODS:
        d = run / "train" / method
        d.mkdir(parents=True)
        lines = []
        for step in range(7):
            rec = {"step": step, "loss": float(rng.random())} if step else {"step": 0}
            if step in EVAL_STEPS:
                rec.update({"eval/acc_x": float(rng.random()), "eval/acc_xc": float(rng.random()), "eval/harm": None})
            if method == "ta_opd" and step == 3:
                rec["eval/acc_xc"] = None  # undefined: dropped from the dashed curve
            if method in GRAD_METHODS and step in GRAD_STEPS:
                rec.update(
                    {
                        "grad/norm/opd": float(rng.random()) + 0.1,
                        "grad/norm/nca": float(rng.random()) + 0.1,
                        "grad/cos/opd__nca": float(rng.random() * 2 - 1),
                    }
                )
            lines.append(json.dumps(rec))
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _write_similarity(probes: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    sites, rows = sites_for(N_LAYERS), []
    for k, model in enumerate(("base", "opd", "nca")):
        acc = view_cosine.CosineAccumulator(sites, N_LAYERS)
        for site in sites:
            hx = torch.randn(2, 5, 8, generator=gen)
            acc.add(site, hx, hx + (0.6 / (k + 1)) * torch.randn(2, 5, 8, generator=gen), torch.ones(2, 5, dtype=bool))
        rows += acc.site_rows(model)
    write_rows(rows, probes / "similarity.csv")
    mean_cos = {m: float(np.mean([r["cos_mean"] for r in rows if r["model"] == m])) for m in ("base", "opd", "nca")}
    similarity.SimilaritySummary(["base", "opd", "nca"], mean_cos, sites, "opd", 2).save(probes)


def _write_gradients(probes: Path, rng: np.random.Generator) -> None:
    names = _param_names()
    sq_a, sq_b = rng.random(len(names)) + 0.1, rng.random(len(names)) + 0.1
    dots = (rng.random(len(names)) * 2 - 1) * np.sqrt(sq_a * sq_b)
    sums = [(float(d), float(a), float(b)) for d, a, b in zip(dots, sq_a, sq_b)]
    rows = grad_align.aggregate(names, sums, [16] * len(names), "opd", "nca", (0.5, 0.1))
    gradients.write_gradients(rows, probes, {"synthetic": True})


def _checkpoints(root: Path) -> dict[str, Path]:
    """base / opd / nca: tiny safetensors checkpoints (4 x 4 tensors, tied embeddings)."""
    gen = torch.Generator().manual_seed(1)
    base = {n: torch.randn(4, 4, generator=gen) for n in _param_names()}
    out = {}
    for label, scale in (("base", 0.0), ("opd", 0.05), ("nca", 0.08)):
        d = root / label
        d.mkdir(parents=True)
        save_file(
            {n: (w + scale * torch.randn(4, 4, generator=gen)).contiguous() for n, w in base.items()},
            str(d / "model.safetensors"),
        )
        (d / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
        out[label] = d
    return out


def _write_deltas(probes: Path, ckpts: dict[str, Path]) -> None:
    rows = delta_sums.parameter_deltas(
        ckpts["base"], {"opd": ckpts["opd"], "nca": ckpts["nca"]}, pair=("opd", "nca"), progress=False
    )
    delta_rows.write_table(rows, probes / "deltas")
    deltas.summarize_deltas(rows, ("opd", "nca"), {"synthetic": True}).save(probes)


def _write_teachability(probes: Path, rng: np.random.Generator) -> None:
    n = 240
    table = {c: rng.random(n) for c in teachability_rescore.COLUMNS}
    table["seq"] = np.repeat(np.arange(12), 20)
    table["pos"] = np.tile(np.arange(20), 12)
    summary = teachability.summarize(table, n_boot=20, seed=0)
    (probes / teachability.SUMMARY_NAME).write_text(json.dumps(json_safe(summary)))


def _write_sweep(run: Path, rng: np.random.Generator) -> None:
    rows = [
        {"selector": s, "budget": b, "acc_x": float(rng.random()), "acc_xc": float(rng.random()), "kept": b + 0.01}
        for s in SELECTORS
        for b in BUDGETS
    ]
    rows.append({"selector": "random", "budget": 1.0, "acc_x": None, "acc_xc": None})  # null: left out
    (run / "sweep").mkdir()
    (run / "sweep" / "sweep.json").write_text(json.dumps({"rows": rows}))


def make_run(root: Path, task: str = "rules", seed: int = 0) -> Path:
    """A complete synthetic run directory (every artifact of every figure)."""
    rng = np.random.default_rng(seed)
    run = root / task
    run.mkdir(parents=True)
    (run / "demo.json").write_text(
        json.dumps({"task": task, "methods": list(METHODS), "labels": LABELS, "thresholds": THRESHOLDS})
    )
    _write_metrics(run, rng)
    _write_eval(run, rng)
    probes = run / "probes"
    probes.mkdir()
    _write_similarity(probes)
    _write_gradients(probes, rng)
    _write_deltas(probes, _checkpoints(root / f"{task}_ckpts"))
    _write_teachability(probes, rng)
    write_causal(probes, rng)
    write_interventions(probes, seed)  # its own generator: the other tables' values do not move
    _write_sweep(run, rng)
    return run


def panels(fig: Figure) -> list:
    """The data axes of a figure (colour-bar axes excluded)."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def bar_containers(ax) -> list[BarContainer]:
    return [c for c in ax.containers if isinstance(c, BarContainer)]


def summary(run: Path, name: str) -> dict:
    return json.loads((run / "eval" / f"{name}.json").read_text())["summary"]


# ---------------------------------------------------------------------------------------------------------- files
