"""Paths a run records are absolute or relative to the RUN, never to the current directory: a resume or a probe from
another directory gives the same numbers; eval's default report is not inside a checkpoint and a resume keeps files
it did not write; a demo refuses another seed's directory and an --out inside a checkpoint."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from mechopd.cli import main
from tests.cli.reliability_harness import poison

TRAIN = ("--steps", "4", "--batch-size", "2", "--set", "save_every=2", "--no-progress")


def _metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model.safetensors"))


def _workspace(org: Path, tmp: Path) -> tuple[Path, Path]:
    """ws/A/org: the organism the run is started with (as the relative path ``org``); ws/B/org: a DIFFERENT model
    at the same relative path from B (so a path read against the current directory would silently change models)."""
    a, b = tmp / "A", tmp / "B"
    shutil.copytree(org, a / "org")
    poison(Path(shutil.copytree(org, b / "org")), 0.5)  # finite, but another model
    return a, b


def test_resume_from_another_directory_gives_the_same_run(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    a, b = _workspace(Path(tiny_rules_organism), tmp_path)
    monkeypatch.chdir(a)
    assert main(["train", "--student", "org", "--out", "straight", *TRAIN]) == 0  # the reference: 4 steps at once
    assert (
        main(
            [
                "train",
                "--student",
                "org",
                "--out",
                "split",
                *TRAIN[:0],
                "--steps",
                "2",
                "--batch-size",
                "2",
                "--set",
                "save_every=2",
                "--no-progress",
            ]
        )
        == 0
    )
    cfg = (a / "split" / "config.yaml").read_text()
    assert f"student: {a / 'org'}" in cfg and f"organism_dir: {a / 'runs' / 'organisms'}" in cfg  # absolute
    capsys.readouterr()
    monkeypatch.chdir(b)  # the same command typed from B, where `org` is another model
    assert main(["train", "--student", "org", "--out", str(a / "split"), "--resume", *TRAIN]) == 0
    assert "read as the run's" in capsys.readouterr().out  # and it says so
    ref, got = _metrics(a / "straight"), _metrics(a / "split")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for r, g in zip(ref, got):
        assert r["loss"] == g["loss"] and r["kl/teacher_student"] == g["kl/teacher_student"], (r["step"], r, g)
    wr, wg = _weights(a / "straight" / "final"), _weights(a / "split" / "final")
    assert all(torch.equal(wr[k], wg[k]) for k in wr)


def test_probe_run_from_another_directory_same_numbers(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    a, b = _workspace(Path(tiny_rules_organism), tmp_path)
    monkeypatch.chdir(a)
    assert main(["train", "--student", "org", "--out", "run", *TRAIN]) == 0
    assert main(["probe", "deltas", "--run", "run", "--out", str(tmp_path / "here")]) == 0
    monkeypatch.chdir(b)
    assert main(["probe", "deltas", "--run", "../A/run", "--out", str(tmp_path / "there")]) == 0
    here = json.loads((tmp_path / "here" / "deltas_summary.json").read_text())
    there = json.loads((tmp_path / "there" / "deltas_summary.json").read_text())
    assert here["rel_delta"] == there["rel_delta"] and here["rel_delta"]["opd"] > 0
    # a run written by an older mechopd (a relative student, typed from A): from B it is refused, not misread
    cfg = (a / "run" / "config.yaml").read_text().replace(f"student: {a / 'org'}", "student: org")
    (a / "run" / "config.yaml").write_text(cfg)
    capsys.readouterr()
    assert main(["probe", "deltas", "--run", "../A/run", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "relative to the directory it was started from" in err and str(b / "org") in err


def test_eval_default_is_outside_the_checkpoint_and_resume_keeps_foreign_files(
    tiny_rules_organism, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "train",
                "--student",
                str(tiny_rules_organism),
                "--out",
                "r",
                "--steps",
                "2",
                "--batch-size",
                "2",
                "--set",
                "save_every=2",
                "--no-progress",
            ]
        )
        == 0
    )
    assert main(["eval", "--task", "rules", "--model", "r/final", "--n", "4"]) == 0
    assert (tmp_path / "r" / "eval" / "rules.json").is_file() and not (tmp_path / "r" / "final" / "eval").exists()
    (tmp_path / "r" / "final" / "NOTES.md").write_text("mine")  # a file the run did not write
    (tmp_path / "r" / "final" / "eval").mkdir()
    (tmp_path / "r" / "final" / "eval" / "old.json").write_text("{}")
    assert (
        main(
            [
                "train",
                "--student",
                str(tiny_rules_organism),
                "--out",
                "r",
                "--steps",
                "4",
                "--batch-size",
                "2",
                "--set",
                "save_every=2",
                "--no-progress",
                "--resume",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "r" / "final" / "training.json").read_text())["step"] == 4
    assert (tmp_path / "r" / "final" / "NOTES.md").read_text() == "mine"
    assert (tmp_path / "r" / "final" / "eval" / "old.json").read_text() == "{}"
    assert (tmp_path / "r" / "eval" / "rules.json").is_file()


def _fake_demo(d: Path, **cfg) -> None:
    from mechopd.pipeline.demo import DemoConfig

    d.mkdir(parents=True)
    conf = dataclasses.asdict(DemoConfig(out=str(d), **cfg))
    (d / "demo.json").write_text(json.dumps({"task": "rules", "methods": ["opd"], "config": conf}))


def test_demo_refuses_another_seed_and_a_checkpoint_out(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _fake_demo(tmp_path / "d", fast=True, seed=0)
    before = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert main(["demo", "--fast", "--seed", "1", "--out", "d"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "seed 0 -> 1" in err and "another --out" in err and "\n" not in err
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == before
    assert main(["demo", "--seed", "0", "--seeds", "1", "--out", "d"]) == 2  # a full demo over a fast one
    assert "fast True -> False" in capsys.readouterr().err
    assert main(["demo", "--fast", "--seeds", "2", "--out", "d"]) == 2  # a multi-seed study over a single-seed demo
    assert "holds a single-seed demo" in capsys.readouterr().err
    shutil.copytree(tiny_rules_organism, tmp_path / "ckpt")
    for out in ("ckpt", "ckpt/sub"):
        assert main(["demo", "--fast", "--out", out]) == 2
        assert "checkpoint" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("task: rules\n")
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    assert main(["demo", "--fast", "--out", "run/demo"]) == 2
    assert "inside the training run" in capsys.readouterr().err
    assert not (tmp_path / "run" / "demo").exists() and not (tmp_path / "ckpt" / "sub").exists()
