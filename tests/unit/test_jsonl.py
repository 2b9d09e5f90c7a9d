"""The ``jsonl`` task: parsing, validation messages, MedMCQA conversion, answer parsing, split, sampling, vocab."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from mechopd.core.errors import ConfigError, DataError, TaskError
from mechopd.tasks.base import get_task
from mechopd.tasks.jsonl import SAMPLE_CONTEXT, SAMPLE_QA
from mechopd.tasks.jsonl_answer import choice_letter, normalize_text, parse_answer

MC = {"question": "Pick one", "options": ["red", "green", "blue"], "answer": "B"}
FREE = {"prompt": "Capital of Freedonia?", "answer": "Fredville"}
MED = {"question": "Which drug?", "opa": "Alpha", "opb": "Beta", "opc": "Gamma", "opd": "Delta", "cop": 2}


def write_lines(tmp_path: Path, lines: list, name: str = "data.jsonl") -> Path:
    """Write dicts as JSON lines; strings are written verbatim (for blank / broken lines)."""
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def load(path: Path, **options):
    options.setdefault("context", "shared context")
    return get_task("jsonl", path=path, **options)


def all_examples(task, split: str):
    size = task.split_sizes()[split]
    return task.examples(split, size, seed=0) if size else []


def many_items(count: int, start: int = 0) -> list[dict]:
    return [{"prompt": f"question number {i}?", "answer": f"a{i}"} for i in range(start, start + count)]


# ------------------------------------------------------------------------------------------------ shipped sample
def test_sample_file_loads_with_all_layouts_and_disjoint_splits():
    task = get_task("jsonl", path=SAMPLE_QA, context_file=SAMPLE_CONTEXT)
    train, test = all_examples(task, "train"), all_examples(task, "test")
    assert len(train) + len(test) == 40 and len(test) > 0 and len(train) > 0
    assert not {e.uid for e in train} & {e.uid for e in test}
    layouts = {e.meta["layout"] for e in train + test}
    assert layouts == {"prompt", "options", "medmcqa"}
    shared = SAMPLE_CONTEXT.read_text(encoding="utf-8").strip()
    per_item = [e for e in train + test if e.context != shared]
    assert len(per_item) == 2 and all(e.context.startswith("Ward 3 note") for e in per_item)
    assert task.placement == "system" and task.is_game is False
    assert (task.max_new_tokens, task.temperature) == (512, 1.0)


def test_every_sample_answer_is_scored_correct_when_restated():
    task = get_task("jsonl", path=SAMPLE_QA, context_file=SAMPLE_CONTEXT)
    for e in all_examples(task, "train") + all_examples(task, "test"):
        assert e.prompt.rstrip().endswith("</answer>.")
        assert task.score(e, f"Reasoning...\n<answer>{e.answer}</answer>")
        assert not task.score(e, "Reasoning without a tagged answer: " + str(e.answer))


# ------------------------------------------------------------------------------------------------- validation
def assert_one_line(err: pytest.ExceptionInfo, *needles: str) -> None:
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_missing_file(tmp_path):
    with pytest.raises(DataError) as err:
        load(tmp_path / "nope.jsonl")
    assert_one_line(err, "nope.jsonl", "not found", "path=")


def test_empty_and_blank_only_files(tmp_path):
    for content in ["", "\n  \n\n"]:
        path = tmp_path / "empty.jsonl"
        path.write_text(content)
        with pytest.raises(DataError) as err:
            load(path)
        assert_one_line(err, "empty.jsonl", "no items")


def test_bad_json_names_physical_line_after_blank_lines(tmp_path):
    path = write_lines(tmp_path, [FREE, "", MC, "{not json"])
    with pytest.raises(DataError) as err:
        load(path)
    assert_one_line(err, "data.jsonl", "line 4", "not valid JSON")


def test_non_object_line(tmp_path):
    with pytest.raises(DataError) as err:
        load(write_lines(tmp_path, [FREE, "[1, 2]"]))
    assert_one_line(err, "line 2", "JSON object", "list")


@pytest.mark.parametrize(
    ("item", "field", "hint"),
    [
        ({"prompt": "x?"}, "'answer'", "prompt"),
        ({"question": "x?", "answer": "A"}, "'options'", "opa"),
        ({"answer": "A"}, "'prompt'", "question"),
        ({k: v for k, v in MED.items() if k != "opd"}, "'opd'", "MedMCQA"),
        ({k: v for k, v in MED.items() if k != "cop"}, "'cop'", "MedMCQA"),
        ({"question": "x?", "options": ["a", "b"]}, "'answer'", "letter"),
        ({"question": "x?", "options": ["a", "b"], "answer": "C"}, "'answer'", "A, B"),
        ({"question": "x?", "options": ["only one"], "answer": "A"}, "'options'", "at least 2"),
        ({"question": "x?", "options": {"AA": "a", "B": "b"}, "answer": "B"}, "'options'", "single letters"),
        ({"question": "x?", "options": "a or b", "answer": "A"}, "'options'", "list"),
        ({"prompt": "   ", "answer": "A"}, "'prompt'", "empty"),
        ({"prompt": "x?", "answer": ["A"]}, "'answer'", "string"),
        ({**FREE, "context": ""}, "'context'", "non-empty"),
        ({**MED, "cop": 7}, "'cop'", "0-3"),
        ({**MED, "opb": None}, "'opb'", "string"),
    ],
)
def test_field_errors_name_line_and_field(tmp_path, item, field, hint):
    with pytest.raises(DataError) as err:
        load(write_lines(tmp_path, [FREE, MC, item]))
    assert_one_line(err, "data.jsonl", "line 3", field, hint)


def test_cop_4_with_zero_base_suggests_cop_base_1(tmp_path):
    with pytest.raises(DataError) as err:
        load(write_lines(tmp_path, [{**MED, "cop": 4}]))
    assert_one_line(err, "line 1", "'cop'", "cop_base=1")


def test_missing_context_file(tmp_path):
    path = write_lines(tmp_path, [FREE])
    with pytest.raises(DataError) as err:
        get_task("jsonl", path=path, context_file=tmp_path / "ctx.txt")
    assert_one_line(err, "ctx.txt", "context file not found", "context_file=")


def test_item_without_any_context_names_line_and_fix(tmp_path):
    path = write_lines(tmp_path, [{**FREE, "context": "own context"}, MC])
    with pytest.raises(DataError) as err:
        get_task("jsonl", path=path)
    assert_one_line(err, "data.jsonl", "line 2", "context_file=", '"context"')
    task = get_task("jsonl", path=write_lines(tmp_path, [{**FREE, "context": "own context"}], "ok.jsonl"))
    assert {e.context for e in all_examples(task, "train") + all_examples(task, "test")} == {"own context"}


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"bogus": 1}, "'bogus'"),
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"cop_base": 2}, "cop_base"),
        ({"context_file": "x.txt"}, "not both"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_bad_options_raise_config_error(tmp_path, options, needle):
    with pytest.raises(ConfigError) as err:
        load(write_lines(tmp_path, [FREE]), **options)
    assert_one_line(err, needle)


def test_path_is_required():
    with pytest.raises(ConfigError, match="'path' is required"):
        get_task("jsonl", context="c")


# --------------------------------------------------------------------------------------------- conversion, context
@pytest.mark.parametrize(
    ("cop", "cop_base", "letter"),
    [(0, 0, "A"), (2, 0, "C"), (3, 0, "D"), (1, 1, "A"), (4, 1, "D"), ("c", 0, "C"), ("B", 1, "B")],
)
def test_medmcqa_conversion(tmp_path, cop, cop_base, letter):
    task = load(write_lines(tmp_path, [{**MED, "cop": cop}]), cop_base=cop_base)
    (e,) = all_examples(task, "train") + all_examples(task, "test")
    assert e.answer == letter
    assert e.meta["options"] == {"A": "Alpha", "B": "Beta", "C": "Gamma", "D": "Delta"}
    assert "Which drug?\n\nA. Alpha\nB. Beta\nC. Gamma\nD. Delta\n\n" in e.prompt
    assert "<answer>" in e.prompt.splitlines()[-1]
    assert task.score(e, f"<answer>{letter}</answer>")
    assert not task.score(e, f"<answer>{'A' if letter != 'A' else 'B'}</answer>")


def test_options_dict_is_sorted_and_text_answer_maps_to_letter(tmp_path):
    items = [
        {"question": "Q1", "options": {"c": "third", "a": "first", "b": "second"}, "answer": "second"},
        {"question": "Q2", "options": ["x", "y"], "answer": "b"},
    ]
    task = load(write_lines(tmp_path, items))
    by_stem = {e.prompt.split("\n")[0]: e for e in all_examples(task, "train") + all_examples(task, "test")}
    assert "A. first\nB. second\nC. third" in by_stem["Q1"].prompt
    assert by_stem["Q1"].answer == "B" and by_stem["Q2"].answer == "B"


def test_per_item_context_overrides_shared(tmp_path):
    task = load(write_lines(tmp_path, [{**FREE, "context": "mine"}, MC]), context="the shared one")
    contexts = {e.meta["kind"]: e.context for e in all_examples(task, "train") + all_examples(task, "test")}
    assert contexts == {"free": "mine", "mc": "the shared one"}


# ---------------------------------------------------------------------------------------------- answer parsing
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>A</answer> then <answer>C</answer>", "C"),
        ("<ANSWER>  b \n</Answer>", "b"),
        ("< answer >D</ answer >", "D"),
        ("<answer>A <answer>B</answer>", "B"),  # a nested opener restarts the span
        ("<answer>A</answer> <answer>B", "A"),  # an unclosed last tag is not a span
        ("<answer>line one\nline two</answer>", "line one\nline two"),
        ("no tags at all: B", None),
        ("<answer></answer>", None),
        ("<answer>A</answer><answer>   </answer>", None),  # the last span wins even when it is empty
        ("</answer>B<answer>", None),
        ("<answer>x</answer></answer></answer>", "x"),
        ("", None),
    ],
)
def test_parse_answer(text, expected):
    assert parse_answer(text) == expected


@pytest.mark.parametrize(
    ("span", "letter"),
    [
        ("B", "B"),
        ("b", "B"),
        ("B.", "B"),
        ("(B)", "B"),
        ("( b )", "B"),
        ("[B]", "B"),
        ("B)", "B"),
        ("B. green", "B"),
        ("B: green", "B"),
        ("(B) green", "B"),
        ("green", "B"),
        ("GREEN.", "B"),
        ("E", "E"),
        ("Blue", "C"),
        ("I think B", None),
        ("B green", None),
        ("BC", None),
        ("purple", None),
    ],
)
def test_choice_letter_forms(span, letter):
    assert choice_letter(span, {"A": "red", "B": "green", "C": "blue"}) == letter


def test_scoring_multiple_choice_and_free_form(tmp_path):
    task = load(write_lines(tmp_path, [MC, FREE, {"prompt": "Time?", "answer": "22:00"}]))
    examples = {e.answer: e for e in all_examples(task, "train") + all_examples(task, "test")}
    mc, free, time = examples["B"], examples["Fredville"], examples["22:00"]
    assert task.score(mc, "<answer>C</answer> no wait <answer>(b)</answer>")
    assert not task.score(mc, "<answer>B</answer> no wait <answer>C</answer>")
    assert not task.score(mc, "The answer is B.")
    assert task.score(free, "<answer>  fredville. </answer>")
    assert task.score(free, "<answer>FREDVILLE</answer>")
    assert not task.score(free, "<answer>Fred ville</answer>")
    assert task.score(time, "<answer>22:00</answer>") and not task.score(time, "<answer>2200</answer>")


def test_normalize_text():
    assert normalize_text("  The   Renwick TEST. ") == "the renwick test"
    assert normalize_text("3.5") == "3.5" and normalize_text("(x)") == "x"


# ------------------------------------------------------------------------------------------------ split, sampling
def test_split_is_deterministic_disjoint_and_near_fraction(tmp_path):
    path = write_lines(tmp_path, many_items(400))
    a, b = load(path), load(path)
    assert a.split_sizes() == b.split_sizes()
    test_a, train_a = {e.uid for e in all_examples(a, "test")}, {e.uid for e in all_examples(a, "train")}
    assert test_a == {e.uid for e in all_examples(b, "test")}
    assert not test_a & train_a and len(test_a | train_a) == 400
    assert 0.13 < len(test_a) / 400 < 0.27
    assert all(re.fullmatch(r"[0-9a-f]{40}", uid) for uid in test_a)


def test_appending_and_reordering_lines_keeps_assignments(tmp_path):
    base = many_items(120)
    before = load(write_lines(tmp_path, base, "a.jsonl"))
    grown = base + many_items(80, start=120)
    random.Random(3).shuffle(grown)
    after = load(write_lines(tmp_path, grown, "b.jsonl"))
    for split in ("train", "test"):
        old = {e.uid for e in all_examples(before, split)}
        assert old <= {e.uid for e in all_examples(after, split)}
    uid_a = {e.answer: e.uid for e in all_examples(before, "train")}
    uid_b = {e.answer: e.uid for e in all_examples(after, "train")}
    assert all(uid_b[k] == v for k, v in uid_a.items())


def test_sampling_does_not_depend_on_line_order(tmp_path):
    items = many_items(60)
    shuffled = items[:]
    random.Random(5).shuffle(shuffled)
    a, b = load(write_lines(tmp_path, items, "a.jsonl")), load(write_lines(tmp_path, shuffled, "b.jsonl"))
    for split in ("train", "test"):
        k = a.split_sizes()[split]
        assert [e.uid for e in a.examples(split, k, seed=4)] == [e.uid for e in b.examples(split, k, seed=4)]


def test_uid_depends_on_content_not_on_extra_fields_or_key_order(tmp_path):
    same = [{"answer": "Fredville", "prompt": "Capital of Freedonia?", "source": "x"}]
    other = [{**FREE, "answer": "Fredton"}]

    def one_uid(items: list[dict], name: str) -> str:
        task = load(write_lines(tmp_path, items, name))
        return (all_examples(task, "train") + all_examples(task, "test"))[0].uid

    assert one_uid([FREE], "a.jsonl") == one_uid(same, "b.jsonl") != one_uid(other, "c.jsonl")


def test_exact_duplicates_are_kept_once_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="line 3 repeats line 1"):
        task = load(write_lines(tmp_path, [FREE, MC, FREE]))
    assert sum(task.split_sizes().values()) == 2


def test_examples_sampling_is_seeded_and_prefix_consistent(tmp_path):
    task = load(write_lines(tmp_path, many_items(200)))
    n_train = task.split_sizes()["train"]
    first = [e.uid for e in task.examples("train", 20, seed=1)]
    assert first == [e.uid for e in task.examples("train", 20, seed=1)]
    assert first != [e.uid for e in task.examples("train", 20, seed=2)]
    assert first == [e.uid for e in task.examples("train", 40, seed=1)][:20]
    assert len(set(first)) == 20
    full = [e.uid for e in task.examples("train", n_train, seed=1)]
    assert sorted(full) == sorted(e.uid for e in all_examples(task, "train")) and full != sorted(full)
    with pytest.raises(TaskError) as err:
        task.examples("train", n_train + 1, seed=0)
    assert_one_line(err, f"{n_train} are available", "--n")
    with pytest.raises(TaskError, match="unknown split"):
        task.examples("validation", 1, seed=0)


def test_new_episode_is_refused(tmp_path):
    task = load(write_lines(tmp_path, many_items(10)))
    with pytest.raises(TaskError, match="single-turn"):
        task.new_episode(task.examples("train", 1, seed=0)[0])


# ------------------------------------------------------------------------------------------------------- vocab
def test_vocab_covers_prompts_contexts_answers_and_tags():
    task = get_task("jsonl", path=SAMPLE_QA, context_file=SAMPLE_CONTEXT)
    vocab = set(task.vocab())
    assert task.vocab() == sorted(vocab)
    assert {"<answer>", "</answer>", "<", "/", ">", "answer"} <= vocab
    assert {"Velmoril", "velmoril", "Ponderal", "ponderal", "hiccups", "Osler", "Kade", "-", "22", ":", "00"} <= vocab
    for e in all_examples(task, "train") + all_examples(task, "test"):
        reply = f"{e.answer} <answer>{e.answer}</answer>"
        for text in (e.prompt, e.context, reply):
            pieces = re.findall(r"\w+|[^\w\s]", text)
            assert set(pieces) <= vocab, set(pieces) - vocab


@pytest.mark.parametrize("ident", [{"id": 1}, {}])
def test_copies_differing_only_in_the_other_context_are_refused_not_dropped(tmp_path, ident):
    """Same question, context and answer, another other_context/other_answer: one would be silently dropped."""
    base = {**ident, "prompt": "Who leads the guild?", "answer": "Marlo", "context": "The guild is led by Marlo."}
    rows = [
        {**base, "other_context": "The guild is led by Ysolde.", "other_answer": "Ysolde"},
        {**base, "other_context": "The guild is led by Tavi.", "other_answer": "Tavi"},
    ]
    with pytest.raises(DataError, match=r"line 2.*line 1.*other_context/other_answer"):
        load(write_lines(tmp_path, rows), test_fraction=0.5)
