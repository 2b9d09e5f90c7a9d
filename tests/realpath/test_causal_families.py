"""The causal probes (lens, patching, attention) on the real architectures of the zoo (Qwen3, Llama-3: byte-level BPE,
chat templates, a ~512-token context, vocabularies padded past the tokenizer), with system and user placement."""

from __future__ import annotations

import json

import pytest

from mechopd.core.artifacts import read_csv
from mechopd.models import load_model, load_tokenizer
from mechopd.probes import causal_items as ci
from mechopd.probes.setup import ProbeSetup
from mechopd.testing.causal import output_kl

from .helpers import NO_CONTEXT_SYSTEM, TEMPLATE_KWARGS


def _setup(zoo, family: str, placement: str) -> ProbeSetup:
    return ProbeSetup(
        task="jsonl",
        task_options=zoo.jsonl_options(max_new_tokens=4),
        placement=placement,
        no_context_system=NO_CONTEXT_SYSTEM[family],
        chat_template_kwargs=dict(TEMPLATE_KWARGS[family]),
        n=3,
        batch_size=2,
        seed=0,
        models={"base": str(zoo.student(family)), "other": str(zoo.teacher(family))},
    )


@pytest.mark.parametrize("placement", ["system", "user"])
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_causal_probes_on_real_architectures(zoo, family, placement, tmp_path):
    from mechopd.probes.attention import AttentionOptions, run_attention
    from mechopd.probes.lens import LensOptions, run_lens
    from mechopd.probes.patching import PatchingOptions, run_patching

    setup = _setup(zoo, family, placement)
    run_lens(setup, tmp_path, LensOptions(detail=1))
    run_patching(setup, tmp_path, PatchingOptions(models=["base"], components=["resid", "attn"]))
    run_attention(setup, tmp_path, AttentionOptions(models=["base"]))
    records = ci.read_items(tmp_path / "lens_items.jsonl")
    settings = json.loads((tmp_path / "lens.json").read_text())["settings"]
    assert settings["spec"]["placement"] == placement and settings["models"]["other"] == str(zoo.teacher(family))
    lens = read_csv(tmp_path / "lens.csv")
    for label, path in setup.models.items():  # lens at final_norm == an independent forward's output KL
        ref = output_kl(load_model(path), records)
        got = next(float(r["kl_c_x"]) for r in lens if r["model"] == label and r["site"] == "final_norm")
        assert ref > 0 and got == pytest.approx(ref, rel=1e-4)
    patch = {
        (r["site"], r["component"], r["direction"]): float(r["recovered"]) for r in read_csv(tmp_path / "patching.csv")
    }
    assert patch[("final_norm", "resid", "c_to_x")] == pytest.approx(1.0, abs=1e-6)
    assert patch[("embed", "resid", "c_to_x")] == pytest.approx(0.0, abs=1e-3)
    assert ("layers.1.resid_post", "attn", "x_to_c") in patch
    rows = read_csv(tmp_path / "attention.csv")
    assert rows and all(
        float(r["context_share"]) + float(r["other_share"]) == pytest.approx(1.0, abs=1e-5) for r in rows
    )
    assert max(float(r["context_share"]) for r in rows) > 0.1  # the ~512-token context holds most key columns
    tok = load_tokenizer(zoo.student(family))
    context = (zoo.context_file).read_text().strip()
    for rec in ci.read_items(tmp_path / "attention_items.jsonl"):
        a, b = rec["context_span"]
        text = tok.decode(rec["prompt_ids_c"][a:b])
        assert context[:40] in text and context[-20:] in text and len(text) < len(context) + 20
