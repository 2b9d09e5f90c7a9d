"""A study file's relative paths mean the file (#54): task data, student and checkpoints are read against the study
file's folder from any current directory, and an error names the path it looked at."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from mechopd.core.errors import MechopdError
from mechopd.pipeline.spec import StudySpec

DATA = Path(__file__).resolve().parents[2] / "mechopd" / "data"


def _study(folder: Path, **over) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA / "sample_qa.jsonl", folder / "qa.jsonl")
    shutil.copy(DATA / "sample_context.txt", folder / "context.txt")
    doc = {
        "task": "jsonl",
        "task_options": {"path": "qa.jsonl", "context_file": "./context.txt"},
        "student": "org/model",
        "train": {"steps": 2, "batch_size": 2, "pool_size": 8},
        "runs": {"opd": {"method": "opd"}},
        "eval": {"n": 4},
        **over,
    }
    (folder / "study.yaml").write_text(yaml.safe_dump(doc))
    return folder / "study.yaml"


def test_a_studys_data_is_read_beside_the_file_from_another_directory(tmp_path, monkeypatch):
    path = _study(tmp_path / "mine")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = StudySpec.load(Path("..") / "mine" / "study.yaml")
    assert spec.task_options["path"] == str(tmp_path / "mine" / "qa.jsonl")
    assert spec.task_options["context_file"] == str(tmp_path / "mine" / "context.txt")
    assert spec.student == "org/model"  # a hub id stays a hub id
    assert path.is_file()


def test_a_missing_file_is_named_where_it_was_looked_for(tmp_path, monkeypatch):
    path = _study(tmp_path / "mine", task_options={"path": "missing.jsonl"})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MechopdError, match=rf"{tmp_path}/mine/missing\.jsonl"):
        StudySpec.load(path)
    path = _study(tmp_path / "mine", runs={"opd": {"checkpoint": "../trained/final"}})
    with pytest.raises(MechopdError, match=rf"checkpoint {tmp_path}/trained/final is not a directory.*study file"):
        StudySpec.load(path)
    (tmp_path / "trained" / "final").mkdir(parents=True)
    assert StudySpec.load(path).checkpoints() == {"opd": str(tmp_path / "trained" / "final")}


def test_a_local_student_beside_the_file_is_that_directory(tmp_path, monkeypatch):
    (tmp_path / "mine" / "base").mkdir(parents=True)
    path = _study(tmp_path / "mine", student="base")
    monkeypatch.chdir(tmp_path)
    assert StudySpec.load(path).student == str(tmp_path / "mine" / "base")


def test_a_facts_pool_is_read_beside_the_study_file(tmp_path, monkeypatch):
    """``pool: pools/my.jsonl`` (the facts task's own pool) means the study file's folder, as ``path`` does."""
    from mechopd.train.rundir import DATA_OPTIONS

    (tmp_path / "mine" / "pools").mkdir(parents=True)
    shutil.copy(DATA / "facts_pool.jsonl", tmp_path / "mine" / "pools" / "my.jsonl")
    path = _study(tmp_path / "mine", task="facts", task_options={"pool": "pools/my.jsonl"})
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert StudySpec.load(path).task_options["pool"] == str(tmp_path / "mine" / "pools" / "my.jsonl")
    assert {"pool", "other_context_file"} <= set(DATA_OPTIONS)  # recorded absolute in the run's config.yaml
