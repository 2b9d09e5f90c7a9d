"""Synthetic weightpatch / localization / attribution / pmi tables written with the probes' own writers and column
lists (for the figure tests): a format change in a probe module breaks the figures' tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mechopd.core.artifacts import write_csv, write_json
from mechopd.core.sites import residual_sites
from mechopd.probes import localization, pmi, weightpatch
from mechopd.probes.attribution import Site
from mechopd.probes.attribution_run import COLUMNS as ATTR_COLUMNS
from mechopd.probes.attribution_run import table

LAYERS, HEADS = 3, 4
MODULES = ("q_proj", "k_proj", "qk", "vo", "attn", "mlp", "norms")


def write_interventions(probes: Path, seed: int = 0) -> dict[str, list[dict]]:
    """The four tables from one generator seeded with `seed`, drawn in this order (weightpatch, localization,
    attribution, pmi); returns the rows written."""
    rng = np.random.default_rng(seed)
    wp = _weightpatch(probes, rng)
    loc = _localization(probes, rng)
    attr = _attribution(probes, rng)
    tokens = _pmi_tokens(probes, rng)
    return {"weightpatch": wp, "localization": loc, "attribution": attr, "pmi": tokens}


def _weightpatch(probes: Path, rng: np.random.Generator) -> list[dict]:
    """weightpatch.csv / .json: every layer x module row, the whole-model rows and three control draws."""
    wp = []
    for layer, module, draw in (
        [("none", "none", "")]
        + [(str(i), m, "") for i in range(LAYERS) for m in MODULES]
        + [("all", m, "") for m in MODULES]
        + [("all", "ctrl_qk", j) for j in range(3)]
    ):
        r = {c: None for c in weightpatch.COLUMNS}
        acc, harm = float(rng.uniform(0, 1)), float(rng.uniform(0, 1))
        r.update(
            model="opd",
            donor="base",
            layer=layer,
            module=module,
            draw=draw,
            n_params=100,
            n=40,
            acc_x=acc,
            acc_xc=0.5,
            harm=harm,
            d_acc_x=acc - 0.9,
            d_harm=harm - 0.3,
        )
        wp.append(r)
    write_csv(probes / "weightpatch.csv", wp, weightpatch.COLUMNS)
    write_json(
        probes / "weightpatch.json", {"probe": "weightpatch", "settings": {}, "summary": weightpatch.summarize(wp)}
    )
    return wp


def _localization(probes: Path, rng: np.random.Generator) -> list[dict]:
    """localization.csv: the flip-share curve over the residual sites."""
    sites = residual_sites(LAYERS)
    right = rng.uniform(size=20) < 0.7
    clean = rng.uniform(size=20) < 0.5
    patched = {s: rng.uniform(size=20) < 0.5 * (1 - d / (LAYERS + 1)) for d, s in enumerate(sites)}
    loc = localization.curve_rows("opd", "x", right, clean, patched, LAYERS, 50, 0)
    write_csv(probes / "localization.csv", loc, localization.COLUMNS)
    return loc


def _attribution(probes: Path, rng: np.random.Generator) -> list[dict]:
    """attribution.csv: per layer, component (and head) and token, through the probe's own `table`."""
    acc = {
        "attr": {
            (Site(i, c), h, t): float(rng.normal())
            for i in range(LAYERS)
            for c in ("resid", "attn", "mlp", "head")
            for h in ([None] if c != "head" else range(HEADS))
            for t in range(4)
        },
        "m_clean": 2.0,
        "n_items": 8,
        "n_tokens": 32,
    }
    acc["patched"] = {(s, h): float(rng.uniform(0, 2)) for (s, h, _) in acc["attr"]}
    attr = table("opd", "c_to_x", acc)
    write_csv(probes / "attribution.csv", attr, ATTR_COLUMNS)
    return attr


def _pmi_tokens(probes: Path, rng: np.random.Generator) -> list[dict]:
    """pmi_tokens.csv: 30 scored tokens of 6 items."""
    tokens = [
        {
            "uid": f"u{i // 5}",
            "position": i % 5,
            "token": "a",
            "pmi": float(rng.normal()),
            "opd": float(rng.uniform(0, 1)),
            "kl_x": 0.1,
            "ctx": 0.2,
            "sampled": float(rng.normal()),
            "C": float(rng.uniform()),
            "D": float(rng.uniform()),
            "DL": None,
            "right_x": True,
            "flip": i % 5 == 2,
        }
        for i in range(30)
    ]
    pmi.summarize(tokens)
    write_csv(probes / "pmi_tokens.csv", tokens, pmi.COLUMNS)
    return tokens
