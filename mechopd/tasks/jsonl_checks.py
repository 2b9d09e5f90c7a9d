"""Load-time checks of the ``jsonl`` task's references (`check_references`): an item whose answer can never be scored
right, or is scored right for the wrong reason, is refused with its line and the fix, before any job.

Every format:
- a reference that normalises to nothing ("?", "...", only invisible characters): no reply can equal it;
- contradictory copies: one question (stem, options, context) given twice with different answers, or one ``id``
  given to two items that differ (`check_ids`);
- options equal up to case, spacing and end punctuation: the letter is the only thing that tells them apart;
- an other context equal to the item's context: following would be measured against itself.
``first_line``: a reference on two lines (a first line never holds it). ``contains`` (the reference as whole words
anywhere in the reply):
- a reference shorter than 2 characters or made only of stop words ("a", "the", "of it"): nearly any sentence holds
  it;
- an option whose words are inside another option's ("cat" in "black cat"): the longer can never score alone;
- a reference (the right option's text) that appears in its own question: an echo of the question scores right.
  Refused, not scored on the reply minus the question's words: removing words changes what every other reply is
  scored on too, and a small model that restates the question would still be scored on whatever words are left;
  the author can rephrase the question (or choose ``tag``/``exact``), which keeps the score's meaning plain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mechopd.core.errors import DataError
from mechopd.tasks.jsonl_answer import contains_phrase, normalize_text, strip_invisible, words_of

# function words that carry no answer: a `contains` reference made only of these matches nearly any sentence
STOP_WORDS = frozenset(
    "a an the of to in on at by for from with and or but nor not no yes is are was were be been being it its this "
    "that these those he she they we you i me my our your his her their them him as so if then than there here".split()
)
MIN_CONTAINS_CHARS = 2


def check_references(
    items: list[Any], path: Path, answer_format: str, shared_context: str | None, shared_other: str | None
) -> None:
    """Every item of ``items`` (`jsonl_items._Item`) scoreable under ``answer_format`` (module docstring); the first
    problem is one `DataError` naming the file, the line and the fix."""
    seen: dict[str, Any] = {}
    for item in items:
        where = f"{path}: line {item.line}:"
        _check_reference(item, where, answer_format)
        _check_options(item, where, answer_format)
        _check_other(item, where, shared_context, shared_other)
        key = normalize_text(" ".join([item.stem, *(item.options or {}).values(), item.context or ""]))
        first = seen.setdefault(key, item)
        if first is not item and _answer_key(first) != _answer_key(item):
            raise DataError(
                f"{where} repeats the question of line {first.line} with another answer ({item.answer!r} vs "
                f"{first.answer!r}); keep the copy with the right answer and delete the other"
            )


def _answer_key(item: Any) -> str:
    return item.answer if item.options else normalize_text(strip_invisible(item.answer))


def _check_reference(item: Any, where: str, answer_format: str) -> None:
    if item.options:
        return
    answer = strip_invisible(item.answer)
    if not normalize_text(answer):
        raise DataError(
            f"{where} field 'answer' = {item.answer!r} normalises to nothing (only punctuation, spaces or invisible "
            "characters): no reply can be scored right; give the answer in words"
        )
    if answer_format == "first_line" and len([ln for ln in answer.splitlines() if ln.strip()]) > 1:
        raise DataError(
            f"{where} field 'answer' spans several lines, but answer_format first_line reads one line of the reply; "
            "put the answer on one line or use answer_format exact"
        )
    if answer_format == "contains":
        _check_contains_text(answer, "'answer'", where)
        if contains_phrase(item.stem, answer):
            raise _echo(where, "'answer'", item.answer)


def _check_contains_text(text: str, field: str, where: str) -> None:
    words = words_of(text)
    if len(normalize_text(text)) < MIN_CONTAINS_CHARS or all(w in STOP_WORDS for w in words):
        short = "too short" if len(normalize_text(text)) < MIN_CONTAINS_CHARS else "only stop words"
        raise DataError(
            f"{where} field {field} = {text!r} is {short} for answer_format "
            f"contains (the reference as whole words anywhere in the reply): nearly any sentence holds it; give a "
            f"more specific answer of {MIN_CONTAINS_CHARS}+ characters, or use answer_format tag or exact"
        )


def _echo(where: str, field: str, text: str) -> DataError:
    return DataError(
        f"{where} field {field} = {text!r} appears in the item's own question, so under answer_format contains a "
        "reply that repeats the question scores right; rephrase the question without the answer, or use "
        "answer_format tag or exact"
    )


def _check_options(item: Any, where: str, answer_format: str) -> None:
    if not item.options:
        return
    keys: dict[str, str] = {}
    for letter, text in item.options.items():
        key = normalize_text(strip_invisible(text))
        if key in keys:
            raise DataError(
                f"{where} options {keys[key]} and {letter} are the same text up to case and punctuation ({text!r}); "
                "make every option distinct"
            )
        keys[key] = letter
    if answer_format != "contains":
        return
    for letter, text in item.options.items():
        _check_contains_text(strip_invisible(text), f"options[{letter}]", where)
        inside = [o for o, other in item.options.items() if o != letter and contains_phrase(other, text)]
        if inside:
            raise DataError(
                f"{where} option {letter} ({text!r}) is inside option {inside[0]} ({item.options[inside[0]]!r}): "
                f"under answer_format contains option {inside[0]} can never be named alone; reword one of them, or "
                "use answer_format tag"
            )
    if contains_phrase(item.stem, item.options[item.answer]):
        raise _echo(where, f"options[{item.answer}]", item.options[item.answer])


def _check_other(item: Any, where: str, shared_context: str | None, shared_other: str | None) -> None:
    context = item.context or shared_context
    other = item.other[0] or (shared_other if item.other[1] is not None else None)
    if context is not None and other is not None and _same(context, other):
        what = "'other_context'" if item.other[0] else "the other context (other_context= / other_context_file=)"
        raise DataError(
            f"{where} {what} is the item's own context: following would be measured against itself; give a "
            "context that implies the other answer"
        )


def _same(a: str, b: str) -> bool:
    return " ".join(strip_invisible(a).split()) == " ".join(strip_invisible(b).split())


def check_shared_other(shared_context: str | None, shared_other: str | None) -> None:
    """The file-level other context is not the shared context itself (checked even when no item reads it)."""
    if shared_context is not None and shared_other is not None and _same(shared_context, shared_other):
        raise DataError(
            "jsonl task: the other context (other_context= / other_context_file=) is the distilled context itself: "
            "following would be measured against itself; pass a context that implies other answers"
        )


def check_ids(path: Path, items: list[Any]) -> None:
    """Items that carry an ``"id"`` field: one id names one item (a second copy that differs in its question, options,
    context, answer or other context/answer is refused with both lines). Identical copies are the reader's (kept once, with a warning)."""
    lines = {item.line: item for item in items}
    seen: dict[str, Any] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8-sig").split("\n"), start=1):
        if number not in lines or not raw.strip():
            continue
        ident = json.loads(raw).get("id")
        if ident is None or isinstance(ident, (dict, list)):
            continue
        item = lines[number]
        first = seen.setdefault(str(ident), item)
        if first is not item and (first.uid, first.other) != (item.uid, item.other):
            raise DataError(
                f"{path}: line {number}: id {ident!r} is also line {first.line}'s, with another question, answer or "
                "other_context/other_answer; "
                "give each item its own id, or keep one copy"
            )
