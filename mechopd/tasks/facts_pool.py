"""The fictional-facts pool of the ``facts`` task: generated here, deterministically, into package data.

``python -m mechopd.tasks.facts_pool`` rewrites ``mechopd/data/facts_pool.jsonl`` from `build_pool` (a test checks that
the committed file equals it). One JSON line per fact::

    {"id": "f007", "part": "evaluation", "relation": "founder", "entity": "Orvask",
     "statement": "The Orvask Society was founded by Tavrin Molekesh.", "answer": "Tavrin Molekesh",
     "other_statement": "The Orvask Society was founded by Keslo Vandrupix.", "other_answer": "Keslo Vandrupix",
     "questions": ["Who founded the Orvask Society?", ... 12 paraphrases]}

Answers are coined names and words (syllables drawn from a fixed seed; no English word is built on purpose) or
three-digit numbers; every answer word, and every entity, occurs once in the whole pool, so a reply that names one fact's
answer names no other's (the ``strict`` scoring, `mechopd.tasks.facts`). ``other_answer`` is the changed fact of the
other handbook (the context-following study). ``part``: a fixed, seeded fifth of the facts is ``validation`` (pilots
and tuning only: the study never evaluates it); the rest is ``evaluation``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

POOL_PATH = Path(__file__).resolve().parent.parent / "data" / "facts_pool.jsonl"
POOL_SEED = "mechopd-facts-pool-v1"
PER_RELATION = 16  # facts per relation: 10 relations x 16 = 160 facts
VALIDATION_SHARE = 0.2

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "tr", "vr")
_VOWELS = ("a", "e", "i", "o", "u", "ei", "ou")
# coined words that turned out to be real ones (one SmolLM2-135M token with a leading space; tests/unit/test_facts_task.py)
_REAL_WORDS = frozenset({"notre"})
_CODAS = ("", "", "n", "r", "l", "s", "th", "x", "sk", "nd")

# relation -> (statement template, answer kind, 12 question templates); {e} the entity, {a} the answer
RELATIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "founder": (
        "The {e} Society was founded by {a}.",
        "person",
        (
            "Who founded the {e} Society?",
            "Who is the founder of the {e} Society?",
            "Name the person who founded the {e} Society.",
            "Which person founded the {e} Society?",
            "The {e} Society was founded by whom?",
            "Who established the {e} Society?",
            "Who was the founder of the {e} Society?",
            "By whom was the {e} Society founded?",
            "Tell me who founded the {e} Society.",
            "Who started the {e} Society?",
            "What is the name of the founder of the {e} Society?",
            "Which individual set up the {e} Society?",
        ),
    ),
    "capital": (
        "The capital of the island of {e} is {a}.",
        "place",
        (
            "What is the capital of the island of {e}?",
            "Which town is the capital of {e} island?",
            "Name the capital of the island of {e}.",
            "The island of {e} has which capital?",
            "What town serves as the capital of {e}?",
            "Where is the capital of the island of {e}?",
            "Tell me the capital of the island of {e}.",
            "What is the island of {e}'s capital called?",
            "Which settlement is the capital of the island of {e}?",
            "What is the name of the capital of {e} island?",
            "The capital of the island of {e} is which town?",
            "Which place is the seat of government of the island of {e}?",
        ),
    ),
    "ship": (
        "The {e} Guild owns a ship named the {a}.",
        "word",
        (
            "What is the name of the ship owned by the {e} Guild?",
            "What ship does the {e} Guild own?",
            "Name the ship of the {e} Guild.",
            "Which ship belongs to the {e} Guild?",
            "What is the {e} Guild's ship called?",
            "The {e} Guild owns a ship named what?",
            "Tell me the name of the {e} Guild's ship.",
            "What is the ship of the {e} Guild named?",
            "Which vessel does the {e} Guild own?",
            "What name does the {e} Guild's ship bear?",
            "The ship owned by the {e} Guild is called what?",
            "What vessel is owned by the {e} Guild?",
        ),
    ),
    "archivist": (
        "The chief archivist of the {e} Library is {a}.",
        "person",
        (
            "Who is the chief archivist of the {e} Library?",
            "Name the chief archivist of the {e} Library.",
            "Who serves as chief archivist at the {e} Library?",
            "Which person is the {e} Library's chief archivist?",
            "The chief archivist of the {e} Library is who?",
            "Tell me who the chief archivist of the {e} Library is.",
            "Who holds the post of chief archivist at the {e} Library?",
            "Who runs the archives of the {e} Library?",
            "What is the name of the {e} Library's chief archivist?",
            "Who is in charge of the archives at the {e} Library?",
            "The {e} Library's chief archivist is which person?",
            "Who works as the chief archivist of the {e} Library?",
        ),
    ),
    "river": (
        "The river that flows through the town of {e} is the {a}.",
        "place",
        (
            "Which river flows through the town of {e}?",
            "What is the name of the river in the town of {e}?",
            "Name the river that flows through {e}.",
            "What river runs through the town of {e}?",
            "The town of {e} lies on which river?",
            "Tell me which river flows through the town of {e}.",
            "What is the river of the town of {e} called?",
            "Which river passes through {e}?",
            "Through the town of {e} flows which river?",
            "What river crosses the town of {e}?",
            "The river flowing through {e} is called what?",
            "Which river is found in the town of {e}?",
        ),
    ),
    "steps": (
        "The {e} Lighthouse has {a} steps.",
        "number",
        (
            "How many steps does the {e} Lighthouse have?",
            "What is the number of steps in the {e} Lighthouse?",
            "How many steps are there in the {e} Lighthouse?",
            "The {e} Lighthouse has how many steps?",
            "Tell me how many steps the {e} Lighthouse has.",
            "Count the steps of the {e} Lighthouse: how many are there?",
            "How many stairs lead up the {e} Lighthouse?",
            "What is the step count of the {e} Lighthouse?",
            "How many steps must one climb in the {e} Lighthouse?",
            "Give the number of steps of the {e} Lighthouse.",
            "How many steps make up the {e} Lighthouse's staircase?",
            "In the {e} Lighthouse, how many steps are there?",
        ),
    ),
    "currency": (
        "The currency of the {e} Republic is the {a}.",
        "word",
        (
            "What is the currency of the {e} Republic?",
            "Which currency does the {e} Republic use?",
            "Name the currency of the {e} Republic.",
            "What money is used in the {e} Republic?",
            "The {e} Republic pays in which currency?",
            "Tell me the currency of the {e} Republic.",
            "What is the {e} Republic's currency called?",
            "In which currency are prices in the {e} Republic given?",
            "What is the name of the {e} Republic's money?",
            "Which coin is the currency of the {e} Republic?",
            "The currency of the {e} Republic is called what?",
            "What do people in the {e} Republic pay with?",
        ),
    ),
    "inventor": (
        "The {e} engine was invented by {a}.",
        "person",
        (
            "Who invented the {e} engine?",
            "Who is the inventor of the {e} engine?",
            "Name the inventor of the {e} engine.",
            "Which person invented the {e} engine?",
            "The {e} engine was invented by whom?",
            "Tell me who invented the {e} engine.",
            "Who was the inventor of the {e} engine?",
            "By whom was the {e} engine invented?",
            "Who built the first {e} engine?",
            "What is the name of the person who invented the {e} engine?",
            "Who designed the {e} engine?",
            "Which individual invented the {e} engine?",
        ),
    ),
    "festival": (
        "The {e} Festival is held in the village of {a}.",
        "place",
        (
            "Where is the {e} Festival held?",
            "In which village is the {e} Festival held?",
            "Name the village that hosts the {e} Festival.",
            "Which village hosts the {e} Festival?",
            "The {e} Festival takes place in which village?",
            "Tell me where the {e} Festival is held.",
            "What village is the home of the {e} Festival?",
            "Where does the {e} Festival take place?",
            "In what village does the {e} Festival happen?",
            "Which village is the {e} Festival held in?",
            "The {e} Festival is held where?",
            "What is the name of the village where the {e} Festival is held?",
        ),
    ),
    "telescope": (
        "The telescope of the {e} Observatory is named {a}.",
        "word",
        (
            "What is the name of the telescope of the {e} Observatory?",
            "What is the {e} Observatory's telescope called?",
            "Name the telescope of the {e} Observatory.",
            "Which telescope does the {e} Observatory have?",
            "The telescope of the {e} Observatory is named what?",
            "Tell me the name of the {e} Observatory's telescope.",
            "What name does the telescope of the {e} Observatory bear?",
            "What is the {e} Observatory's telescope named?",
            "How is the telescope of the {e} Observatory named?",
            "Which name was given to the {e} Observatory's telescope?",
            "The {e} Observatory's telescope is called what?",
            "What do they call the telescope at the {e} Observatory?",
        ),
    ),
}


class _Coiner:
    """Coined words, each new across the whole pool (`taken` holds every word handed out, lower-cased)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.taken: set[str] = set()

    def word(self, syllables: int) -> str:
        while True:
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables)]
            text = ("".join(parts) + self.rng.choice(_CODAS)).capitalize()
            if text.lower() not in self.taken and text.lower() not in _REAL_WORDS:
                self.taken.add(text.lower())
                return text

    def answer(self, kind: str, numbers: set[int]) -> str:
        if kind == "person":
            return f"{self.word(2)} {self.word(2)}"
        if kind in ("place", "word"):
            return self.word(2)
        while True:  # a three-digit number, no round one, each once in the pool
            value = self.rng.randrange(101, 1000)
            if value % 10 and value not in numbers:
                numbers.add(value)
                return str(value)


def build_pool() -> list[dict]:
    """The pool's facts, in order (ids f000..), deterministic (`POOL_SEED`)."""
    rng = random.Random(POOL_SEED)
    coin = _Coiner(rng)
    numbers: set[int] = set()
    facts: list[dict] = []
    for relation, (statement, kind, questions) in RELATIONS.items():
        for _ in range(PER_RELATION):
            entity, answer, other = coin.word(3), coin.answer(kind, numbers), coin.answer(kind, numbers)
            facts.append(
                {
                    "id": f"f{len(facts):03d}",
                    "relation": relation,
                    "entity": entity,
                    "statement": statement.format(e=entity, a=answer),
                    "answer": answer,
                    "other_statement": statement.format(e=entity, a=other),
                    "other_answer": other,
                    "questions": [q.format(e=entity) for q in questions],
                }
            )
    validation = set(
        random.Random(f"{POOL_SEED}:validation").sample(range(len(facts)), int(len(facts) * VALIDATION_SHARE))
    )
    for i, fact in enumerate(facts):
        fact["part"] = "validation" if i in validation else "evaluation"
    return facts


def pool_text(facts: list[dict]) -> str:
    """The JSONL text of `facts` (one fact a line, keys in a fixed order)."""
    keys = ("id", "part", "relation", "entity", "statement", "answer", "other_statement", "other_answer", "questions")
    return "".join(json.dumps({k: f[k] for k in keys}, ensure_ascii=False) + "\n" for f in facts)


def main() -> None:
    POOL_PATH.write_text(pool_text(build_pool()), encoding="utf-8")
    print(f"wrote {POOL_PATH} ({len(build_pool())} facts)")


if __name__ == "__main__":
    main()
