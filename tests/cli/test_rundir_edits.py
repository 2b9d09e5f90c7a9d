"""Edited run directories are one error line on ``--resume`` / ``pretrain`` (nothing changed on disk), and every
request for more items than a task's item space holds is refused with the number that exists."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from mechopd.cli import main

TRAIN = ("--batch-size", "2", "--set", "save_every=2", "--no-progress")


@pytest.fixture(scope="module")
def finished_run(tiny_rules_organism, tmp_path_factory) -> Path:
    """A 2-step run with its checkpoint at step 2 (copied per case)."""
    root = tmp_path_factory.mktemp("edits") / "run"
    assert main(["train", "--student", str(tiny_rules_organism), "--out", str(root), "--steps", "2", *TRAIN]) == 0
    return root


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


CKPT = "checkpoints/step-2"
EDITS = {
    "garbage-config": (lambda r: (r / "config.yaml").write_text("{{{ not: yaml"), "config.yaml is unreadable"),
    "list-config": (lambda r: (r / "config.yaml").write_text("- a\n- b\n"), "holds a list"),
    "garbage-state": (lambda r: (r / CKPT / "trainer_state.json").write_text("garbage"), "trainer_state.json is"),
    "list-state": (lambda r: (r / CKPT / "trainer_state.json").write_text("[]"), "lacks the resume state"),
    "truncated-optimizer": (
        lambda r: _truncate(r / CKPT / "optimizer.safetensors"),
        "optimizer.safetensors is truncated",
    ),
    "deleted-rng": (lambda r: (r / CKPT / "rng.safetensors").unlink(), "rng.safetensors is missing"),
    "metrics-42": (
        lambda r: (r / "metrics.jsonl").write_text("42\n" + (r / "metrics.jsonl").read_text()),
        "line 1 is not a metrics record",
    ),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_resume_of_an_edited_run_is_one_line(finished_run, tiny_rules_organism, tmp_path, capsys, edit):
    run = Path(shutil.copytree(finished_run, tmp_path / "run"))
    change, needle = EDITS[edit]
    change(run)
    before = _digest(run)
    capsys.readouterr()
    code = main(["train", "--student", str(tiny_rules_organism), "--out", str(run), "--steps", "4", *TRAIN, "--resume"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and err and err[-1].startswith("error:") and needle in err[-1], err
    assert not any("Traceback" in ln for ln in err)
    assert _digest(run) == before  # nothing on disk changed


def test_garbage_organism_record_is_one_line(tmp_path, capsys):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "organism.json").write_text("{ garbage")
    assert main(["pretrain", "--task", "rules", "--out", str(tmp_path / "o"), "--steps", "2", "--n", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "organism.json is not an organism record" in err and "\n" not in err
    assert (tmp_path / "o" / "organism.json").read_text() == "{ garbage"


# -------------------------------------------------------------------------------------------------- item space
def test_rules_item_space_is_counted():
    """The count is real: drawing exactly all held-out items of a small space works, one more is refused."""
    from mechopd.core.errors import TaskError
    from mechopd.tasks.base import get_task

    task = get_task("rules", min_len=1, max_len=3)
    size = task.max_items("test", 10**6)
    assert size == sum(1 for ex in task.examples("train", 1, 0)[:0]) + len(task.examples("test", size, 0))
    assert len({ex.uid for ex in task.examples("test", size, 0)}) == size
    with pytest.raises(TaskError, match=f"has only {size} test items"):
        task.examples("test", size + 1, 0)
    assert task.max_items("test", 5) is None  # a small request is not counted (cheap)


def test_eval_probe_train_refuse_more_items_than_exist(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    org = str(tiny_rules_organism)
    from mechopd.tasks.base import get_task

    test_n, train_n = (get_task("rules").max_items(s, 10**7) for s in ("test", "train"))
    cases = [
        (["eval", "--task", "rules", "--model", org, "--n", "200000"], f"has only {test_n} test items"),
        (
            ["probe", "similarity", "--models", f"base={org}", "--n", "200000", "--split", "test"],
            f"has only {test_n} test items",
        ),
        (
            ["train", "--student", org, "--out", "r", "--steps", "1", "--set", "pool_size=2000000", "--no-progress"],
            f"has at most {train_n} train items",
        ),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error:") and needle in err[-1], (argv, err)
    assert not (tmp_path / "r").exists() and not (tmp_path / "runs").exists()


def test_jsonl_reports_the_files_count(tmp_path):
    from mechopd.tasks.base import get_task

    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": "a", "context": "c"}) + "\n" for i in range(30)))
    task = get_task("jsonl", path=str(data))
    assert task.max_items("test") + task.max_items("train") == 30


def test_games_refuse_more_boards_than_their_space(tiny_rules_organism, tmp_path, capsys):
    """FrozenLake 4x4 with 3 holes has at most C(16,3)·13·12 boards; Sokoban 5x5 with one box 2^9·9·9·9."""
    from mechopd.tasks.base import get_task

    assert get_task("frozenlake").board_space() == 560 * 13 * 12
    assert get_task("sokoban", size=5).board_space() == 2**9 * 9**3
    for argv, needle in (
        (["--task", "frozenlake"], "at most 87360 boards"),
        (["--task", "sokoban", "--option", "size=5"], "at most 373248 boards"),
    ):
        assert (
            main(
                [
                    "eval",
                    *argv,
                    "--model",
                    str(tiny_rules_organism),
                    "--n",
                    "1000000",
                    "--out",
                    str(tmp_path / "e.json"),
                ]
            )
            == 2
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error:") and needle in err[-1], err
