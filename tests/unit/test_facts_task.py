"""The ``facts`` task (issue 52): a handbook per seed from the generated pool, no held-out item in two seeds, the
validation part never in the study's items, strict scoring beside contains."""

from __future__ import annotations

import itertools
import re

import pytest

from mechopd.core.errors import ConfigError, DataError, TaskError
from mechopd.tasks import facts as F
from mechopd.tasks import get_task
from mechopd.tasks.base import Example, check_disjoint, check_split
from mechopd.tasks.facts import rescore, score_facts
from mechopd.tasks.facts_pool import POOL_PATH, build_pool, pool_text


@pytest.fixture(scope="module")
def task():
    return get_task("facts")


def test_committed_pool_is_the_generators_output():
    assert POOL_PATH.read_text(encoding="utf-8") == pool_text(build_pool())
    assert F.POOL_PATH == POOL_PATH  # the task reads the file the generator writes


def test_pool_size_questions_and_unique_answer_words():
    facts = build_pool()
    assert len(facts) >= 100
    assert all(len(f["questions"]) == 12 and len(set(f["questions"])) == 12 for f in facts)
    words = [w.lower() for f in facts for key in ("answer", "other_answer", "entity") for w in f[key].split()]
    assert len(words) == len(set(words))  # no answer word in two facts: strict can tell every fact apart
    assert {f["part"] for f in facts} == {"evaluation", "validation"}
    assert all(f["answer"] in f["statement"] and f["other_answer"] in f["other_statement"] for f in facts)


def test_no_held_out_item_in_two_seeds(task):
    seen: dict[str, int] = {}
    for seed in range(task.max_seed + 1):
        for e in task.examples("test", task.max_items("test"), seed):
            assert e.uid not in seen, f"{e.uid} held out on seeds {seen[e.uid]} and {seed}"
            seen[e.uid] = seed
    assert len(seen) == (task.max_seed + 1) * task.k * task.held_out


def test_first_round_handbooks_are_disjoint(task):
    books = [{f["id"] for f in task.handbook_facts(s)} for s in range(task.blocks)]
    assert all(not (a & b) for a, b in itertools.combinations(books, 2))


@pytest.mark.parametrize("part,k", [("evaluation", 8), ("evaluation", 10), ("validation", 4), ("validation", 8)])
def test_no_handbook_holds_two_facts_of_one_relation(part, k):
    """Blocks take one fact per relation (`block_order`) while k relations have facts left: pilot 3's interference."""
    t = get_task("facts", part=part, k=k)
    for s in range(t.blocks):
        relations = [f["relation"] for f in t.handbook_facts(s)]
        assert len(relations) == len(set(relations)) == k, (s, relations)
    assert sorted(f["id"] for f in t._order) == sorted(f["id"] for f in t.facts)  # a permutation: no fact lost
    wide = get_task("facts", part=part, k=16 if part == "evaluation" else 32)  # more than 10 relations' worth
    assert all(len(wide.handbook_facts(s)) == wide.k for s in range(wide.blocks))


def test_validation_facts_never_in_the_evaluation_part(task):
    validation = {f["id"] for f in build_pool() if f["part"] == "validation"}
    for seed in range(task.max_seed + 1):
        for split in ("train", "test"):
            items = task.examples(split, task.max_items(split), seed)
            assert not validation & {e.meta["fact"] for e in items}
            assert not any(v in items[0].context for v in (f["entity"] for f in build_pool() if f["id"] in validation))
    val = get_task("facts", part="validation", k=8)
    assert {e.meta["fact"] for e in val.examples("test", 32, 0)} <= validation


def test_determinism_per_seed_and_seeds_differ(task):
    again = get_task("facts")
    for seed in (0, 3, 9):
        a, b = task.examples("test", 20, seed), again.examples("test", 20, seed)
        assert [(e.uid, e.prompt, e.context, e.answer) for e in a] == [
            (e.uid, e.prompt, e.context, e.answer) for e in b
        ]
    assert task.handbook(0) != task.handbook(1)
    assert task.examples("test", 10, 0)[:5] == task.examples("test", 5, 0)  # a larger draw starts with a smaller one


def test_splits_disjoint_and_checked(task):
    for seed in (0, 8):
        train, test = task.examples("train", 128, seed), task.examples("test", 64, seed)
        check_split(task, train, "train")
        check_split(task, test, "test")
        check_disjoint(train, test)
        assert {e.meta["fact"] for e in train} == {e.meta["fact"] for e in test}  # trained facts, other paraphrases
    stranger = Example("not-a-fact", "q", "c", "a", {})
    assert task.split_of(stranger) == "none"  # an item of no part is in neither split
    val = get_task("facts", part="validation").examples("test", 4, 0)[0]
    assert task.split_of(val) == "none"  # a validation item is no item of the evaluation part


def test_handbook_holds_every_answer_and_the_other_one_changes_them(task):
    item = task.examples("test", 1, 2)[0]
    assert item.answer in item.context and len(re.findall(r"\.", item.context)) >= task.k
    (other,) = task.other_contexts(item)
    assert other.answer in other.context and item.answer not in other.context


def test_strict_against_contains(task):
    a, b = "Zabis Fitreifias", "Treikei"
    answers = frozenset({a, b, "522"})
    assert score_facts(f"It was {a}.", a, answers, "strict")
    assert not score_facts(f"{a} or {b}", a, answers, "strict")
    assert score_facts(f"{a} or {b}", a, answers, "contains")
    assert not score_facts("Zabis", a, answers, "contains")  # the whole answer, as whole words
    item = task.examples("test", 2, 0)
    records = [
        {"response_x": f"{item[0].answer} or {item[1].answer}", "response_xc": item[0].answer, "target": item[0].answer}
    ]
    assert rescore(task, records, "strict") == {"acc_x": 0.0, "acc_xc": 1.0}
    assert rescore(task, records, "contains") == {"acc_x": 1.0, "acc_xc": 1.0}


def test_bad_options_and_seeds_are_refused(task):
    with pytest.raises(TaskError, match=f"seeds 0..{task.max_seed}"):
        task.examples("test", 4, task.max_seed + 1)
    with pytest.raises(TaskError, match="holds 64"):
        task.examples("test", 65, 0)
    with pytest.raises(ConfigError, match="part='test'"):
        get_task("facts", part="test")
    with pytest.raises(ConfigError, match="answer_format"):
        get_task("facts", answer_format="tag")
    with pytest.raises(ConfigError, match="k <= 32"):
        get_task("facts", part="validation", k=40)
    with pytest.raises(ConfigError, match="unknown option 'kk'"):
        get_task("facts", kk=3)
    with pytest.raises(DataError, match="not found"):
        get_task("facts", pool="/nonexistent/pool.jsonl")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda f: 5, "line 2: is int, not an object"),
        (lambda f: {**f, "questions": None}, "line 2: field 'questions' is None, not a list of 12"),
        (lambda f: {**f, "questions": [1] * 12}, "field 'questions' is .*not a list of 12 question strings"),
        (lambda f: {**f, "questions": f["questions"][:3]}, "field 'questions' holds 3, not 12"),
        (lambda f: {**f, "part": "Evaluation"}, "line 2: field 'part' is 'Evaluation', not one of evaluation"),
        (lambda f: {**f, "answer": None}, "line 2: field 'answer' is None, not a non-empty string"),
        (lambda f: {k: v for k, v in f.items() if k != "other_answer"}, "field 'other_answer' is missing"),
    ],
)
def test_a_malformed_pool_line_is_one_data_error_naming_the_line(tmp_path, change, needle):
    import json

    lines = POOL_PATH.read_text(encoding="utf-8").splitlines()
    lines[1] = json.dumps(change(json.loads(lines[1])))
    pool = tmp_path / "pool.jsonl"
    pool.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"{pool}: {needle}" if needle.startswith("line") else needle):
        get_task("facts", pool=str(pool))


def test_bench_rescore_prints_strict_beside_contains(task, tmp_path, capsys):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "facts_rescore.py"
    spec = importlib.util.spec_from_file_location("facts_rescore", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    a, b = task.examples("test", 2, 0)
    records = [
        {"uid": a.uid, "response_x": f"{a.answer} or {b.answer}", "response_xc": a.answer, "target": a.answer},
        {"uid": b.uid, "response_x": "no idea", "response_xc": b.answer, "target": b.answer},
    ]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "facts.json").write_text(json.dumps({"records": records}))
    (tmp_path / "other.json").write_text(json.dumps({"records": [{"uid": "3"}]}))  # not a facts evaluation: skipped
    assert module.main([str(tmp_path)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert "n=2  strict Acc_x 0.000 Acc_xc 1.000  contains Acc_x 0.500 Acc_xc 1.000" in line
    assert module.main([str(tmp_path / "other.json")]) == 2
