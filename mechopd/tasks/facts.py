"""Fictional facts, a handbook per seed: the ``facts`` task (issue 52: the seed x handbook is the unit of replication).

The pool (`mechopd.tasks.facts_pool`, ``mechopd/data/facts_pool.jsonl``: 160 facts, 12 paraphrased questions each,
coined answers) is cut into two parts: ``validation`` (a fixed fifth; pilots and tuning) and ``evaluation`` (the study).
A task reads one part (option ``part``). Seed s draws its own handbook and items from it:

* the part's facts in a fixed seeded block order (`block_order`: each block takes one fact from each of the k
  relations with the most facts left, so no handbook holds two facts of one relation while k <= 10) are cut into
  ``B = n_facts // k`` blocks of ``k`` facts; seed s takes block
  ``s mod B`` (the handbook: the k facts' statements, in an order drawn from s) in round ``r = s // B``;
* each fact's 12 questions are in a fixed seeded order; round r holds out questions ``r·h .. r·h + h − 1``
  (h = ``held_out``) and trains on the other 12 − h. So seeds 0..B−1 have disjoint handbooks, later rounds reuse
  facts with other held-out questions, and **no held-out item (fact, question) belongs to two seeds**; a seed that
  would need a round beyond 12 // h is refused, naming the largest seed the part holds.

Items: uid ``fNNN.qJJ`` (fact, question), ``meta`` holds the seed, so `split_of` recomputes the split from the item. The
context is the seed's handbook; the other context (the context-following study) is the same handbook with every fact
changed (``other_statement``), whose target is the fact's ``other_answer``.

Scoring (option ``answer_format``): ``strict`` (default) is right iff the reply names the target as whole words
(`contains_phrase`) and names no other answer of the pool (any fact's answer or other answer but the target: a reply
listing candidates is wrong); ``contains`` only asks for the target (the sensitivity row: `rescore`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechopd.core.errors import ConfigError, DataError, TaskError
from mechopd.core.options import GE1, PLACEMENTS, TEMPERATURE_RANGE, Range, option
from mechopd.tasks.base import BaseTask, Example, OtherContext, TaskOptions, register_task
from mechopd.tasks.jsonl_answer import SHORT_FREE_INSTRUCTION, contains_phrase

POOL_PATH = Path(__file__).resolve().parent.parent / "data" / "facts_pool.jsonl"  # the shipped pool (facts_pool.py)
FACTS_FORMATS = ("strict", "contains")
PARTS = ("evaluation", "validation")
QUESTIONS = 12  # paraphrases per fact in the pool
HEADER = "Handbook of the Northern Archipelago Registry."
OTHER_LABEL = "changed-handbook"


def block_order(facts: list[dict], k: int, rng: random.Random) -> list[dict]:
    """The part's facts in block order: each block of ``k`` takes one fact from each of the ``k`` relations with the
    most facts left (ties in a seeded order; facts within a relation seeded), so no handbook holds two facts of one
    relation while ``k`` relations have facts left. Why: two facts of one relation in one handbook interfere under
    OPD (SmolLM2-135M answered both river facts, or both archivists, with one name: docs/real_models.md, pilot 3)."""
    groups: dict[str, list[dict]] = {}
    for f in facts:
        groups.setdefault(f["relation"], []).append(f)
    names = sorted(groups)
    rng.shuffle(names)
    for name in names:
        rng.shuffle(groups[name])
    order: list[dict] = []
    while len(order) < len(facts):
        live = sorted((n for n in names if groups[n]), key=lambda n: -len(groups[n]))  # stable: seeded ties
        order += [groups[n].pop() for n in live[:k]]
        names = names[1:] + names[:1]  # rotate the tie order: the same relations do not always lead
    return order


def score_facts(text: str, target: str, answers: frozenset[str], answer_format: str) -> bool:
    """``contains``: `target` occurs in `text` as whole words. ``strict``: that, and no other answer of `answers` (the
    pool's) occurs."""
    if not contains_phrase(text, target):
        return False
    if answer_format == "contains":
        return True
    return not any(contains_phrase(text, other) for other in answers if other != target)


@dataclass
class FactsTask(BaseTask):
    """The ``facts`` task (module docstring); build it with `make_facts_task` / ``get_task("facts", ...)``."""

    facts: list[dict]
    k: int
    held_out: int
    answer_format: str
    part: str
    max_new_tokens: int  # these three: given by make_facts_task (BaseTask's class attributes are not the task's)
    temperature: float
    placement: str
    name: str = "facts"
    is_game: bool = False
    answers: frozenset[str] = field(default=frozenset(), repr=False)  # every answer of the WHOLE pool (strict)
    _order: list[dict] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._order = block_order(self.facts, self.k, random.Random(f"facts-blocks:{self.part}"))

    # ---- the seed's draw
    @property
    def blocks(self) -> int:
        return len(self._order) // self.k

    @property
    def max_seed(self) -> int:
        """The largest seed whose held-out questions are still unused by every smaller seed."""
        return self.blocks * (QUESTIONS // self.held_out) - 1

    def handbook_facts(self, seed: int) -> list[dict]:
        """The seed's k facts, in the handbook's order."""
        if seed < 0 or seed > self.max_seed:
            raise TaskError(
                f"facts task: seed {seed} has no handbook of its own: the {self.part} part's {len(self._order)} facts "
                f"give {self.blocks} handbooks of k={self.k} x {QUESTIONS // self.held_out} rounds of held_out="
                f"{self.held_out} questions, seeds 0..{self.max_seed}; use those seeds or a smaller k / held_out"
            )
        block = seed % self.blocks
        chosen = self._order[block * self.k : (block + 1) * self.k]
        random.Random(f"facts-handbook:{self.part}:{seed}").shuffle(chosen)
        return chosen

    def held_out_questions(self, fact: dict, seed: int) -> list[int]:
        """The indices of `fact`'s questions held out on `seed` (round ``seed // blocks``)."""
        order = list(range(QUESTIONS))
        random.Random(f"facts-questions:{fact['id']}").shuffle(order)
        r = seed // self.blocks
        return sorted(order[r * self.held_out : (r + 1) * self.held_out])

    def handbook(self, seed: int, other: bool = False) -> str:
        """The seed's handbook (``other``: with every fact changed)."""
        key = "other_statement" if other else "statement"
        return HEADER + "\n" + " ".join(f[key] for f in self.handbook_facts(seed))

    def _split_items(self, split: str, seed: int) -> list[Example]:
        context, other = self.handbook(seed), self.handbook(seed, other=True)
        out = []
        for fact in self.handbook_facts(seed):
            test = self.held_out_questions(fact, seed)
            for j, question in enumerate(fact["questions"]):
                if (j in test) != (split == "test"):
                    continue
                meta = {"seed": seed, "fact": fact["id"], "question": j, "other": [other, fact["other_answer"]]}
                meta["cluster"] = fact["id"]  # the paraphrases of one fact are one unit of the intervals
                prompt = f"{question}\n{SHORT_FREE_INSTRUCTION}"
                out.append(Example(f"{fact['id']}.q{j:02d}", prompt, context, fact["answer"], meta))
        return sorted(out, key=lambda e: e.uid)

    # ---- the Task protocol
    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """`n` items of the seed's `split`, in a seeded order (the first k of a larger draw equal a draw of k)."""
        if split not in ("train", "test"):
            raise TaskError(f"facts task: unknown split {split!r}; use 'train' or 'test'")
        pool = self._split_items(split, seed)
        if n < 1 or n > len(pool):
            raise TaskError(
                f"facts task: asked for {n} {split} items but seed {seed} holds {len(pool)} (k={self.k} facts x "
                f"{self.held_out if split == 'test' else QUESTIONS - self.held_out} questions); pass {len(pool)} or less"
            )
        random.Random(f"{split}:{seed}").shuffle(pool)
        return pool[:n]

    def max_items(self, split: str, need: int = 0) -> int | None:
        return self.k * (self.held_out if split == "test" else QUESTIONS - self.held_out)

    def split_of(self, example: Example) -> str:
        fact, _, j = example.uid.partition(".q")
        by_id = {f["id"]: f for f in self.facts}
        if fact not in by_id or not j.isdigit() or "seed" not in example.meta:
            return "none"  # not an item of this part: in neither split (check_split names it)
        return "test" if int(j) in self.held_out_questions(by_id[fact], int(example.meta["seed"])) else "train"

    def score(self, example: Example, response_text: str) -> bool:
        return score_facts(response_text, str(example.answer), self.answers, self.answer_format)

    def other_contexts(self, example: Example) -> list[OtherContext]:
        context, answer = example.meta["other"]
        return [OtherContext(OTHER_LABEL, context, answer)]


def rescore(task: FactsTask, records: list[dict], answer_format: str) -> dict[str, float]:
    """Acc_x and Acc_xc of evaluation `records` (``response_x``, ``response_xc``, ``target``) rescored under
    `answer_format` (the ``contains`` sensitivity row beside ``strict``)."""
    if not records:
        raise DataError("facts rescore: no records to rescore")
    out = {}
    for view in ("x", "xc"):
        hits = [score_facts(r[f"response_{view}"], str(r["target"]), task.answers, answer_format) for r in records]
        out[f"acc_{view}"] = sum(hits) / len(hits)
    return out


def read_pool(path: Path) -> list[dict]:
    """The pool's facts; a malformed line is one `DataError` naming the line and the field."""
    if not path.is_file():
        raise DataError(f"{path}: facts pool not found; fix pool= or leave it out (the shipped pool)")
    facts = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            fact = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {i}: not JSON ({e.msg}); regenerate the pool") from None
        _check_fact(fact, f"{path}: line {i}")
        facts.append(fact)
    return facts


TEXT_FIELDS = ("statement", "answer", "other_statement", "other_answer")


def _check_fact(fact: Any, where: str) -> None:
    """One pool line: an object with every field, its texts non-empty strings, ``questions`` `QUESTIONS` strings and
    ``part`` one of `PARTS`; else one `DataError` naming ``where`` and the field."""
    if not isinstance(fact, dict):
        raise DataError(f"{where}: is {type(fact).__name__}, not an object with {', '.join(TEXT_FIELDS)}, ...")
    for key in ("id", "part", *TEXT_FIELDS, "questions"):
        if key not in fact:
            raise DataError(f"{where}: field {key!r} is missing; regenerate the pool")
    if fact["part"] not in PARTS:
        raise DataError(f"{where}: field 'part' is {fact['part']!r}, not one of {', '.join(PARTS)} (lower case)")
    bad = [key for key in TEXT_FIELDS if not isinstance(fact[key], str) or not fact[key].strip()]
    if bad:
        raise DataError(f"{where}: field {bad[0]!r} is {fact[bad[0]]!r}, not a non-empty string")
    questions = fact["questions"]
    if not isinstance(questions, list) or not all(isinstance(q, str) and q.strip() for q in questions):
        raise DataError(f"{where}: field 'questions' is {questions!r:.60}, not a list of {QUESTIONS} question strings")
    if len(questions) != QUESTIONS:
        raise DataError(f"{where}: field 'questions' holds {len(questions)}, not {QUESTIONS}")


@dataclass(frozen=True)
class FactsOptions(TaskOptions):
    """``--task facts`` options (``--option KEY=VALUE``, a study's ``task_options:``; module docstring)."""

    pool: str | None = option(None, "the facts pool (a JSONL file); null: the shipped pool", metavar="PATH")
    part: str = option("evaluation", "the pool's part the study reads (validation: pilots and tuning)", choices=PARTS)
    k: int = option(16, "facts per handbook", range=GE1)
    held_out: int = option(4, "held-out questions per fact", range=Range(1, QUESTIONS - 1))
    answer_format: str = option(
        "strict", "strict: the target and no other answer of the pool; contains: the target", choices=FACTS_FORMATS
    )
    max_new_tokens: int = option(24, "response cap", range=GE1)
    temperature: float = option(1.0, "rollout temperature", range=TEMPERATURE_RANGE)
    placement: str = option("user", "where the handbook goes: the user turn or the system message", choices=PLACEMENTS)


@register_task("facts", options=FactsOptions)
def make_facts_task(o: FactsOptions) -> FactsTask:
    """Build the ``facts`` task (module docstring) from its options (`FactsOptions`)."""
    facts = read_pool(Path(o.pool) if o.pool is not None else POOL_PATH)
    answers = frozenset(a for f in facts for a in (f["answer"], f["other_answer"]))
    chosen = [f for f in facts if f["part"] == o.part]
    if o.k > len(chosen):
        raise ConfigError(
            f"facts task: k={o.k} but the pool's {o.part} part holds {len(chosen)} facts; use k <= {len(chosen)}"
        )
    return FactsTask(
        chosen,
        k=o.k,
        held_out=o.held_out,
        answer_format=o.answer_format,
        part=o.part,
        max_new_tokens=o.max_new_tokens,
        temperature=o.temperature,
        placement=o.placement,
        answers=answers,
    )
