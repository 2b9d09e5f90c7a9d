"""A study's disk budget (#54): the checkpoint a study chooses itself serves a resume only (one, at half the steps,
removed once the final model is written); a ``save_every`` the file sets keeps its checkpoints."""

from __future__ import annotations

from mechopd.pipeline.spec import StudySpec


def _spec(train: dict, **run) -> StudySpec:
    doc = {
        "task": "rules",
        "task_options": {"rule": "reverse"},
        "student": "org/model",  # not an organism: its recipe would set save_every
        "train": {"batch_size": 2, **train},
        "runs": {"opd": {"method": "opd", **run}},
        "eval": {"n": 8},
    }
    return StudySpec.load(doc, source="s.yaml")


def test_a_study_checkpoints_once_at_half_its_steps_to_resume_and_drops_it_after_the_final_model():
    for steps, every in ((3, 2), (24, 12), (1, 1)):
        cfg = _spec({"steps": steps}).train_config("opd", 0)
        assert (cfg.save_every, cfg.keep_checkpoints) == (every, False), steps


def test_a_save_every_the_file_sets_keeps_its_checkpoints():
    assert _spec({"steps": 4, "save_every": 1}).train_config("opd", 0).keep_checkpoints is True
    assert _spec({"steps": 4}, save_every=2).train_config("opd", 0).keep_checkpoints is True
    assert _spec({"steps": 4, "keep_checkpoints": True}).train_config("opd", 0).keep_checkpoints is True
