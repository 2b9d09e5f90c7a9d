"""Attribution patching on a tiny GQA rules organism (4 query heads, 2 key/value heads): integrated gradients converge
to exact patching (completeness), plain attribution equals a hand-computed gradient x difference, exact patching
agrees with the patching probe, and the CLI writes the faithfulness record."""

from __future__ import annotations

import json

import pytest
import torch

from mechopd.core.artifacts import read_csv
from mechopd.models import load_model, load_tokenizer
from mechopd.probes.attribution import Pair, accumulate, attribute_batch, exact_batch, sites_of
from mechopd.probes.setup import ProbeSetup

from .test_weightpatch import _perturb_attention


@pytest.fixture(scope="module")
def models(tiny_rules_organism, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("attr")
    return {"base": str(tiny_rules_organism), "opd": _perturb_attention(tiny_rules_organism, root / "opd", scale=0.3)}


@pytest.fixture(scope="module")
def batch(models):
    setup = ProbeSetup(task="rules", n=4, batch_size=4, max_new_tokens=6, seed=1, models=models)
    items = setup.items(load_tokenizer(models["base"]), "answers")
    return next(iter(items))


def test_integrated_gradients_converge_to_exact_patching(models, batch):
    model = load_model(models["opd"])
    assert model.config.num_attention_heads != model.config.num_key_value_heads  # GQA
    pair = Pair(model, "x", model, "c")
    sites = sites_of(model, None, ["resid", "attn", "mlp", "head"])
    per, m0, a_d, a_r = attribute_batch(pair, batch, sites, 1.0, ig_steps=24)
    exact = exact_batch(pair, batch, sites, 1.0, a_d, a_r)
    mask = batch.response_mask.double()
    for site in sites:
        if site.component == "head":  # IG over the layer's heads together: completeness for their joint patch
            continue
        ig = float((per[site] * mask).sum())
        assert ig == pytest.approx(exact[(site, None)] - m0, rel=2e-2, abs=1e-4), site


def test_plain_attribution_is_gradient_times_difference(models, batch):
    model = load_model(models["opd"])
    pair = Pair(model, "x", model, "c")
    site = sites_of(model, [1], ["resid"])[0]
    per, m0, a_d, a_r = attribute_batch(pair, batch, [site], 1.0, ig_steps=0)
    R = batch.response_ids.shape[1]
    start = int(batch.cols_x[0, 0]) - 1
    with torch.no_grad():
        target = torch.log_softmax(model(**batch.view("c"), logits_to_keep=R + 1).logits[:, :R].double(), -1)
    leaf = torch.zeros(batch.batch_size, R, model.config.hidden_size, requires_grad=True)

    def hook(_m, _i, out):  # decoder layer 1's output, the scored columns shifted by the leaf
        h = out if isinstance(out, torch.Tensor) else out[0]
        h = torch.cat([h[:, :start], h[:, start : start + R] + leaf, h[:, start + R :]], 1)
        return h if isinstance(out, torch.Tensor) else (h, *out[1:])

    handle = model.model.layers[1].register_forward_hook(hook)
    lp = torch.log_softmax(model(**batch.view("x"), logits_to_keep=R + 1).logits[:, :R].double(), -1)
    handle.remove()
    m = ((target.exp() * (target - lp)).sum(-1) * batch.response_mask).sum()
    (g,) = torch.autograd.grad(m, [leaf])
    ref = ((a_d[site] - a_r[site]).double() * g.double()).sum(-1)
    assert float(m) == pytest.approx(m0, rel=1e-9)
    assert torch.allclose(per[site], ref, rtol=1e-6, atol=1e-9)


def test_exact_patch_of_the_last_resid_matches_the_patching_probe(models, batch):
    from mechopd.probes.patching import patching

    model = load_model(models["opd"])
    pair = Pair(model, "x", model, "c")
    sites = sites_of(model, None, ["resid", "mlp"])
    acc = accumulate(pair, [batch], sites, 1.0, 0, True)
    ref = {
        (r["site"], r["component"]): r["kl_patched"] * r["n_tokens"]
        for r in patching(model, [batch], temperature=1.0, components=["resid", "mlp"], directions=["c_to_x"]).rows
    }
    for site in sites:
        key = (site.name if site.component == "resid" else f"layers.{site.layer}.resid_post", site.component)
        assert acc["patched"][(site, None)] == pytest.approx(ref[key], rel=1e-6), key


def test_cli_writes_faithfulness_and_cross(models, tmp_path):
    from mechopd.cli import main
    from mechopd.plots.interventions import plot_attribution

    out = tmp_path / "run" / "probes"
    assert (
        main(
            [
                "probe",
                "attribution",
                "--task",
                "rules",
                "--n",
                "4",
                "--max-new-tokens",
                "6",
                "--models",
                f"base={models['base']}",
                f"opd={models['opd']}",
                "--cross",
                "base,opd",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads((out / "attribution.json").read_text())
    f = doc["summary"]["faithfulness"]
    assert {"pearson", "spearman"} <= set(f["all"]) and f["cost_ratio"] > 0 and f["sites"] == 2 * (3 + 4)
    assert "opd:base->opd" in doc["summary"]["pairs"]
    rows = read_csv(out / "attribution.csv")
    assert {r["head"] for r in rows if r["component"] == "head"} == {"0", "1", "2", "3"}
    assert plot_attribution(tmp_path / "run", tmp_path / "run" / "figures")
