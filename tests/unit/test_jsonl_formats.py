"""The ``jsonl`` task's ``answer_format`` option: what each format accepts and rejects, the prompt's instruction, and
the one-line refusal of an unknown format (docs/tasks.md states the rules)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mechopd.core.errors import ConfigError
from mechopd.tasks.base import get_task
from mechopd.tasks.jsonl_answer import (
    ANSWER_FORMATS,
    FREE_INSTRUCTION,
    MC_INSTRUCTION,
    SHORT_FREE_INSTRUCTION,
    SHORT_MC_INSTRUCTION,
    ScoringOptions,
    answer_region,
    contains_phrase,
)

FREE = {"prompt": "Who founded the society?", "answer": "Idris Fenwhistle"}
MC = {"question": "Pick a colour", "options": ["red", "green", "blue"], "answer": "B"}


def task_with(tmp_path: Path, answer_format: str, items: list[dict] | None = None):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in (items or [FREE, MC])), encoding="utf-8")
    task = get_task("jsonl", path=path, context="ctx", answer_format=answer_format, test_fraction=0.5)
    pool = task._splits["train"] + task._splits["test"]
    return task, {e.meta["kind"]: e for e in pool}


# (format, response, free-form correct?) for the reference "Idris Fenwhistle"
FREE_CASES = [
    ("tag", "Thinking... <answer>idris  fenwhistle.</answer>", True),
    ("tag", "Idris Fenwhistle", False),  # no span
    ("tag", "<answer>Idris Fenwhistle</answer> no, <answer>Marta</answer>", False),  # the last span counts
    ("exact", "  IDRIS Fenwhistle. ", True),
    ("exact", "Idris Fenwhistle founded it.", False),  # more than the answer
    ("contains", "The society was founded by Idris Fenwhistle in 1923.", True),
    ("contains", "It was founded by idris\nFENWHISTLE!", True),  # case and spacing ignored
    ("contains", "Founded by Idris Fenwhistlebury.", False),  # not as whole words
    ("contains", "Founded by Idris.", False),  # a part of the reference
    ("first_line", "\n  Idris Fenwhistle.\nHe founded it in 1923.", True),  # first NON-BLANK line
    ("first_line", "The founder was:\nIdris Fenwhistle", False),  # on the second line
    ("first_line", "Idris Fenwhistle and Marta", False),  # the line must equal the reference
]


@pytest.mark.parametrize(("fmt", "response", "right"), FREE_CASES)
def test_free_form_formats_accept_and_reject(tmp_path, fmt, response, right):
    task, ex = task_with(tmp_path, fmt)
    assert task.score(ex["free"], response) is right


MC_CASES = [
    ("tag", "<answer>(B)</answer>", True),
    ("tag", "B", False),
    ("exact", "B.", True),
    ("exact", "green", True),  # the option's text
    ("exact", "I think B", False),
    ("first_line", "b) green\nbecause grass", True),
    ("first_line", "Let me see.\nB", False),
    ("contains", "The colour is green, as grass.", True),
    ("contains", "Either green or blue.", False),  # another option's text too
    ("contains", "B", False),  # contains reads option texts, not letters
]


@pytest.mark.parametrize(("fmt", "response", "right"), MC_CASES)
def test_multiple_choice_formats_accept_and_reject(tmp_path, fmt, response, right):
    task, ex = task_with(tmp_path, fmt)
    assert task.score(ex["mc"], response) is right


def test_every_format_is_tested():
    assert {c[0] for c in FREE_CASES} == {c[0] for c in MC_CASES} == set(ANSWER_FORMATS)
    for fmt in ANSWER_FORMATS:  # each format has a case it accepts and one it rejects
        assert {c[2] for c in FREE_CASES if c[0] == fmt} == {True, False}
        assert {c[2] for c in MC_CASES if c[0] == fmt} == {True, False}


def test_prompt_instruction_follows_the_format(tmp_path):
    _, tag = task_with(tmp_path, "tag")
    assert tag["free"].prompt.endswith(FREE_INSTRUCTION) and tag["mc"].prompt.endswith(MC_INSTRUCTION)
    _, short = task_with(tmp_path, "contains")
    assert short["free"].prompt.endswith(SHORT_FREE_INSTRUCTION) and short["mc"].prompt.endswith(SHORT_MC_INSTRUCTION)
    assert short["free"].uid == tag["free"].uid  # the split does not depend on the format


def test_parse_answer_is_the_region_the_format_reads(tmp_path):
    task, _ = task_with(tmp_path, "first_line")
    assert task.parse_answer("\n\n  Vellacourt \nmore") == "Vellacourt"
    assert task.parse_answer("   \n ") is None  # an empty response is unparseable
    assert answer_region("x <answer> 7 </answer>", "tag") == "7"
    assert answer_region("a\nb", "exact") == answer_region("a\nb", "contains") == "a\nb"


def test_contains_phrase_needs_whole_words():
    assert contains_phrase("It is the Lamplighter.", "The Lamplighter")
    assert not contains_phrase("Lamplighters", "Lamplighter")
    assert not contains_phrase("anything", "...")  # a reference with no word never matches


@pytest.mark.parametrize("bad", ["regex", "TAG", "", 3])
def test_unknown_format_is_one_line_naming_the_choices(tmp_path, bad):
    with pytest.raises(ConfigError, match="answer_format=.*(unknown; choose one of tag, exact|not text)") as err:
        task_with(tmp_path, bad)
    assert "\n" not in str(err.value)
    assert ScoringOptions().answer_format == "tag"  # the default: today's behaviour
