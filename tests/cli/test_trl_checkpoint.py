"""TRL's checkpoints, probed (issue 55, item 4): `training/trl_distill.py` runs TRL's on-policy `DistillationTrainer`
with the context in the teacher's prompt only, saved as TRL saves it (``checkpoint-N`` with optimizer, scheduler, RNG
and trainer state); `mechopd run` on the study it writes evaluates and probes that checkpoint beside mechopd's OPD."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from mechopd.cli import main
from tests.cli.hostile import copy_org

pytest.importorskip("trl", reason="TRL comes with the bench extra (pip install -e '.[bench]')")

ROOT = Path(__file__).resolve().parents[2]


def _recipe():
    spec = importlib.util.spec_from_file_location("trl_distill", ROOT / "training" / "trl_distill.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _source_study(tmp_path: Path, org: Path) -> Path:
    doc = {
        "task": "rules",
        "student": str(org),
        "seeds": [0],
        "train": {"steps": 2, "batch_size": 2, "lr": 1.0e-3, "pool_size": 8},
        "runs": {"opd": {"method": "opd"}},
        "eval": {"n": 4},
        "probe_n": 2,
    }
    path = tmp_path / "source.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_trl_checkpoint_goes_through_mechopd_run(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    monkeypatch.chdir(tmp_path)
    org = copy_org(Path(tiny_rules_organism), tmp_path)
    out = tmp_path / "trl_run"
    assert _recipe().main(["--study", str(_source_study(tmp_path, org)), "--out", str(out)]) == 0
    checkpoint = out / "trl" / "checkpoint-2"
    for name in ("model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "trainer_state.json"):
        assert (checkpoint / name).is_file(), sorted(p.name for p in checkpoint.iterdir())
    trained, base = load_file(checkpoint / "model.safetensors"), load_file(org / "model.safetensors")
    assert any(not trained[k].equal(base[k]) for k in base), "TRL's two steps changed no weight"

    study = out / "study.yaml"
    assert yaml.safe_load(study.read_text())["runs"]["trl"] == {"checkpoint": str(checkpoint.resolve())}
    capsys.readouterr()
    assert main(["run", str(study), "--out", str(out / "study")]) == 0, capsys.readouterr().err
    assert "trl from checkpoint(s), not trained" in capsys.readouterr().out
    done = out / "study"
    summary = json.loads((done / "eval" / "trl.json").read_text())
    assert summary["settings"]["model"] == str(checkpoint.resolve())
    report = (done / "report.md").read_text()
    table = report.split("## Context removability", 1)[1].split("\n\n", 2)[1]
    assert "| Acc_x | Acc_xc | Harm |" in table and any(r.startswith("| trl | 4 |") for r in table.splitlines()), table
    probes = report.split("## Mechanistic probes", 1)[1]
    assert "; trl 0." in probes.split("**Two-view hidden-state cosine**", 1)[1].split("\n")[0], probes[:600]
    assert "trl − opd:" in probes.split("**Parameter updates**", 1)[1].split("\n")[0], probes[:600]
    assert any(line.startswith("trl,") for line in (done / "probes" / "similarity.csv").read_text().splitlines())
    deltas = [p for p in (done / "probes").glob("deltas*.csv")]
    assert deltas and any("trl" in p.read_text() for p in deltas), sorted(p.name for p in (done / "probes").iterdir())


def test_a_bad_study_is_one_line_and_exit_2(tmp_path, capsys):
    assert _recipe().main(["--study", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --study") and err.count("\n") == 1, err


def test_the_teacher_reads_the_context_and_the_student_does_not(tiny_rules_organism, tmp_path):
    """One TRL step: the teacher's loss forward reads mechopd's context view + the completion, the student's the
    no-context view + the same completion (pads stripped), row by row."""
    import argparse

    from mechopd.core.views import RenderSpec, render_prompt_ids
    from mechopd.tasks.base import get_task

    mod = _recipe()
    org = copy_org(Path(tiny_rules_organism), tmp_path)
    study, _ = mod.load_study(str(_source_study(tmp_path, org)))
    s = mod.settings(study, argparse.Namespace(steps=1, batch_size=None, lr=None))
    trainer = mod.make_trainer(study, tmp_path / "o", s, save_steps=1, seed=0)
    seen: dict[str, list] = {"teacher": [], "student": []}

    def hook(role):
        def grab(module, args, kwargs):
            if kwargs.get("use_cache") is False:  # the loss forward (generation runs with the cache)
                rows = zip(kwargs["input_ids"].tolist(), kwargs["attention_mask"].tolist(), strict=True)
                seen[role].append([[t for t, m in zip(ids, mask, strict=True) if m] for ids, mask in rows])

        return grab

    trainer.teacher_model.base_model.register_forward_pre_hook(hook("teacher"), with_kwargs=True)
    trainer.model.base_model.register_forward_pre_hook(hook("student"), with_kwargs=True)
    trainer.train()
    assert len(seen["teacher"]) == len(seen["student"]) == 1
    task = get_task("rules")
    spec = RenderSpec(placement=task.placement)
    views = {
        tuple(render_prompt_ids(trainer.processing_class, ex.prompt, None, spec)): render_prompt_ids(
            trainer.processing_class, ex.prompt, ex.context, spec
        )
        for ex in task.examples("train", s["pool_size"], 0)
    }
    for student, teacher in zip(seen["student"][0], seen["teacher"][0], strict=True):
        prompt = next(p for p in views if tuple(student[: len(p)]) == p)
        completion = student[len(prompt) :]
        assert completion and teacher == views[prompt] + completion
        assert len(teacher) > len(student)  # the context is in the teacher's input only
