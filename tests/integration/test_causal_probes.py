"""The causal probes (lens, patching, attention) on a tiny rules organism and two perturbed copies of it, through the
library and the CLI: fixed points, an independent forward, share sums, items and settings on disk, the figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mechopd.core.artifacts import read_csv
from mechopd.models import load_model
from mechopd.probes import causal_items as ci
from mechopd.probes.capture import Trace, forward
from mechopd.probes.setup import ProbeSetup
from mechopd.testing.causal import output_kl


def _copy(src: Path, dst: Path, seed: int, scale: float = 0.3) -> str:
    from mechopd.models import load_tokenizer

    model = load_model(src)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * p.std() * torch.randn(p.shape, generator=g))
    model.save_pretrained(dst)
    load_tokenizer(src).save_pretrained(dst)
    return str(dst)


@pytest.fixture(scope="module")
def models(tiny_rules_organism, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("causal")
    return {
        "base": str(tiny_rules_organism),
        "opd": _copy(tiny_rules_organism, root / "opd", 1),
        "nca": _copy(tiny_rules_organism, root / "nca", 2),
    }


def _setup(models: dict[str, str], **kw) -> ProbeSetup:
    return ProbeSetup(task="rules", n=6, batch_size=4, max_new_tokens=6, seed=1, models=models, **kw)


@pytest.fixture(scope="module")
def lens_dir(models, tmp_path_factory) -> Path:
    from mechopd.probes.lens import LensOptions, run_lens

    out = tmp_path_factory.mktemp("lens")
    run_lens(_setup(models), out, LensOptions(detail=3))
    return out


def test_lens_at_final_norm_is_the_output_kl_of_an_independent_forward(lens_dir, models):
    doc = json.loads((lens_dir / "lens.json").read_text())
    assert doc["settings"]["models"] == models
    records = ci.read_items(lens_dir / "lens_items.jsonl")
    assert len(records) == 6 and all(r["prompt_ids_x"] != r["prompt_ids_c"] for r in records)
    rows = read_csv(lens_dir / "lens.csv")
    for label, path in models.items():
        got = next(float(r["kl_c_x"]) for r in rows if r["model"] == label and r["site"] == "final_norm")
        ref = output_kl(load_model(path), records, doc["settings"]["temperature"])
        assert ref > 1e-6 and got == pytest.approx(ref, rel=1e-4)
        at_embed = next(r for r in rows if r["model"] == label and r["site"] == "embed")
        assert float(at_embed["kl_c_x"]) == pytest.approx(0.0, abs=1e-9) and float(at_embed["top1_agree"]) == 1.0
    tokens = [json.loads(line) for line in (lens_dir / "lens_tokens.jsonl").read_text().splitlines()]
    assert len(tokens) == 3 * 3 and all(len(t["kl"]["final_norm"]) == len(t["tokens"]) == t["n"] for t in tokens)
    assert set(doc["summary"]["promoted"]) == set(models)


def test_lens_batched_equals_one_by_one(models, tmp_path):
    from mechopd.probes.lens import lens

    setup = _setup(models)
    run = ci.resolve(setup, ["opd"], probe="lens", out=tmp_path / "a")
    model = run.load("opd")
    one = ProbeSetup(**{**setup.__dict__, "batch_size": 1})
    items1 = ci.resolve(one, ["opd"], probe="lens", out=tmp_path / "b").items
    a = lens(model, run.items, temperature=1.0).rows
    b = lens(model, items1, temperature=1.0).rows
    for ra, rb in zip(a, b):
        assert ra["kl_c_x"] == pytest.approx(rb["kl_c_x"], rel=1e-4, abs=1e-9) and ra["n_tokens"] == rb["n_tokens"]


def test_patching_fixed_points_and_windows(models, tmp_path):
    from mechopd.probes.patching import PatchingOptions, run_patching

    run_patching(_setup(models), tmp_path, PatchingOptions(models=["base", "opd"], window=2, detail=2))
    rows = read_csv(tmp_path / "patching.csv")

    def pick(m, s, c, d, w="all"):
        return float(
            next(
                r["recovered"]
                for r in rows
                if (r["model"], r["site"], r["component"], r["direction"], r["window"]) == (m, s, c, d, w)
            )
        )

    for m in ("base", "opd"):
        assert pick(m, "final_norm", "resid", "c_to_x") == pytest.approx(1.0, abs=1e-6)
        assert pick(m, "final_norm", "resid", "x_to_c") == pytest.approx(1.0, abs=1e-6)
        assert pick(m, "embed", "resid", "c_to_x") == pytest.approx(0.0, abs=1e-3)
        mid = pick(m, "layers.0.resid_post", "resid", "c_to_x")
        assert -1.0 < mid < 1.0 and mid != 0.0
    windows = [
        r
        for r in rows
        if r["window"] != "all" and r["site"] == "final_norm" and r["direction"] == "c_to_x" and r["model"] == "base"
    ]
    assert len(windows) >= 2
    # the windows partition the positions and KL at final_norm is per position: their patched KLs add up
    clean = float(windows[0]["kl_clean"])
    assert sum(clean - float(r["kl_patched"]) for r in windows) == pytest.approx(clean, rel=1e-5)
    comps = {r["component"] for r in rows}
    assert comps == {"resid", "attn", "mlp"}
    doc = json.loads((tmp_path / "patching.json").read_text())
    assert set(doc["settings"]["models"]) == {"base", "opd"} and (tmp_path / "patching_items.jsonl").is_file()


def test_trace_edit_with_own_values_is_identity_and_component_patch_reaches_output(models, tmp_path):
    run = ci.resolve(_setup(models), ["opd"], probe="trace", out=tmp_path)
    model, batch = run.load("opd"), next(iter(run.items))
    sites = ["layers.1.self_attn", "layers.1.mlp", "layers.0.resid_post"]
    clean = forward(model, batch, "x", capture=sites, positions="predict")
    same = forward(model, batch, "x", edit={s: clean[s] for s in sites}, positions="predict")
    torch.testing.assert_close(same.logits, clean.logits)
    other = forward(model, batch, "c", capture=sites, positions="predict")
    patched = forward(model, batch, "x", edit={"layers.1.mlp": other["layers.1.mlp"]}, positions="predict")
    m = batch.response_mask
    assert not torch.allclose(patched.logits[m], clean.logits[m])
    with Trace(model, batch, "x", capture=["embed"]) as tr:  # the hook is gone after the block
        pass
    assert model.model.embed_tokens._forward_hooks == {} and tr == {}


@pytest.mark.parametrize("placement", ["system", "user"])
def test_attention_shares_are_a_partition_per_head(models, tmp_path, placement):
    from mechopd.probes.attention import AttentionOptions, run_attention

    run_attention(_setup(models, placement=placement), tmp_path, AttentionOptions(models=["base", "nca"]))
    rows = read_csv(tmp_path / "attention.csv")
    assert len(rows) == 2 * 2 * 4  # models x layers x heads
    for r in rows:
        c, o = float(r["context_share"]), float(r["other_share"])
        assert 0.0 <= c <= 1.0 and 0.0 <= o <= 1.0 and c + o == pytest.approx(1.0, abs=1e-5)
    assert any(float(r["context_share"]) > 0.01 for r in rows)
    from mechopd.models import load_tokenizer
    from mechopd.tasks.base import get_task

    tok = load_tokenizer(models["base"])
    ex = get_task("rules").examples("test", 6, 1)
    for rec, e in zip(ci.read_items(tmp_path / "attention_items.jsonl"), ex):
        a, b = rec["context_span"]
        assert tok.decode(rec["prompt_ids_c"][a:b]).split() == e.context.split()
    assert json.loads((tmp_path / "attention.json").read_text())["settings"]["spec"]["placement"] == placement


def test_cli_probes_and_figures(models, tmp_path):
    from mechopd.cli import main
    from mechopd.plots.causal import plot_attention_context, plot_lens_kl, plot_patching

    flags = [
        "--models",
        *(f"{k}={v}" for k, v in models.items()),
        "--n",
        "4",
        "--batch-size",
        "2",
        "--max-new-tokens",
        "4",
        "--out",
        str(tmp_path / "probes"),
    ]
    assert main(["probe", "lens", *flags]) == 0
    assert (
        main(
            [
                "probe",
                "patching",
                *flags,
                "--components",
                "resid,mlp",
                "--cross",
                "nca,opd",
                "--cross-sites",
                "0,final_norm",
            ]
        )
        == 0
    )
    assert main(["probe", "attention", *flags]) == 0
    cross = read_csv(tmp_path / "probes" / "patching_cross.csv")
    assert [r["site"] for r in cross] == ["layers.0.resid_post", "final_norm"]
    for r in cross:
        assert math.isfinite(float(r["dlogp"])) and 0.0 <= float(r["acc_xc_patched"]) <= 1.0
    assert main(["probe", "patching", *flags, "--components", "bogus"]) == 2
    assert main(["probe", "patching", *flags, "--cross", "nca"]) == 2
    for plot in (plot_lens_kl, plot_patching, plot_attention_context):
        assert [p.suffix for p in plot(tmp_path, tmp_path / "figures")] == [".png", ".pdf"]
    from mechopd.probes.registry import report_lines

    lines = report_lines(tmp_path / "probes")
    assert any("Logit lens" in s for s in lines) and any("Attention on the context" in s for s in lines)
