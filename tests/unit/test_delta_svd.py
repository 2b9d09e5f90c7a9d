"""`mechopd probe deltas --svd`: the update geometry against direct numpy formulas on saved checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mechopd.core.artifacts import read_csv
from mechopd.probes.delta_svd import GAUSS_ENERGY90, eff_rank, energy_fraction, geometry
from tests.conftest import tiny_model


@pytest.fixture(scope="module")
def checkpoints(organism_tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("svd")
    base = tiny_model(organism_tokenizer, seed=0)
    base.save_pretrained(root / "base")
    organism_tokenizer.save_pretrained(root / "base")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if "q_proj" in name:
                p.mul_(1.5)  # ΔW = 0.5 W0: its singular subspace IS W0's
            elif "down_proj" in name:
                p[0, 0] += 1.0  # one entry
            elif p.dim() == 2:
                p.add_(0.01 * torch.randn(p.shape, generator=g))
    base.save_pretrained(root / "opd")
    organism_tokenizer.save_pretrained(root / "opd")
    return root


def test_eff_rank_equals_a_direct_svd_through_the_cli(checkpoints, tmp_path):
    from safetensors.torch import load_file

    from mechopd.cli import main

    out = tmp_path / "p"
    assert (
        main(
            [
                "probe",
                "deltas",
                "--base",
                str(checkpoints / "base"),
                "--models",
                f"opd={checkpoints / 'opd'}",
                "--svd",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = {r["site"]: r for r in read_csv(out / "deltas_svd.csv")}
    w0, w1 = (
        load_file(str(checkpoints / "base" / "model.safetensors")),
        load_file(str(checkpoints / "opd" / "model.safetensors")),
    )
    assert len(rows) == 2 * 7  # 2 layers x (q, k, v, o, gate, up, down)
    for site, r in rows.items():
        name = f"model.{site}.weight"
        d = (w1[name].double() - w0[name].double()).numpy()
        s = np.linalg.svd(d, compute_uv=False)
        p = s[s > 1e-12 * s.max()] / s.sum()
        assert float(r["eff_rank"]) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-9), site
        assert float(r["topk_energy"]) == pytest.approx((s[:8] ** 2).sum() / (s**2).sum(), rel=1e-9)
        frac = (np.abs(d) > 0.1 * np.abs(w0[name].double().numpy())).mean()
        assert float(r["frac_above_0.1"]) == pytest.approx(frac)
    q = rows["layers.0.self_attn.q_proj"]
    assert float(q["overlap_k"]) == pytest.approx(1.0, abs=1e-9)  # ΔW ∝ W0
    assert float(q["frac_above_0.1"]) == pytest.approx(1.0) and float(q["frac_above_1"]) == 0.0
    down = rows["layers.0.mlp.down_proj"]
    assert float(down["eff_rank"]) == pytest.approx(1.0) and float(down["topk_energy"]) == pytest.approx(1.0)
    assert float(down["energy90_frac"]) == pytest.approx(1 / (int(down["rows"]) * int(down["cols"])))


def test_pieces_against_references():
    assert math.isnan(eff_rank(torch.zeros(4)))
    assert eff_rank(torch.ones(5)) == pytest.approx(5.0)
    g = torch.Generator().manual_seed(0)
    assert energy_fraction(torch.randn(600, 600, generator=g)) == pytest.approx(GAUSS_ENERGY90, abs=0.01)
    w0 = torch.randn(32, 16, generator=g, dtype=torch.float64)
    rand = geometry(w0, w0 + torch.randn(32, 16, generator=g, dtype=torch.float64), k=4)
    assert rand["overlap_random"] == 4 / 32 and 0.0 < rand["overlap_k"] < 1.0
    assert math.isnan(geometry(w0, w0.clone())["overlap_k"])
