"""Probes on a tiny cross-model Qwen2 pair (issue 55, item 3), the shapes of Qwen2.5-Coder 0.5B / 1.5B: q/k/v biases,
an untied LM head, a deeper and wider teacher of the same tokenizer.

* similarity and lens read the teacher itself (forward only) beside the student, each at its own depth, with the very
  numbers each model gives alone;
* a study's probes may name the ``teacher`` role (the teacher is no run of the study);
* deltas on a LoRA student reads ΔW = (α / r) B A per adapted module from the adapter: its per-module norms and the
  pair cosine equal the ones computed from the adapter's tensors, every other tensor (biases, untied head) is
  unmoved."""

from __future__ import annotations

import copy
import csv
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from mechopd.config.sections import LoraOptions
from mechopd.core.errors import ConfigError
from mechopd.models import lora
from mechopd.organisms.tokenizer import build_tokenizer
from mechopd.pipeline import named
from mechopd.pipeline.spec import StudySpec
from mechopd.plots.layers import figure_layer_cosine
from mechopd.probes.deltas import DeltasOptions, run_deltas
from mechopd.probes.lens import LensOptions, run_lens
from mechopd.probes.setup import ProbeSetup
from mechopd.probes.similarity import SimilarityOptions, run_similarity
from mechopd.tasks.base import get_task

OPTS = LoraOptions(lora_rank=4, lora_alpha=8.0)


def qwen2(tok, layers: int, hidden: int, seed: int):
    """A tiny Qwen2 (q/k/v biases, untied head), eval mode."""
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-zero biases: a bias that is never read would go unnoticed at 0
        for name, p in model.named_parameters():
            if name.endswith("proj.bias"):
                p.normal_(0, 0.1)
    return model


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(get_task("rules").vocab())


@pytest.fixture(scope="module")
def pair(tok, tmp_path_factory):
    """base (2 layers, d 32) and teacher (3 layers, d 48) saved with the one tokenizer."""
    root = tmp_path_factory.mktemp("qwen2")
    dirs = {}
    for label, (layers, hidden, seed) in {"base": (2, 32, 0), "teacher": (3, 48, 1)}.items():
        model = qwen2(tok, layers, hidden, seed)
        assert model.model.layers[0].self_attn.q_proj.bias is not None and model.lm_head.weight is not (
            model.model.embed_tokens.weight
        )
        model.save_pretrained(root / label)
        tok.save_pretrained(root / label)
        dirs[label] = str(root / label)
    return dirs


def _setup(models, **kw) -> ProbeSetup:
    return ProbeSetup(task="rules", n=4, seed=0, batch_size=3, max_new_tokens=5, models=models, **kw)


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def test_similarity_reads_the_deeper_teacher_beside_the_student_with_its_numbers_alone(pair, tmp_path):
    both = run_similarity(
        _setup(pair, responses_from="base"),
        tmp_path / "both",
        SimilarityOptions(models=["base", "teacher"]),
        progress=False,
    )
    assert "teacher" in both[-1] and "base" in both[-1]
    rows = _rows(tmp_path / "both" / "similarity.csv")
    sites = {m: [r["site"] for r in rows if r["model"] == m] for m in ("base", "teacher")}
    assert sites["base"][-2:] == ["layers.1.resid_post", "final_norm"] and len(sites["base"]) == 4
    assert sites["teacher"][-2:] == ["layers.2.resid_post", "final_norm"] and len(sites["teacher"]) == 5
    summary = json.loads((tmp_path / "both" / "similarity.json").read_text())
    assert summary["settings"]["sites_by_model"] == sites and len(summary["per_layer"]["teacher"]) == 3
    given = str(tmp_path / "both" / "similarity_responses.jsonl")  # the same responses, the teacher alone
    run_similarity(
        _setup(pair, responses_from=given), tmp_path / "alone", SimilarityOptions(models=["teacher"]), progress=False
    )
    alone = _rows(tmp_path / "alone" / "similarity.csv")
    assert [r["site"] for r in alone] == sites["teacher"]
    assert [float(r["cos_mean"]) for r in alone] == pytest.approx(
        [float(r["cos_mean"]) for r in rows if r["model"] == "teacher"], abs=1e-6
    )
    assert not any(math.isclose(float(r["cos_mean"]), 1.0) for r in alone if r["site"] != "embed")  # views differ
    shutil.copytree(tmp_path / "both", tmp_path / "run" / "probes")  # the figure: each model over its own depth
    fig = figure_layer_cosine(tmp_path / "run")
    xs = sorted((list(line.get_xdata()) for line in fig.axes[0].get_lines()), key=len)  # base, then the teacher
    assert xs[0] == pytest.approx([0, 1 / 3, 2 / 3, 1]) and xs[1] == pytest.approx([0, 0.25, 0.5, 0.75, 1])


def test_lens_reads_the_teacher_at_its_own_depth(pair, tmp_path):
    run_lens(_setup(pair, responses_from="base"), tmp_path / "lens", LensOptions(models=["base", "teacher"], detail=1))
    rows = _rows(tmp_path / "lens" / "lens.csv")
    layers = {
        m: sorted(int(r["layer"]) for r in rows if r["model"] == m and r["layer"] not in ("", None)) for m in pair
    }
    assert layers == {"base": [0, 1], "teacher": [0, 1, 2]}
    out_kl = json.loads((tmp_path / "lens" / "lens.json").read_text())["summary"]["output_kl"]
    assert set(out_kl) == {"base", "teacher"} and all(v > 0 for v in out_kl.values())


def test_a_study_probe_may_name_the_teacher_role_and_is_skipped_without_one(tmp_path):
    from types import SimpleNamespace

    from mechopd.pipeline.stages import _WithTeacher
    from mechopd.probes.registry import demo_options, get_probe
    from mechopd.runset import RunSet

    study = RunSet.of_models(tmp_path, "rules", {"base": tmp_path / "b", "opd": tmp_path / "o"})
    wanted = SimpleNamespace(demo={"models": ["base", "teacher", "opd"]}, role_options=("models",))
    models = {"base": tmp_path / "b", "opd": tmp_path / "o"}
    similarity, deltas = get_probe("similarity"), get_probe("deltas")
    assert demo_options(wanted, _WithTeacher(study, {**models, "teacher": tmp_path / "t"}, similarity)) == {
        "models": ["base", "teacher", "opd"]
    }
    assert demo_options(wanted, _WithTeacher(study, models, similarity)) is None  # no teacher in this run: skipped
    assert demo_options(wanted, _WithTeacher(study, {**models, "teacher": tmp_path / "t"}, deltas)) is None


def test_a_study_refuses_the_teacher_in_a_probe_that_does_not_read_it():
    doc = named.load_named("qwen-coder-docs").to_mapping()
    StudySpec.load(doc)  # similarity and lens name the teacher: accepted
    with pytest.raises(ConfigError, match=r"probes.deltas cannot read the teacher \(only the forward-only probes "):
        StudySpec.load({**doc, "probes": {**doc["probes"], "deltas": {"models": ["teacher", "opd"]}}})


def _lora_student(base_dir: str, out: Path, seed: int) -> dict[str, torch.Tensor]:
    """A LoRA student of ``base_dir`` saved as mechopd saves one (merged weights + adapter/); returns its ΔW by name."""
    model = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    student = copy.deepcopy(model)
    lora.add_adapter(student, OPTS)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in student.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)  # a trained adapter
    student.save_pretrained(out, state_dict=lora.merged_state(student), safe_serialization=True)
    lora.save_adapter(student, OPTS, out / lora.ADAPTER_DIR, base_dir)
    return {  # float64 (α / r) B A from the layer's own tensors
        f"{name}.weight": (layer.lora_B["default"].weight.double() @ layer.lora_A["default"].weight.double())
        * float(layer.scaling["default"])
        for name, layer in lora.lora_layers(student).items()
    }


def test_deltas_of_lora_students_are_their_adapters_updates(pair, tmp_path):
    deltas = {m: _lora_student(pair["base"], tmp_path / m, seed) for m, seed in (("opd", 1), ("nca", 2))}
    models = {"base": pair["base"], "opd": str(tmp_path / "opd"), "nca": str(tmp_path / "nca")}
    lines = run_deltas(_setup(models), tmp_path / "deltas", DeltasOptions(pair=["opd", "nca"]), progress=False)
    rows = _rows(tmp_path / "deltas" / "deltas.csv")
    settings = json.loads((tmp_path / "deltas" / "deltas_summary.json").read_text())["settings"]
    assert set(settings["adapters"]) == {"opd", "nca"} and settings["adapters"]["opd"]["r"] == 4
    norm = {
        (r["model"], r["vs"], r["site"], r["param"]): float(r["value"]) for r in rows if r["metric"] == "delta_norm"
    }
    site = "layers.1.self_attn.q_proj"
    name = "model.layers.1.self_attn.q_proj.weight"
    for m, d in deltas.items():
        assert len(d) == 2 * 7  # q k v o gate up down in both layers
        assert norm[(m, "base", site, "weight")] == pytest.approx(d[name].norm().item(), rel=1e-9)
        assert norm[(m, "base", site, "bias")] == 0.0  # the q bias is not adapted
        assert norm[(m, "base", "lm_head", "weight")] == 0.0  # the untied head is read and unmoved
    a, b = deltas["opd"][name].flatten(), deltas["nca"][name].flatten()
    cos = {(r["model"], r["vs"], r["site"], r["param"]): float(r["value"]) for r in rows if r["metric"] == "cos"}
    assert cos[("nca", "opd", site, "weight")] == pytest.approx((a @ b / (a.norm() * b.norm())).item(), abs=1e-9)
    assert any("Parameter updates" in line for line in lines)
