"""System-prompt QA from a JSONL file (MedMCQA-style user data): the ``jsonl`` task.

Each non-blank line is one JSON object in one of three layouts (extra fields are ignored):

* free-form:       ``{"prompt": "...", "answer": "..."}``
* multiple choice: ``{"question": "...", "options": ["...", "..."] | {"A": "...", "B": "..."}, "answer": "B"}``
  (``answer`` is an option letter or exactly the text of one option)
* MedMCQA:         ``{"question": "...", "opa": "...", "opb": "...", "opc": "...", "opd": "...", "cop": 1}``
  ``cop`` is the index of the correct option, **0-based by default (0 = opa) as in the Hugging Face
  ``openlifescienceai/medmcqa`` dataset**; exports that count 1-4 need ``cop_base=1``. A letter ("a".."d") is accepted
  too. Converted to options A-D and the answer letter.

Any item may carry its own ``"context"`` (overrides the shared one from ``context=`` / ``context_file=``), and an
``"other_context"`` / ``"other_answer"`` pair for the context-following study (`mechopd.tasks.jsonl_other`).
The context is the system message (``placement = "system"``) or spliced before the question (``placement = "user"``).
Scoring follows the option ``answer_format`` (`ScoringOptions`; docs/tasks.md): ``tag`` (default) asks for the final
answer inside ``<answer>...</answer>`` and reads the LAST closed span (see `parse_answer`); ``exact``, ``first_line``
and ``contains`` ask for a short reply and read the whole response, its first non-blank line, or the reference as
whole words anywhere in it (`score_response`).

Split: ``uid`` = sha1 of the item's normalised content; an item is in "test" iff ``int(uid[:15], 16) / 16**15 <
test_fraction``. Train/test are disjoint, and appending lines never moves an existing item. Identical items (same uid)
are kept once, with a warning.

Shipped sample: `SAMPLE_QA` (40 synthetic items about a fictional clinic formulary, all three layouts) and
`SAMPLE_CONTEXT` (the formulary, as the shared context).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from mechopd.core.errors import ConfigError, DataError, TaskError
from mechopd.core.options import GE1, PLACEMENTS, TEMPERATURE_RANGE, UNIT, Range, option
from mechopd.tasks.base import BaseTask, Example, OtherContext, TaskOptions, register_task
from mechopd.tasks.jsonl_answer import ScoringOptions, answer_region, choice_letter, score_response
from mechopd.tasks.jsonl_checks import check_ids, check_references, check_shared_other
from mechopd.tasks.jsonl_items import _dedupe, _Item, _where, is_test_uid, read_context_file, read_items, render_prompt
from mechopd.tasks.jsonl_other import resolve_other, shared_other

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
SAMPLE_QA = DATA_DIR / "sample_qa.jsonl"
SAMPLE_CONTEXT = DATA_DIR / "sample_context.txt"

ANSWER_TAG_PIECES = ["<answer>", "</answer>", "<", "</", "/", ">", "answer"]

_WORD_RE = re.compile(r"\w+|[^\w\s]")


# -------------------------------------------------------------------------------------------------------- the task
@dataclass
class JsonlTask(BaseTask):
    """System-prompt QA over JSONL items (the `Task` protocol; single-turn, context as a system message; no organism
    pretraining corpus: `BaseTask.pretrain_corpus` refuses)."""

    path: Path
    items: list[_Item]
    shared_context: str | None
    shared_other_context: str | None  # the file-level other context (other_context= / other_context_file=)
    answer_format: str
    test_fraction: float  # these four: given by make_jsonl_task (BaseTask's class attributes are not the task's)
    max_new_tokens: int
    temperature: float
    placement: str
    name: str = "jsonl"
    is_game: bool = False
    _splits: dict[str, list[Example]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        ScoringOptions(self.answer_format)  # one line naming the choices for an unknown format
        examples = [self._example(item) for item in self.items]
        self._splits = {
            "test": [e for e in examples if is_test_uid(e.uid, self.test_fraction)],
            "train": [e for e in examples if not is_test_uid(e.uid, self.test_fraction)],
        }

    def _example(self, item: _Item) -> Example:
        context = item.context or self.shared_context
        if context is None:
            raise DataError(
                f"{_where(self.path, item.line)} item has no context and no shared context is given; "
                'pass context_file= (or context=) or add a per-item "context" field'
            )
        meta = {"line": item.line, "layout": item.layout, "kind": "free" if item.options is None else "mc"}
        if item.options is not None:
            meta["options"] = dict(item.options)
        other = resolve_other(
            *item.other, self.shared_other_context, item.options, _where(self.path, item.line), choice_letter
        )
        if other is not None:
            meta["other"] = other
        return Example(
            uid=item.uid, prompt=render_prompt(item, self.answer_format), context=context, answer=item.answer, meta=meta
        )

    def split_sizes(self) -> dict[str, int]:
        return {name: len(pool) for name, pool in self._splits.items()}

    def max_items(self, split: str, need: int = 0) -> int | None:
        """The file's item count in `split`."""
        return len(self._splits.get(split, []))

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """`n` examples of `split`, in a seeded order over the split sorted by uid (so the first k of a larger draw
        equal a draw of k). Too few items raise `TaskError` naming the available count."""
        if split not in self._splits:
            raise TaskError(f"jsonl task: unknown split {split!r}; use 'train' or 'test'")
        pool = sorted(self._splits[split], key=lambda e: e.uid)
        if not pool:
            total = sum(len(p) for p in self._splits.values())
            raise TaskError(
                f"jsonl task {self.path}: none of its {total} item(s) falls in the {split} split "
                f"(test_fraction={self.test_fraction}); add items (a content hash puts about "
                f"{self.test_fraction:.0%} of them in test) or change test_fraction"
            )
        if n < 1 or n > len(pool):
            raise TaskError(
                f"jsonl task {self.path}: asked for {n} {split} examples but {len(pool)} are available "
                f"(test_fraction={self.test_fraction}); pass --n {len(pool)} or less, or add items"
            )
        random.Random(f"{split}:{seed}").shuffle(pool)
        return pool[:n]

    def score(self, example: Example, response_text: str) -> bool:
        """Correct iff the response names the reference under `answer_format` (`score_response`): with ``tag``, the
        last ``<answer>`` span gives the option letter (case-insensitive, ``B.``/``(B)`` or the option's text accepted)
        for multiple choice, a `normalize_text`-equal string for free-form."""
        return score_response(response_text, str(example.answer), example.meta.get("options"), self.answer_format)

    def parse_answer(self, response_text: str) -> str | None:
        """The region `answer_format` reads (`answer_region`: the last ``<answer>`` span for ``tag``); None =
        unparseable."""
        return answer_region(response_text, self.answer_format)

    def other_contexts(self, example: Example) -> list[OtherContext]:
        """The item's ``other_context`` (or the file-level one) with its ``other_answer``; [] when it gives none."""
        other = example.meta.get("other")
        return [] if other is None else [OtherContext(other["label"], other["context"], other["answer"])]

    def split_of(self, example: Example) -> str:
        """The module's split rule (`is_test_uid` on the content hash)."""
        return "test" if is_test_uid(example.uid, self.test_fraction) else "train"

    def vocab(self) -> list[str]:
        """Sorted words and punctuation marks of every prompt, context and answer, plus the ``<answer>`` tag pieces."""
        words: set[str] = set(ANSWER_TAG_PIECES)
        for pool in self._splits.values():
            for e in pool:
                words.update(_WORD_RE.findall(f"{e.prompt}\n{e.context}\n{e.answer}"))
        return sorted(words)


@dataclass(frozen=True)
class JsonlOptions(TaskOptions, ScoringOptions):
    """``--task jsonl`` options (``--option KEY=VALUE``, a study's ``task_options:``; docs/tasks.md); ``answer_format``
    is `ScoringOptions`'."""

    path: str | None = option(None, "the JSONL items (required)", metavar="PATH")
    context_file: str | None = option(None, "a file holding the shared context", metavar="PATH")
    context: str | None = option(None, "the shared context text (an item's own context overrides it)")
    test_fraction: float = option(0.2, "the share of items held out (by a hash of the item id)", range=UNIT)
    max_new_tokens: int = option(512, "response cap", range=GE1)
    temperature: float = option(1.0, "rollout temperature", range=TEMPERATURE_RANGE)
    cop_base: int = option(0, "0: HF MedMCQA's cop counts 0-3; 1: exports that count 1-4", range=Range(0, 1))
    placement: str = option(
        "system", "where the context goes: the system message or spliced before the question", choices=PLACEMENTS
    )
    other_context: str | None = option(None, "the file-level other context (the context-following study)")
    other_context_file: str | None = option(None, "a file holding the other context", metavar="PATH")

    def check(self) -> None:
        if self.path is None:
            raise ConfigError("option 'path' is required (path=data.jsonl)")
        if self.context is not None and self.context_file is not None:
            raise ConfigError("give either context= or context_file=, not both")
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"test_fraction={self.test_fraction!r} must lie strictly between 0 and 1")
        if self.context is not None and not self.context.strip():
            raise ConfigError("context= is empty; give the shared context text or leave it out")


@register_task("jsonl", options=JsonlOptions)
def make_jsonl_task(o: JsonlOptions) -> JsonlTask:
    """Build the ``jsonl`` task from its options (`JsonlOptions`): the file is read and its references checked."""
    shared = o.context.strip() if o.context is not None else None
    if o.context_file is not None:
        shared = read_context_file(o.context_file)
    path = Path(str(o.path))
    every = read_items(path, o.cop_base)
    check_ids(path, every)  # before the dedupe: every line's id
    items = _dedupe(every, path)
    other = shared_other(o.other_context, o.other_context_file)
    check_shared_other(shared, other)  # references that can be scored, or refused (`jsonl_checks`)
    check_references(items, path, o.answer_format, shared, other)
    return JsonlTask(
        path,
        items,
        shared,
        shared_other_context=other,
        answer_format=o.answer_format,
        test_fraction=o.test_fraction,
        max_new_tokens=o.max_new_tokens,
        temperature=o.temperature,
        placement=o.placement,
    )
