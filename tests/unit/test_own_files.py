"""No mechopd command writes through a symbolic link that leads out of its run, nor deletes a file it did not write
(#41): a study's ``train/`` linked outside, a user's notes in ``train/opd``, a run's ``checkpoints`` linked outside,
a link loop as ``--out``."""

from __future__ import annotations

import pytest

from mechopd.core.errors import ConfigError
from mechopd.pipeline import stages


def _no_training():
    raise AssertionError("nothing may train here")


@pytest.fixture
def fake_train(monkeypatch):
    """`train` replaced by a recorder: (config, out, resume) of each call."""
    import mechopd.train.trainer as trainer

    calls = []
    monkeypatch.setattr(trainer, "train", lambda tc, out, resume: calls.append((tc, out, resume)) or out / "final")
    return calls


def test_a_study_train_dir_linked_outside_is_refused_and_its_files_kept(tmp_path, fake_train):
    outside = tmp_path / "elsewhere"
    (outside / "opd").mkdir(parents=True)
    (outside / "opd" / "config.yaml").write_text("a user's file\n")
    (outside / "keep.txt").write_text("mine\n")
    run = tmp_path / "o"
    run.mkdir()
    (run / "train").symlink_to(outside)
    with pytest.raises(ConfigError, match="outside the run"):
        stages.train_resumable("opd", run / "train" / "opd", _no_training, "x")
    assert (outside / "opd" / "config.yaml").read_text() == "a user's file\n" and (outside / "keep.txt").exists()
    assert not fake_train


def test_a_users_file_in_a_fresh_run_dir_is_never_deleted(tmp_path, fake_train):
    out = tmp_path / "o" / "train" / "opd"
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("my notes\n")
    (out / "config.yaml").write_text("task: rules\n")
    with pytest.raises(ConfigError, match="notes.txt, which no mechopd run wrote"):
        stages.train_resumable("opd", out, _no_training, "x")
    assert (out / "notes.txt").read_text() == "my notes\n" and (out / "config.yaml").is_file()
    assert not fake_train


def test_a_killed_runs_own_files_are_cleared_and_it_retrains(tmp_path, fake_train):
    out = tmp_path / "o" / "train" / "opd"
    (out / "tensorboard").mkdir(parents=True)
    (out / "config.yaml").write_text("task: rules\n")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / ".mechopd.lock").write_text("")
    stages.train_resumable("opd", out, lambda: "cfg", "x")
    assert fake_train == [("cfg", out, False)] and sorted(p.name for p in out.iterdir()) == [".mechopd.lock"]


def test_a_link_inside_the_run_is_fine(tmp_path, fake_train):
    run = tmp_path / "o"
    (run / "real-train" / "opd").mkdir(parents=True)
    (run / "train").symlink_to(run / "real-train")
    stages.train_resumable("opd", run / "train" / "opd", lambda: "cfg", "x")
    assert fake_train == [("cfg", run / "train" / "opd", False)]


def test_a_link_loop_on_the_way_is_one_config_error(tmp_path, fake_train):
    run = tmp_path / "o"
    run.mkdir()
    (run / "train").symlink_to(run / "train")
    with pytest.raises(ConfigError, match="symbolic link loop"):
        stages.train_resumable("opd", run / "train" / "opd", _no_training, "x")


def test_a_save_over_a_link_replaces_the_link_and_keeps_its_target(tmp_path):
    from mechopd.models import atomic_save

    class Model:
        def save_pretrained(self, path, safe_serialization=True):
            (path / "model.safetensors").write_bytes(b"new")

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("a user's file\n")
    (tmp_path / "final").symlink_to(mine)
    atomic_save(Model(), None, tmp_path / "final")
    assert (mine / "keep.txt").read_text() == "a user's file\n" and not (mine / "model.safetensors").exists()
    assert not (tmp_path / "final").is_symlink() and (tmp_path / "final" / "model.safetensors").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "mine"]  # no .final.old-* link left behind
