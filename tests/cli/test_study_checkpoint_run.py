"""`mechopd run` on a study with a checkpoint run (`runs: {given: {checkpoint: DIR}}`): the model is evaluated and
probed as the trained run is, never trained; the run dir records where it came from (``demo.json``, ``study.yaml``,
its content in ``study_inputs.json``), and a rerun over a changed checkpoint is refused."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mechopd.cli import main
from tests.cli.hostile import copy_org
from tests.cli.reliability_harness import poison


def _study(tmp_path: Path, org: Path, runs: dict, **more) -> Path:
    doc = {
        "task": "rules",
        "student": str(org),
        "seeds": [0],
        "train": {"steps": 1, "batch_size": 2, "estimator": "full"},
        "runs": runs,
        "eval": {"n": 2, "other_contexts": False},
        **more,
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_checkpoint_run_is_evaluated_and_probed_not_trained(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    org = copy_org(Path(tiny_rules_organism), tmp_path)
    given = poison(copy_org(Path(tiny_rules_organism), tmp_path, "given"), 0.5)  # another model, finite
    runs = {"opd": {"method": "opd"}, "given": {"checkpoint": "given"}}
    study = _study(tmp_path, org, runs, probes={"similarity": {"n": 2, "models": ["base", "given"]}})
    out = tmp_path / "out"
    assert main(["run", str(study), "--out", str(out)]) == 0, capsys.readouterr().err
    assert "given from checkpoint(s), not trained" in capsys.readouterr().out
    assert (out / "train" / "opd" / "final" / "training.json").is_file()
    assert not (out / "train" / "given").exists()  # never trained, no link to it either
    assert json.loads((out / "eval" / "given.json").read_text())["settings"]["model"] == str(given.resolve())
    manifest = json.loads((out / "demo.json").read_text())
    assert manifest["methods"] == ["opd", "given"] and manifest["runs"]["given"] == {"checkpoint": str(given.resolve())}
    recorded = yaml.safe_load((out / "study.yaml").read_text())["runs"]["given"]
    assert recorded == {"name": "given", "model": str(given.resolve())}
    inputs = json.loads((out / "study_inputs.json").read_text())
    assert inputs["runs.given.checkpoint"]["path"] == str(given.resolve())
    table = (out / "probes" / "similarity.csv").read_text()
    assert "given" in table and ",opd," not in table  # the probe read the checkpoint run's role
    report = (out / "report.md").read_text()
    assert "given: given checkpoint, not trained here; Every other method trained from it" in report, report[:600]

    capsys.readouterr()
    assert main(["run", str(study), "--out", str(out)]) == 0
    assert "done, nothing to run" in capsys.readouterr().out

    poison(given, 0.25)  # the checkpoint changed under the same name: its finished results are not reused
    assert main(["run", str(study), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "made from other inputs (runs.given.checkpoint" in err, err


def test_a_study_of_checkpoints_only_trains_nothing(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    """The probe studies' shape (`probes/*.yaml`): every run a checkpoint."""
    monkeypatch.chdir(tmp_path)
    org = copy_org(Path(tiny_rules_organism), tmp_path)
    given = copy_org(Path(tiny_rules_organism), tmp_path, "given")
    study = _study(tmp_path, org, {"opd": {"checkpoint": str(given)}})
    out = tmp_path / "out"
    assert main(["run", str(study), "--out", str(out)]) == 0, capsys.readouterr().err
    assert not (out / "train").exists()
    assert sorted(p.name for p in (out / "eval").glob("*.json")) == ["base.json", "opd.json"]
    opening = (out / "report.md").read_text().split("\n\n")[1]
    assert "OPD: given checkpoint, not trained here; evaluated greedily" in opening and "steps" not in opening, opening
    # `mechopd probe NAME --run` takes the setup from the run dir: the checkpoint as opd, the student as base
    assert main(["probe", "similarity", "--run", str(out), "--n", "2"]) == 0, capsys.readouterr().err
    settings = json.loads((out / "probes" / "similarity.json").read_text())["settings"]
    assert settings["models"] == {"base": str(org.resolve()), "opd": str(given.resolve())}, settings


def test_a_checkpoint_run_is_labelled_by_the_config_it_records(tmp_path):
    """A checkpoint `mechopd train` wrote records its config (``final/training.json``): the report labels it by that
    method (not by its role); one that records none keeps its role as its label."""
    from mechopd.pipeline.stages import labels_for

    made = tmp_path / "elsewhere" / "final"
    made.mkdir(parents=True)
    (made / "training.json").write_text(json.dumps({"step": 8, "config": {"method": "nca", "beta": 0.25}}))
    bare = tmp_path / "bare"
    bare.mkdir()
    runs = {"mine": {"checkpoint": str(made)}, "other": {"checkpoint": str(bare)}, "opd": {"method": "opd"}}
    labels = labels_for(tmp_path / "run", runs)
    assert labels == {"base": "base", "mine": "NCA (β=0.25, constant)", "other": "other", "opd": "OPD"}, labels
