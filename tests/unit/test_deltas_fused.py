"""Parameter deltas and the update SVD on fused / Conv1D families (Phi-3, GPT-2, GPT-NeoX): per-layer rows for q, k
and v (gate, up) whose norms are those of hand slices of the fused weight; nothing dropped, no empty layer index."""

from __future__ import annotations

import math

import pytest
import torch

from mechopd.probes.delta_sums import aggregate_deltas, parameter_deltas
from mechopd.probes.delta_svd import svd_rows
from mechopd.testing.families import tiny_family_model

H, K, HD, D = 4, 2, 8, 32
QKV = {  # family -> (stored fused weight of layer 1, hand slices of q / k / v as [out, in])
    "phi3": (
        "model.layers.1.self_attn.qkv_proj.weight",
        lambda w: (w[: H * HD], w[H * HD : (H + K) * HD], w[(H + K) * HD :]),
    ),
    "gpt2": ("transformer.h.1.attn.c_attn.weight", lambda w: (w[:, :D].T, w[:, D : 2 * D].T, w[:, 2 * D :].T)),
    "gpt_neox": (
        "gpt_neox.layers.1.attention.query_key_value.weight",
        lambda w: tuple(w.view(H, 3, HD, D)[:, i].reshape(H * HD, D) for i in range(3)),
    ),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Per family: (base dir, trained dir, base state, trained state); "trained" adds noise scaled per row."""
    out = {}
    for family in QKV:
        root = tmp_path_factory.mktemp(family)
        base = tiny_family_model(family)
        base.save_pretrained(root / "base")
        w0 = {n: p.detach().clone() for n, p in base.state_dict().items()}
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in base.parameters():
                scale = torch.arange(1, p.shape[0] + 1, dtype=p.dtype).view(-1, *([1] * (p.dim() - 1))) / p.shape[0]
                p.add_(torch.randn(p.shape, generator=g) * scale)
        base.save_pretrained(root / "opd")
        out[family] = (root / "base", root / "opd", w0, {n: p.detach().clone() for n, p in base.state_dict().items()})
    return out


def _value(rows, site, param, metric, model="opd"):
    got = [r.value for r in rows if r.site == site and r.param == param and r.metric == metric and r.model == model]
    assert len(got) == 1, (site, param, metric, got)
    return got[0]


@pytest.mark.parametrize("family", list(QKV))
def test_q_k_v_rows_match_hand_slices(pairs, family):
    base, opd, w0, w1 = pairs[family]
    rows = parameter_deltas(base, {"opd": str(opd)}, progress=False)
    raw, hand = QKV[family]
    for proj, a, b in zip(("q_proj", "k_proj", "v_proj"), hand(w0[raw]), hand(w1[raw])):
        site = f"layers.1.self_attn.{proj}"
        assert math.isclose(
            _value(rows, site, "weight", "delta_norm"), float((b.double() - a.double()).norm()), rel_tol=1e-9
        )
        assert math.isclose(_value(rows, site, "weight", "w0_norm", "base"), float(a.double().norm()), rel_tol=1e-9)
    layers = {r.layer for r in rows if r.layer is not None}
    assert layers == {0, 1}
    by_layer = aggregate_deltas(rows, "layer")
    assert {r.site for r in by_layer} >= {"layers.0", "layers.1"}
    total = sum(p.numel() for p in w0.values())  # every stored element counted once (tied head once)
    counted = sum(r.numel for r in rows if r.metric == "w0_norm" and not r.tied_to)
    assert counted == total - (w0["lm_head.weight"].numel() if family == "gpt2" else 0)


@pytest.mark.parametrize("family", list(QKV))
def test_svd_rows_are_per_projection(pairs, family):
    base, opd, w0, w1 = pairs[family]
    rows = svd_rows(str(base), {"opd": str(opd)}, k=2)
    modules = {r["module"] for r in rows if r["layer"] == 1}
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"} <= modules
    raw, hand = QKV[family]
    q = next(r for r in rows if r["site"] == "layers.1.self_attn.q_proj")
    a, b = hand(w0[raw])[0], hand(w1[raw])[0]
    assert (q["rows"], q["cols"]) == tuple(a.shape)
    assert math.isclose(q["delta_sq"], float((b.double() - a.double()).square().sum()), rel_tol=1e-6)


def test_the_svd_shows_its_progress_over_the_matrices(pairs, capsys):
    """An SVD per matrix takes minutes on a real model: a bar counts them (#54); progress=False is silent."""
    base, opd, _, _ = pairs[next(iter(QKV))]
    rows = svd_rows(str(base), {"opd": str(opd)}, k=2)
    err = capsys.readouterr().err
    assert "deltas svd" in err and f"{len(rows)}/{len(rows)}" in err
    svd_rows(str(base), {"opd": str(opd)}, k=2, progress=False)
    assert "deltas svd" not in capsys.readouterr().err
