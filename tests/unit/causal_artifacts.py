"""Synthetic lens / patching / attention tables written with the probes' own writer and column lists (for the figure
tests): a format change in a probe module breaks the figures' tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mechopd.core.artifacts import write_csv
from mechopd.core.sites import residual_sites, site_depth, site_layer
from mechopd.probes import attention, lens, patch_views

MODELS = ("base", "opd", "nca")
LAYERS, HEADS = 3, 4


def write_causal(probes: Path, rng: np.random.Generator) -> dict[str, list[dict]]:
    sites = residual_sites(LAYERS)
    lens_rows = [
        {
            "model": m,
            "site": s,
            "depth": site_depth(s, LAYERS),
            "layer": site_layer(s),
            "n_items": 8,
            "n_tokens": 40,
            "kl_c_x": float(k * d * rng.uniform(0.5, 1.5)) if d else 0.0,
            "top1_agree": 0.9,
        }
        for k, m in enumerate(MODELS, 1)
        for d, s in enumerate(sites)
    ]
    patch_rows = []
    for m in MODELS:
        for s in sites:
            comps = ["resid"] + (["attn", "mlp"] if site_layer(s) is not None else [])
            for c in comps:
                for direction in patch_views.DIRECTIONS:
                    patch_rows.append(
                        {
                            "model": m,
                            "site": s,
                            "component": c,
                            "direction": direction,
                            "window": "all",
                            "recovered": float(rng.uniform(-0.2, 1.0)),
                            "kl_clean": 0.1,
                            "kl_patched": 0.05,
                            "depth": site_depth(s, LAYERS),
                            "layer": site_layer(s),
                            "hook": s,
                            "n_items": 8,
                            "n_tokens": 40,
                        }
                    )
    attn_rows = [
        {
            "model": m,
            "layer": i,
            "head": h,
            "context_share": float(c),
            "other_share": float(1 - c),
            "n_items": 8,
            "n_tokens": 40,
        }
        for m in MODELS
        for i in range(LAYERS)
        for h in range(HEADS)
        for c in [rng.uniform(0, 1)]
    ]
    write_csv(probes / "lens.csv", lens_rows, lens.COLUMNS)
    write_csv(probes / "patching.csv", patch_rows, patch_views.COLUMNS)
    write_csv(probes / "attention.csv", attn_rows, attention.COLUMNS)
    return {"lens": lens_rows, "patching": patch_rows, "attention": attn_rows}
