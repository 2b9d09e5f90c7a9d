"""The shipped qwen-coder-docs study (issue 55): a 1.5B teacher with a fictional library's docs, a 0.5B LoRA student
without them. Its file and data are checked here; the models are not loaded (tests/fetch/test_qwen.py fetches them)."""

from __future__ import annotations

import json
from pathlib import Path

from mechopd.pipeline import named
from mechopd.pipeline.demo import fast_values
from mechopd.pipeline.spec import StudySpec

NAME = "qwen-coder-docs"
DATA = Path(named.STUDIES_DIR).parent


def test_the_study_is_a_cross_model_lora_study_of_held_out_paraphrases():
    spec = named.load_named(NAME)
    assert spec.student == "model:qwen2.5-coder-0.5b-instruct" and spec.teacher == "model:qwen2.5-coder-1.5b-instruct"
    assert spec.task_options["placement"] == spec.render["placement"] == "user"
    assert spec.render["no_context_system"].startswith("You are Qwen, created by Alibaba Cloud.")
    assert {r["method"] for r in spec.runs.values()} == {"opd", "nca"} and spec.train["lora_rank"] == 8
    assert len(spec.seeds) >= 3 and spec.eval["other_contexts"] is True


def test_the_docs_hold_every_answer_and_the_other_docs_change_every_one():
    docs, other = (DATA / "qwen_coder_docs.md").read_text(), (DATA / "qwen_coder_docs_other.md").read_text()
    items = [json.loads(line) for line in (DATA / "qwen_coder_docs.jsonl").read_text().splitlines()]
    facts: dict[str, list[str]] = {}
    for it in items:
        facts.setdefault(it["answer"], []).append(it["prompt"])
        assert it["answer"] in docs and it["other_answer"] in other and it["other_answer"] not in docs
        assert it["answer"] not in other and it["answer"].lower() not in it["prompt"].lower()
    assert len(facts) == 11 and all(len(set(q)) == 8 for q in facts.values())


def test_fast_is_one_seed_and_still_a_valid_study():
    spec = named.load_named(NAME)
    doc = named.shrink(spec, fast=True)
    values = {**fast_values(), **named.study_fast_values(NAME)}
    assert doc["seeds"] == spec.seeds[:1] and doc["train"]["steps"] == values["steps"] < spec.train["steps"]
    StudySpec.load(doc)
