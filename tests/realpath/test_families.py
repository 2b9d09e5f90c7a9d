"""Every family of the zoo beyond Qwen / Llama (Mistral, Gemma-2, Gemma-3, Phi-3, GPT-2, GPT-NeoX, OLMo-2: their own
config classes, byte-level BPE, each family's chat template) through the probes and a whole study.

* The causal probes on each family: the lens at ``final_norm`` (Gemma-2's final soft-capping included) and the
  patching probe's unpatched KL agree with a plain transformers forward of both views within 1e-5.
* `mechopd run STUDY.yaml` with OPD, NCA, a LoRA run and every registered probe ends with a report on one family of
  each structural kind (Conv1D GPT-2, per-head interleaved GPT-NeoX, fused Phi-3, Gemma-2 whose template refuses a
  system role); the deltas and weight-patching tables have q, k and v rows in every layer.
"""

from __future__ import annotations

import pytest
import yaml

from mechopd.cli import main
from mechopd.core.artifacts import read_csv
from mechopd.models import load_model
from mechopd.probes import causal_items as ci
from mechopd.probes.registry import probes
from mechopd.probes.setup import ProbeSetup
from mechopd.testing.causal import output_kl
from mechopd.testing.families import EXTRA_FAMILIES

STUDY_FAMILIES = ("gpt2", "gpt_neox", "phi3", "gemma2")
PROBE_OPTIONS = {
    "gradients": {"model": "opd", "terms": "opd,nca", "estimator": "full"},
    "deltas": {"models": ["opd", "nca", "lora"], "pair": "opd,nca", "svd": True},
    "teachability": {"trained": "opd"},
    "weightpatch": {"models": ["opd"], "donor": "base", "layers": "all", "modules": "qk,vo,mlp,ctrl_qk"},
    "localization": {"model": "opd", "donor": "x"},
}


@pytest.mark.parametrize("family", EXTRA_FAMILIES)
def test_lens_and_patching_agree_with_a_plain_forward(zoo, family, tmp_path):
    from mechopd.probes.lens import run_lens
    from mechopd.probes.patching import PatchingOptions, run_patching

    setup = ProbeSetup(
        task="jsonl",
        task_options=zoo.jsonl_options(max_new_tokens=4),
        n=2,
        batch_size=2,
        seed=0,
        models={"base": str(zoo.student(family))},
    )
    run_lens(setup, tmp_path)
    run_patching(setup, tmp_path, PatchingOptions(models=["base"], components=["resid"]))
    records = ci.read_items(tmp_path / "lens_items.jsonl")
    ref = output_kl(load_model(zoo.student(family)), records)  # model(...) on each view, nothing hooked
    lens = next(float(r["kl_c_x"]) for r in read_csv(tmp_path / "lens.csv") if r["site"] == "final_norm")
    patch = next(
        float(r["kl_clean"])
        for r in read_csv(tmp_path / "patching.csv")
        if r["site"] == "final_norm" and r["direction"] == "c_to_x"
    )
    assert ref > 0
    assert abs(lens - ref) < 1e-5 * max(1.0, ref) and abs(patch - ref) < 1e-5 * max(1.0, ref), (lens, patch, ref)
    assert lens == pytest.approx(ref, rel=1e-4) and patch == pytest.approx(ref, rel=1e-4)


def _study(zoo, family: str) -> dict:
    return {
        "task": "jsonl",
        "task_options": zoo.jsonl_options(max_new_tokens=4),
        "student": str(zoo.student(family)),
        "teacher": None,
        "seeds": [0],
        "train": {"steps": 1, "batch_size": 2, "lr": 1.0e-3, "estimator": "full", "pool_size": 4},
        "runs": {
            "opd": {"method": "opd"},
            "nca": {"method": "nca", "beta": 0.5},
            "lora": {"method": "opd", "lora_rank": 2},
        },
        "eval": {"n": 2, "other_contexts": False},
        "probes": {p.name: {"n": 2, **PROBE_OPTIONS.get(p.name, {})} for p in probes()},
    }


@pytest.mark.slow
@pytest.mark.parametrize("family", STUDY_FAMILIES)
def test_a_study_with_every_probe_runs_on_the_family(zoo, family, tmp_path):
    study = tmp_path / f"{family}.yaml"
    study.write_text(yaml.safe_dump(_study(zoo, family), sort_keys=False))
    assert main(["run", str(study), "--workers", "1"]) == 0
    out = tmp_path / family
    assert (out / "report.md").is_file()
    done = {p.name for p in probes() if any((out / "probes").glob(f"{p.name}*.json"))}
    assert done == {p.name for p in probes()}
    deltas = read_csv(out / "probes" / "deltas.csv")
    for layer in ("0", "1"):
        mods = {r["module"] for r in deltas if r["layer"] == layer and r["model"] == "opd"}
        assert {"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"} <= mods, mods
    patch = {
        r["module"]: int(r["n_params"]) for r in read_csv(out / "probes" / "weightpatch.csv") if r["layer"] == "all"
    }
    assert patch["qk"] > 0 and patch["ctrl_qk"] >= patch["qk"]


def test_lora_targets_are_checked_against_the_model_before_any_job(zoo, tmp_path, capsys):
    """Phi-3 stores q, k and v in one module: a LoRA run naming only q_proj is refused before anything trains."""
    doc = _study(zoo, "phi3")
    doc["runs"]["lora"]["lora_targets"] = ["q_proj"]
    doc["probes"] = {}
    study = tmp_path / "phi3.yaml"
    study.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["run", str(study), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "runs.lora.lora_targets" in err and "q_proj, k_proj, v_proj in one module" in err
    assert not (tmp_path / "phi3" / "train").exists()
