"""`mechopd run STUDY.yaml` end to end on a model that is not an organism: the zoo's tiny Llama-3 (built from a
config, byte-level BPE tokenizer, a chat template with a date header) on a JSONL task, two seeds, OPD + NCA, one
probe; the report and its claims table are written, and a second run of the finished study does nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mechopd.cli import main

from .helpers import TEMPLATE_KWARGS


def _study(zoo) -> dict:
    return {
        "task": "jsonl",
        "task_options": zoo.jsonl_options(max_new_tokens=4),
        "render": {"placement": "system", "no_context_system": "", "chat_template_kwargs": TEMPLATE_KWARGS["llama"]},
        "student": str(zoo.student("llama")),
        "teacher": None,
        "seeds": [0, 1],
        "train": {"steps": 2, "batch_size": 4, "lr": 1.0e-3, "estimator": "full", "pool_size": 8},
        "runs": {"opd": {"method": "opd"}, "nca": {"method": "nca", "beta": 0.5}},
        "eval": {"n": 4, "other_contexts": False},
        "probes": {"similarity": {"n": 2}},
    }


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_a_study_runs_end_to_end_on_a_real_architecture_and_a_rerun_is_done(zoo, tmp_path, capsys):
    study = tmp_path / "llama-jsonl.yaml"
    study.write_text(yaml.safe_dump(_study(zoo), sort_keys=False))
    assert main(["run", str(study), "--workers", "2"]) == 0  # the demo's worker pool: one log per job
    out = tmp_path / "llama-jsonl"  # default: the study file's folder / its stem
    for k in (0, 1):
        seed = out / f"seed-{k}"
        for role in ("opd", "nca"):
            assert (seed / "train" / role / "final" / "training.json").is_file()
            assert (seed / "eval" / f"{role}.json").is_file()
        assert (seed / "eval" / "base.json").is_file()
        assert sorted(p.name for p in (seed / "logs").glob("*.log")) == ["finish.log", "train-nca.log", "train-opd.log"]
        assert (seed / "probes" / "similarity.csv").is_file() and (seed / "probes" / "similarity.json").is_file()
        assert not (seed / "probes" / "deltas.csv").exists()  # only the listed probes run
        assert "## The papers' claims" in (seed / "report.md").read_text()
    report = (out / "report.md").read_text()
    assert "2 training seeds" in report and "## The papers' claims" in report
    table = report[report.index("## The papers' claims") :]
    ta_row = next(line for line in table.splitlines() if line.startswith("| TA-OPD"))
    assert "not measurable" in ta_row and "TA-OPD Acc_x n/a" in ta_row  # the study has no ta_opd run
    assert "NCA Acc_x 0" in table or "NCA Acc_x 1" in table  # the roles it has are measured (per seed values)
    assert f"mechopd run {out / 'study_run.yaml'} --out {out}" in report  # how to rerun it
    assert (out / "aggregate.json").is_file()
    capsys.readouterr()

    before = _files(out)
    assert main(["run", str(study), "--workers", "1"]) == 0
    said = capsys.readouterr().out
    assert "done, nothing to run" in said
    assert _files(out) == before  # nothing trained, evaluated or rewritten: no file added or touched

    doc = _study(zoo)
    doc["probes"]["deltas"] = {}  # a probe added to the finished study: it runs, the trainings are reused
    study.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["run", str(study), "--workers", "1"]) == 0
    after = _files(out)
    for k in (0, 1):
        assert (out / f"seed-{k}" / "probes" / "deltas.csv").is_file()
        for role in ("opd", "nca"):
            metrics = f"seed-{k}/train/{role}/metrics.jsonl"
            assert after[metrics] == before[metrics]


def test_a_study_with_another_config_is_refused_in_a_finished_out(zoo, tmp_path, capsys):
    doc = _study(zoo)
    out = tmp_path / "out"
    out.mkdir()
    (out / "study_run.yaml").write_text("task: jsonl\nseeds: [5]\n")
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(doc))
    assert main(["run", str(study), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "another study" in err and "seeds" in err


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda d: d.update(colour="red"), ["unknown key 'colour'"]),
        (lambda d: d["runs"].update({"2nd": {"method": "opd"}}), ["runs.2nd", "identifier"]),
        (lambda d: d["runs"]["nca"].update(betta=0.5), ["runs.nca", "betta"]),
        (lambda d: d["runs"]["nca"].update(beta=-1.0), ["runs.nca", "beta"]),
        (lambda d: d["train"].update(seed=3), ["train.seed", "top-level"]),
        (lambda d: d["probes"].update(no_such_probe={}), ["no_such_probe"]),
        (lambda d: d["probes"]["similarity"].update(colour=1), ["probes.similarity", "colour"]),
        (lambda d: d["probes"].update(teachability={}), ["probes.teachability", "ta_opd"]),
        (lambda d: d.update(seeds=[0, 0]), ["seeds", "twice"]),
        (lambda d: d["eval"].update(n=10_000), ["eval.n"]),
        (lambda d: d["runs"]["nca"].update(pool_size=10_000), ["runs.nca.pool_size=10000", "train items"]),
        (lambda d: d["probes"]["similarity"].update(n=10_000), ["probes.similarity.n=10000", "test items"]),
        (lambda d: d["render"].update(placement="user"), ["render.placement"]),
        (lambda d: d.update(student="./no/such/checkpoint"), ["student", "does not exist"]),
    ],
)
def test_bad_study_files_are_one_line_errors_before_any_job(zoo, tmp_path, capsys, change, words):
    doc = _study(zoo)
    change(doc)
    study = tmp_path / "bad.yaml"
    study.write_text(yaml.safe_dump(doc))
    assert main(["run", str(study)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, err
    for w in words:
        assert w in err, (w, err)
    assert not (tmp_path / "bad").exists()  # nothing written


def test_run_study_of_a_mapping_needs_an_out(zoo):
    from mechopd.core.errors import ConfigError
    from mechopd.pipeline.run import run_study

    with pytest.raises(ConfigError, match="out="):
        run_study(_study(zoo))


def test_the_example_real_model_study_is_valid():
    from mechopd.pipeline.spec import StudySpec

    root = Path(__file__).resolve().parents[2]
    spec = StudySpec.load(root / "training" / "studies" / "qwen3-1.7b-jsonl.yaml")
    assert spec.student == "Qwen/Qwen3-1.7B" and list(spec.runs) == ["opd", "nca"] and len(spec.seeds) == 3
    assert spec.train_config("nca", 2).beta == 0.5 and spec.train_config("nca", 2).seed == 2
