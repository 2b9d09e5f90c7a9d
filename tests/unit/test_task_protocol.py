"""The task protocol: every registered task (and the README's custom task) declares and honours every member."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mechopd.core.errors import ConfigError, TaskError
from mechopd.tasks.base import (
    _REGISTRY,
    BaseTask,
    Episode,
    Example,
    Task,
    check_disjoint,
    check_split,
    get_task,
    missing_members,
    register_task,
    task_names,
)
from mechopd.tasks.jsonl import SAMPLE_CONTEXT, SAMPLE_QA

README = Path(__file__).resolve().parents[2] / "docs" / "tasks.md"  # the custom-task example
# Options a registered task needs to be built at all (a new task that needs options adds its entry here).
OPTIONS = {"jsonl": {"path": str(SAMPLE_QA), "context_file": str(SAMPLE_CONTEXT)}}
ORGANISM_TASKS = ("rules", "frozenlake", "sokoban")


@pytest.fixture
def registry_guard():
    """Tests that register tasks restore the registry afterwards."""
    saved = dict(_REGISTRY)
    yield
    _REGISTRY.clear()
    _REGISTRY.update(saved)


def _check_protocol(task) -> None:
    """Call every member of `Task` on `task` and check what it returns."""
    assert isinstance(task, Task), missing_members(task)
    assert missing_members(task) == []
    assert task.placement in ("system", "user") and isinstance(task.is_game, bool)
    assert isinstance(task.max_new_tokens, int) and task.max_new_tokens >= 1 and task.temperature > 0
    train, test = task.examples("train", 2, 0), task.examples("test", 1, 0)
    assert len(train) == 2 and len(test) == 1 and all(isinstance(e, Example) for e in train + test)
    assert [task.split_of(e) for e in train] == ["train", "train"] and task.split_of(test[0]) == "test"
    check_split(task, train, "train")
    check_split(task, test, "test")
    check_disjoint(train, test)
    with pytest.raises(TaskError, match="another split"):
        check_split(task, train, "test")
    assert task.parse_answer("") is None and task.parse_answer("  \n ") is None
    vocab = task.vocab()
    assert isinstance(vocab, list) and all(isinstance(w, str) for w in vocab)
    assert isinstance(task.score(test[0], ""), bool) and task.score(test[0], "") is False
    if task.is_game:
        episode = task.new_episode(test[0])
        assert isinstance(episode, Episode) and not episode.done and isinstance(episode.prompt(), str)
    else:
        with pytest.raises(TaskError, match="single-turn"):
            task.new_episode(test[0])


@pytest.mark.parametrize("name", task_names())
def test_every_registered_task_satisfies_the_protocol(name):
    task = get_task(name, **OPTIONS.get(name, {}))
    _check_protocol(task)
    if name in ORGANISM_TASKS:
        corpus = task.pretrain_corpus(8, 0)
        assert len(corpus) == 8
        assert all(
            (c is None or isinstance(c, str)) and isinstance(p, str) and isinstance(r, str) for c, p, r in corpus
        )
        assert {c is None for c, _, _ in corpus} == {True, False}  # both views are pretrained
    else:
        with pytest.raises(TaskError, match="no organism pretraining corpus"):
            task.pretrain_corpus(8, 0)


@pytest.mark.parametrize(
    "name, response, parsed",
    [
        ("rules", " 2 3 4 ", "2 3 4"),
        ("jsonl", "I think <answer> B </answer>", "B"),
        ("jsonl", "B", None),
        ("frozenlake", "up H far , down F toward [down]", "down"),
        ("sokoban", "no move here", None),
    ],
)
def test_parse_answer_is_what_score_reads(name, response, parsed):
    assert get_task(name, **OPTIONS.get(name, {})).parse_answer(response) == parsed


def test_readme_custom_task_satisfies_the_protocol(registry_guard):
    """The README's "a custom task is a few lines" example runs as printed and is a full `Task`."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    code = next(b for b in blocks if "@register_task(" in b)
    name = re.search(r'@register_task\("(\w+)"\)', code).group(1)
    exec(compile(code, str(README), "exec"), {})
    task = get_task(name)
    _check_protocol(task)
    assert task.score(task.examples("test", 1, 0)[0], "wrong") is False
    with pytest.raises(ConfigError, match=name):
        get_task(name, bogus=1)  # a class factory without options refuses one, naming the task


def test_get_task_names_the_missing_members(registry_guard):
    class Partial:  # no split_of, parse_answer, pretrain_corpus
        name, placement, is_game, max_new_tokens, temperature = "partial", "system", False, 8, 1.0

        def examples(self, split, n, seed):
            return []

        def score(self, example, text):
            return False

        def new_episode(self, example):
            raise TaskError("single-turn")

        def vocab(self):
            return []

    register_task("partial")(lambda: Partial())
    assert not isinstance(Partial(), Task)
    with pytest.raises(TaskError, match="parse_answer, split_of, pretrain_corpus"):
        get_task("partial")


def test_base_task_split_is_a_stable_hash():
    class T(BaseTask):
        name = "t"

        def examples(self, split, n, seed):
            return []

        def score(self, example, text):
            return False

    uids = [f"item-{i}" for i in range(2000)]
    split = [T().split_of(Example(u, "", "")) for u in uids]
    assert split == [T().split_of(Example(u, "p", "c")) for u in uids]  # the uid alone decides
    assert 0.17 < split.count("test") / len(split) < 0.23  # test_fraction = 0.2
    half = type("Half", (T,), {"test_fraction": 0.5})()
    assert all(half.split_of(Example(u, "", "")) == "test" for u, s in zip(uids, split) if s == "test")
