"""`mechopd demo --study NAME`: a built-in study chosen by name, its ``--fast`` shrink, the flags it refuses, and the
shipped smollm2-facts study (a real 135M student: its file is checked here, the model is not loaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechopd.cli import main
from mechopd.core.errors import ConfigError
from mechopd.pipeline import named
from mechopd.pipeline.demo import fast_values
from mechopd.pipeline.spec import STUDIES_DIR, StudySpec

NAME = "smollm2-facts"


def test_the_smollm2_study_is_a_valid_study_of_the_runs_it_promises():
    spec = named.load_named(NAME)
    assert spec.student == "model:smollm2-135m-instruct" and spec.task == "jsonl"
    assert spec.task_options["placement"] == spec.render["placement"] == "user"
    assert spec.render["no_context_system"].startswith("You are a helpful AI assistant named SmolLM")
    assert spec.task_options["answer_format"] == "contains"
    assert len(spec.seeds) >= 3  # OPD and NCA over three seeds at least
    assert {r["method"] for r in spec.runs.values()} == {"opd", "nca"}
    assert any(r.get("selector") == "ta_opd" for r in spec.runs.values())
    assert any(r["method"] == "nca" and r.get("lora_rank", 0) > 0 for r in spec.runs.values())
    assert spec.eval["other_contexts"] is True
    assert {"similarity", "gradients", "deltas", "teachability", "lens", "weightpatch", "localization"} <= set(
        spec.probes
    )


def test_fast_is_one_seed_at_the_fast_files_sizes_and_shipped_paths_are_absolute():
    spec = named.load_named(NAME)
    doc, values = named.shrink(spec, fast=True), {**fast_values(), **named.study_fast_values(NAME)}
    assert named.study_fast_values(NAME)["steps"] < spec.train["steps"]  # the real model's smoke run is its own
    assert doc["seeds"] == spec.seeds[:1]
    assert {k: doc["train"][k] for k in ("steps", "batch_size", "eval_every")} == {
        k: values[k] for k in ("steps", "batch_size", "eval_every")
    }
    assert doc["eval"]["n"] == doc["train"]["eval_n"] == min(values["eval_n"], spec.eval_n)
    assert doc["probe_n"] == values["probe_n"]
    anchored = [r for r in doc["runs"].values() if "nca_start" in r]
    assert anchored and all(r["nca_start"] == values["nca_start"] for r in anchored)
    assert all("save_every" not in r for r in doc["runs"].values())
    assert Path(doc["task_options"]["path"]).is_absolute() and Path(doc["task_options"]["path"]).is_file()
    StudySpec.load({**doc, "student": "model:smollm2-135m-instruct"})  # still a valid study
    full = named.shrink(spec, fast=False, steps=2)
    assert full["seeds"] == spec.seeds and full["train"]["steps"] == 2  # the caller's steps win
    assert full["train"]["batch_size"] == spec.train["batch_size"]


def test_demo_study_runs_the_named_file_through_run_study(monkeypatch, tmp_path, capsys):
    seen = {}

    def fake_run_study(doc, out, workers):
        seen.update(doc=doc, out=out, workers=workers)
        return Path(out) / "report.md"

    monkeypatch.setattr("mechopd.pipeline.run.run_study", fake_run_study)
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--study", NAME, "--fast", "--workers", "1"]) == 0
    assert seen["out"] == Path("runs") / f"{NAME}-fast" and seen["workers"] == 1
    assert seen["doc"]["train"]["steps"] == named.study_fast_values(NAME)["steps"]
    assert Path(seen["doc"]["task_options"]["context_file"]).is_file()  # the shipped data, from any directory
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"SMOKE RUN (mechopd demo --study {NAME} --fast)") and "too small to decide" in first


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--study", "nope"], "no built-in study of that name; choose one of"),
        (["--study", "../x"], "no built-in study of that name"),
        (["--study", NAME, "--task", "rules"], "takes no --task"),
        (["--study", NAME, "--seeds", "2"], "takes no --seeds"),
        (["--study", NAME, "--sweep"], "takes no --sweep"),
        (["--study", NAME, "--steps", "0"], "--steps 0 is invalid"),
    ],
)
def test_bad_study_flags_are_one_error_line(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", *argv]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error:") and words in line and "\n" not in line
    assert not (tmp_path / "runs").exists()


def test_a_bad_fast_file_is_refused(monkeypatch, tmp_path):
    (tmp_path / "fast").mkdir()
    (tmp_path / "fast" / "x.yaml").write_text("stepz: 2\n")
    monkeypatch.setattr(named, "STUDIES_DIR", tmp_path)
    with pytest.raises(ConfigError, match="'stepz' is no --fast value"):
        named.study_fast_values("x")
    (tmp_path / "fast" / "x.yaml").write_text("steps: -1\n")
    with pytest.raises(ConfigError, match="steps=-1 must be a number >= 0"):
        named.study_fast_values("x")
    assert named.study_fast_values("none") == {}


def test_every_built_in_study_is_named_by_its_file():
    assert NAME in named.study_names()
    assert named.study_names() == sorted(p.stem for p in STUDIES_DIR.glob("*.yaml"))
    with pytest.raises(ConfigError, match=NAME):
        named.study_file("missing")


def test_the_smollm2_studys_models_have_distinct_labels_and_the_lora_student_says_so(tmp_path):
    """The report keys its tables by label: nca and nca_lora once read alike and the LoRA row replaced NCA's."""
    from mechopd.pipeline.stages import labels_for

    labels = labels_for(tmp_path, named.load_named(NAME).runs)
    assert len(set(labels.values())) == len(labels), labels
    assert labels["nca_lora"].endswith("LoRA r=8") and "LoRA" not in labels["nca"]
    twins = labels_for(tmp_path, {"a": {"method": "nca"}, "b": {"method": "nca"}})
    assert twins["a"].endswith("[a]") and twins["b"].endswith("[b]") and twins["a"] != twins["b"]
