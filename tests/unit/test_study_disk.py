"""A study's disk budget (#54): the checkpoint a study chooses itself serves a resume only (one, at half the steps,
removed once the final model is written); a ``save_every`` the file sets keeps its checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechopd.core.errors import ConfigError
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


def _doc(student, **train) -> dict:
    return {
        "task": "rules",
        "task_options": {"rule": "reverse"},
        "student": str(student),
        "train": {"steps": 3, "batch_size": 2, **train},
        "runs": {"opd": {"method": "opd"}, "nca": {"method": "nca", "beta": 0.5}},
        "eval": {"n": 4},
    }


def test_the_estimate_counts_the_final_models_and_the_one_checkpoint_in_flight(tiny_rules_organism):
    from mechopd.pipeline import budget
    from mechopd.pipeline.run import seed_runs

    params = budget.parameter_count(tiny_rules_organism)
    assert params and params > 1000
    runs = seed_runs(StudySpec.load(_doc(tiny_rules_organism), source="s.yaml"), Path("OUT"), str(tiny_rules_organism))
    est = budget.estimate(runs, str(tiny_rules_organism), workers=1)
    model = params * 4
    assert est.runs == 2 and est.disk == 2 * model  # two final models; the study's own checkpoint goes after final/
    assert est.peak == model + params * budget.ADAM_BYTES  # one checkpoint with its AdamW moments at a time
    kept = budget.estimate(
        seed_runs(StudySpec.load(_doc(tiny_rules_organism, save_every=1), source="s.yaml"), Path("OUT"), "x"),
        str(tiny_rules_organism),
        workers=1,
    )
    assert kept.disk == 2 * (model + 3 * model + params * budget.ADAM_BYTES)  # step-1..3 kept, the latest resumable


def test_a_study_the_disk_cannot_hold_is_refused_with_the_numbers_before_any_file(
    tiny_rules_organism, tmp_path, monkeypatch, capsys
):
    from mechopd.pipeline import budget
    from mechopd.pipeline.run import run_study

    monkeypatch.setattr(budget, "free_bytes", lambda out: 1000)
    out = tmp_path / "study"
    with pytest.raises(ConfigError) as e:
        run_study(_doc(tiny_rules_organism), out, workers=1)
    msg = str(e.value)
    assert msg.startswith(f"{out.resolve()}: the study needs about ") and "0.00 GB free" in msg, msg
    assert "nothing was trained" in msg
    assert "estimate: 2 run(s) to train write" in capsys.readouterr().out
    assert not (out / "train").exists() and not (out / "study.yaml").exists()


def test_the_study_clock_gives_an_eta_from_the_measured_jobs():
    from mechopd.pipeline.budget import StudyClock

    said: list[str] = []
    clock = StudyClock(said.append, trainings=3, finishes=1, workers=1)
    clock("OUT: opd ...")
    clock("OUT: opd done (60 s)")
    clock("OUT: nca done (120 s)")
    assert said[0] == "OUT: opd ..."
    assert said[1].endswith(
        "left: 2 training, 1 evaluation/probes/report job(s); ETA about 2 min 00 s + 1 "
        "evaluation/probes/report job(s), not measured yet"
    )
    assert said[2].endswith(
        "left: 1 training, 1 evaluation/probes/report job(s); ETA about 1 min 30 s + 1 "
        "evaluation/probes/report job(s), not measured yet"
    )
    clock("OUT: ta_opd done (90 s)")
    assert said[-1].endswith("left: 1 evaluation/probes/report job(s); an ETA once one of each kind is done")
    clock("OUT: finish done (30 s)")
    assert said[-1].endswith("every job done")


def test_a_studys_log_lines_are_not_the_demos(capsys):
    from mechopd.pipeline import logline, stages

    stages._log("x")
    with logline.as_run():
        stages._log("y")
    stages._log("z")
    lines = capsys.readouterr().out.splitlines()
    assert [line[:5] for line in lines] == ["[demo", "[run ", "[demo"]
