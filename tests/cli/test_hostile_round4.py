"""Hostile inputs, round 4 (#41): layer arguments out of the model's depth, LoRA ranks and targets the model cannot
hold. Each refusal: exit 2, one ``error:`` line naming the problem and its fix, no traceback, the disk unchanged
(`tests.cli.hostile.check`). The store and adapter files: tests/integration/test_store_proofs.py,
tests/unit/test_lora_adapters.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli.hostile import Hostile, check_in_workspace, train


def _attribution(o: Path, w: Path, layers: str) -> list[str]:
    return [
        "probe", "attribution", "--task", "rules", "--n", "2", "--max-new-tokens", "4",
        "--models", f"base={o}", f"opd={o}", "--layers", layers, "--out", str(w / "attr"),
    ]  # fmt: skip


def _checkpoints_linked_out(o: Path, w: Path) -> list[str]:
    """An unfinished run (config.yaml, no checkpoint) whose ``checkpoints`` is a link to a user's directory."""
    (w / "mine").mkdir()
    (w / "mine" / "keep.txt").write_text("a user's file\n")
    (w / "run").mkdir()
    (w / "run" / "config.yaml").write_text("task: rules\n")
    (w / "run" / "checkpoints").symlink_to(w / "mine")
    return train(o, w)


def _loop(w: Path) -> Path:
    (w / "loop").symlink_to(w / "loop")
    return w / "loop"


def _study_into_loop(o: Path, w: Path) -> list[str]:
    study = w / "s.yaml"
    study.write_text(f"task: rules\nstudent: {o}\nruns:\n  opd: {{method: opd}}\n")
    return ["run", str(study), "--out", str(_loop(w))]


def _linked_out(w: Path, run: Path, name: str) -> Path:
    """``run/name`` made a link to the user's directory ``w/mine`` (holding keep.txt)."""
    (w / "mine").mkdir(exist_ok=True)
    (w / "mine" / "keep.txt").write_text("a user's file\n")
    (run / name).symlink_to(w / "mine")
    return run


def _figures_linked_out(o: Path, w: Path) -> list[str]:
    from tests.unit.plotting_run import make_run

    run = make_run(w / "demo")
    shutil.rmtree(run / "figures", ignore_errors=True)
    return ["figures", str(_linked_out(w, run, "figures"))]


def _training_run(o: Path, w: Path) -> Path:
    """A finished training run of the organism: config.yaml, checkpoints/, final/ (a copy of the organism)."""
    run = w / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(f"task: rules\nstudent: {o}\n")
    shutil.copytree(o, run / "final")
    return run


def _probes_linked_out(o: Path, w: Path) -> list[str]:
    run = _linked_out(w, _training_run(o, w), "probes")
    return ["probe", "similarity", "--run", str(run), "--n", "2", "--max-new-tokens", "4"]


def _eval_linked_out(o: Path, w: Path) -> list[str]:
    run = _linked_out(w, _training_run(o, w), "eval")
    return ["eval", "--task", "rules", "--model", str(run / "final"), "--n", "2"]


CASES = [
    Hostile("links", "figures-dir-linked-out", _figures_linked_out, "outside the run"),
    Hostile("links", "probes-dir-linked-out", _probes_linked_out, "outside the run"),
    Hostile("links", "eval-dir-linked-out", _eval_linked_out, "outside the run"),
    # links: nothing written or deleted through a link out of the run; a link loop is a path error, not a traceback
    Hostile("links", "train-checkpoints-linked-out", _checkpoints_linked_out, "outside the run"),
    Hostile("links", "train-out-link-loop", lambda o, w: train(o, w)[:4] + [str(_loop(w))], "symbolic link loop"),
    Hostile("links", "study-out-link-loop", _study_into_loop, "symbolic link loop"),
    Hostile(
        "links",
        "demo-out-link-loop",
        lambda o, w: ["demo", "--out", str(_loop(w)), "--fast", "--steps", "1"],
        "symbolic link loop",
    ),
    # the tiny organism has 2 decoder layers: 7 was read as 7 % 2 = layer 1 and written as such
    Hostile("probe", "attribution-layer-past-depth", lambda o, w: _attribution(o, w, "7"), "--layers 7", False),
    Hostile("probe", "attribution-layer-below-depth", lambda o, w: _attribution(o, w, "-3"), "--layers -3", False),
    Hostile("probe", "attribution-layer-site-name", lambda o, w: _attribution(o, w, "final_norm"), "final_norm", False),
    # LoRA: a rank past every projection's dimension (an allocation error before), lm_head on tied embeddings
    Hostile(
        "lora",
        "lora-rank-2-to-the-40",
        lambda o, w: train(o, w, "--set", f"lora_rank={2**40}"),
        "lora_rank=1099511627776 is outside",
        False,
    ),
    Hostile(
        "lora",
        "lora-lm-head-tied",
        lambda o, w: train(o, w, "--set", "lora_rank=2", "--set", "lora_targets=[q_proj,lm_head]"),
        "ties to embed_tokens",
        False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_refused_in_one_line(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    check_in_workspace(case, tiny_rules_organism, tmp_path, monkeypatch, capsys)
