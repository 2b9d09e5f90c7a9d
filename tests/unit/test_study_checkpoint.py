"""A study's checkpoint run (`runs: {ROLE: {checkpoint: DIR}}`, `mechopd.pipeline.spec`): a model trained elsewhere,
evaluated and probed, never trained; with a training field, or a directory that is not there, one line naming it."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from mechopd.config import TrainConfig
from mechopd.core.errors import ConfigError
from mechopd.pipeline.spec import CHECKPOINT, StudySpec


def _doc(**runs) -> dict:
    return {
        "task": "rules",
        "task_options": {"rule": "reverse"},
        "student": "organism:rules",
        "train": {"steps": 4, "batch_size": 2},
        "runs": runs,
        "eval": {"n": 8},
    }


def _refusal(doc: dict) -> str:
    with pytest.raises(ConfigError) as e:
        StudySpec.load(doc, source="s.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("s.yaml: "), msg
    return msg


def test_the_key_is_no_training_field():
    assert CHECKPOINT not in {f.name for f in fields(TrainConfig)}


def test_a_checkpoint_run_is_read_against_the_current_directory_and_not_trained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old" / "final").mkdir(parents=True)
    spec = StudySpec.load(
        {
            **_doc(opd={"method": "opd"}, old={CHECKPOINT: "old/final"}),
            "probes": {"similarity": {"models": ["opd", "old"]}},
        }
    )
    assert spec.trained == ["opd"]
    assert spec.checkpoints() == {"old": str((tmp_path / "old" / "final").resolve())}
    assert spec.methods()["old"] == {CHECKPOINT: str((tmp_path / "old" / "final").resolve())}
    assert spec.methods()["opd"]["steps"] == 4  # a trained run: the shared fields under its own
    assert spec.runs["old"] == {CHECKPOINT: "old/final"}  # as the file says (a rerun compares it)
    with pytest.raises(ConfigError, match="runs.old is a checkpoint run"):
        spec.train_config("old", 0)


def test_a_study_of_checkpoints_only_has_the_shared_schedule(tmp_path):
    (tmp_path / "a").mkdir()
    spec = StudySpec.load(_doc(opd={CHECKPOINT: str(tmp_path / "a")}))
    assert spec.trained == [] and list(spec.checkpoints()) == ["opd"]
    assert spec.first_config(0).steps == 4  # what demo.json's config and the organism's directory read


@pytest.mark.parametrize("field", ["method", "beta", "steps", "seed", "no_such_field"])
def test_a_checkpoint_run_with_a_training_field_is_refused(tmp_path, field):
    msg = _refusal(_doc(old={CHECKPOINT: str(tmp_path), field: 1}))
    assert f"runs.old names a checkpoint and sets {field}" in msg and f"drop {field}" in msg, msg


@pytest.mark.parametrize("value", ["no/such/dir", "afile"])
def test_a_checkpoint_that_is_not_a_directory_is_refused_naming_it(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("weights?\n")
    msg = _refusal(_doc(opd={"method": "opd"}, old={CHECKPOINT: value}))
    assert f"runs.old.checkpoint {value} is not a directory" in msg, msg


@pytest.mark.parametrize("value", [None, "", 3, ["a"]])
def test_a_checkpoint_that_is_no_path_is_refused(value):
    assert "runs.old.checkpoint must be the directory of a trained model" in _refusal(_doc(old={CHECKPOINT: value}))


def test_a_probe_reads_a_checkpoint_runs_role_and_no_other(tmp_path):
    doc = {**_doc(old={CHECKPOINT: str(tmp_path)}), "probes": {"similarity": {"models": ["old", "nca"]}}}
    assert "probes.similarity reads the role(s) nca, which the study lacks" in _refusal(doc)


@pytest.mark.parametrize(
    ("probe", "needle"),
    [
        ({"select": "opdd"}, "probes.localization.select='opdd' is not a run of the study; name one of opd, given"),
        ({"select": "base"}, "select='base' is not a run of the study"),
        ({"select": "teacher"}, "select='teacher' is not a run of the study"),
        ({"select": "opd", "split": "train"}, r"select='opd' picks held-out \(test\) items.*drop split: train"),
    ],
)
def test_a_probes_select_names_a_run_of_the_study_at_load(tmp_path, probe, needle):
    """``select`` picks items from a run's evaluation: a typo, base or teacher, or the train split, refused at load."""
    doc = _doc(opd={"method": "opd"}, given={CHECKPOINT: str(tmp_path)})
    assert StudySpec.load({**doc, "probes": {"localization": {"select": "given"}}}, source="s.yaml")
    assert re.search(needle, _refusal({**doc, "probes": {"localization": probe}}))


def test_a_checkpoint_of_another_shape_than_an_organism_student_is_refused_before_any_job(tmp_path):
    """With ``student: organism:<task>`` (no config.json yet) the checkpoint is compared with the organism's recipe,
    or with its cached config.json when it is there."""
    from transformers import AutoModelForCausalLM

    from mechopd.organisms.tokenizer import build_tokenizer
    from mechopd.pipeline.preflight import check_study_models
    from mechopd.testing.families import tiny_config

    tok = build_tokenizer(["a", "b", "c"])
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = AutoModelForCausalLM.from_config(tiny_config("gpt2", vocab_size=len(tok), layers=5, **ids))
    model.save_pretrained(tmp_path / "ck")
    tok.save_pretrained(tmp_path / "ck")
    doc = _doc(opd={"method": "opd"}, given={CHECKPOINT: str(tmp_path / "ck")})
    doc["train"] = {**doc["train"], "organism_dir": str(tmp_path / "organisms")}
    with pytest.raises(ConfigError, match=r"runs.given.checkpoint .*model_type 'gpt2' vs the student's 'qwen3'"):
        check_study_models(StudySpec.load(doc, source="s.yaml"))
    (tmp_path / "organisms" / "rules").mkdir(parents=True)
    model.config.save_pretrained(tmp_path / "organisms" / "rules")  # the cached organism is that shape: accepted
    check_study_models(StudySpec.load(doc, source="s.yaml"))


def test_a_study_without_runs_shows_a_balanced_example(tmp_path):
    """The missing-key message's example is a study a user can paste (it once printed ``{method: opd}}}}``)."""
    with pytest.raises(ConfigError) as e:
        StudySpec.load({"task": "rules", "student": "organism:rules"}, source="s.yaml")
    assert str(e.value).endswith("needs 'runs' (e.g. task: jsonl, student: PATH, runs: {opd: {method: opd}})"), e.value
