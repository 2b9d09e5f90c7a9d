"""The ``jsonl`` task's items: one JSONL line -> a validated `_Item` (three layouts: free-form, multiple choice,
MedMCQA; every problem one `DataError` naming line and field), the prompt it renders to, the file readers, and the
content-hash split rule (`is_test_uid`). The layouts and the rules: `mechopd.tasks.jsonl`'s docstring.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechopd.core.errors import DataError
from mechopd.tasks.jsonl_answer import ScoringOptions, choice_letter, instruction_for
from mechopd.tasks.jsonl_other import raw_other

MEDMCQA_FIELDS = ("opa", "opb", "opc", "opd")
ACCEPTED_LAYOUTS = (
    '{"prompt", "answer"}, {"question", "options", "answer"} or MedMCQA {"question", "opa".."opd", "cop"}'
)


# ------------------------------------------------------------------------------------------------------ item parsing
@dataclass(frozen=True)
class _Item:
    stem: str
    answer: str  # letter for multiple choice, raw text for free-form
    options: dict[str, str] | None
    context: str | None
    layout: str  # "prompt" | "options" | "medmcqa"
    line: int
    other: tuple[str | None, str | None] = (None, None)  # (other_context, other_answer): not part of the uid

    @property
    def uid(self) -> str:
        payload = {"stem": self.stem, "options": self.options, "answer": self.answer, "context": self.context}
        return hashlib.sha1(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def _where(path: Path, line: int) -> str:
    return f"{path}: line {line}:"


def _text_field(obj: dict, key: str, path: Path, line: int) -> str:
    """A non-empty string field (numbers are accepted and turned into text)."""
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(f"{_where(path, line)} field {key!r} must be a string, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise DataError(f"{_where(path, line)} field {key!r} is empty; give it a non-empty string")
    return text


def _options_from(obj: dict, path: Path, line: int) -> dict[str, str]:
    raw = obj["options"]
    if isinstance(raw, list):
        if len(raw) > 26:
            raise DataError(f"{_where(path, line)} field 'options' has {len(raw)} entries; at most 26 (A-Z)")
        pairs = [(chr(ord("A") + i), v) for i, v in enumerate(raw)]
    elif isinstance(raw, dict):
        bad = [k for k in raw if not (len(k) == 1 and k.isascii() and k.isalpha())]
        if bad:
            raise DataError(f"{_where(path, line)} field 'options' has key {bad[0]!r}; keys must be single letters A-Z")
        pairs = sorted((k.upper(), v) for k, v in raw.items())
        if len({k for k, _ in pairs}) != len(pairs):
            raise DataError(f"{_where(path, line)} field 'options' repeats a letter (keys are case-insensitive)")
    else:
        raise DataError(f"{_where(path, line)} field 'options' must be a list or a letter->text object")
    if len(pairs) < 2:
        raise DataError(f"{_where(path, line)} field 'options' needs at least 2 options, got {len(pairs)}")
    return {k: _text_field({f"options[{k}]": v}, f"options[{k}]", path, line) for k, v in pairs}


def _mc_answer(obj: dict, options: dict[str, str], path: Path, line: int) -> str:
    """The answer letter of an options item: a letter among the options, or exactly one option's text."""
    if "answer" not in obj:
        raise DataError(f"{_where(path, line)} missing field 'answer' (an option letter such as \"B\")")
    raw = obj["answer"]
    if not isinstance(raw, str) or not raw.strip():
        raise DataError(f"{_where(path, line)} field 'answer' must be an option letter such as \"B\", got {raw!r}")
    letter = choice_letter(raw, options)
    if letter not in options:
        raise DataError(
            f"{_where(path, line)} field 'answer' = {raw!r} names no option; use one of {', '.join(options)}"
        )
    return letter


def _medmcqa(obj: dict, path: Path, line: int, cop_base: int) -> tuple[dict[str, str], str]:
    """MedMCQA -> (options A-D, answer letter). `cop` is `cop_base`-based (0: HF MedMCQA) or a letter a-d."""
    missing = [k for k in (*MEDMCQA_FIELDS, "cop") if k not in obj]
    if missing:
        raise DataError(
            f"{_where(path, line)} missing field {missing[0]!r} (MedMCQA layout needs opa, opb, opc, opd, cop)"
        )
    options = {letter: _text_field(obj, key, path, line) for letter, key in zip("ABCD", MEDMCQA_FIELDS)}
    cop = obj["cop"]
    if isinstance(cop, str) and cop.strip().upper() in options:
        return options, cop.strip().upper()
    if isinstance(cop, bool) or not isinstance(cop, int) or not cop_base <= cop <= cop_base + 3:
        hint = " (1-4 values: pass cop_base=1)" if cop_base == 0 and cop == 4 else ""
        raise DataError(
            f"{_where(path, line)} field 'cop' = {cop!r} is not an option index {cop_base}-{cop_base + 3}{hint}"
        )
    return options, "ABCD"[cop - cop_base]


def _context_field(obj: dict, path: Path, line: int) -> str | None:
    if "context" not in obj or obj["context"] is None:
        return None
    if not isinstance(obj["context"], str) or not obj["context"].strip():
        raise DataError(f"{_where(path, line)} field 'context' must be a non-empty string (or leave it out)")
    return obj["context"].strip()


def parse_item(obj: Any, path: Path, line: int, cop_base: int = 0) -> _Item:
    """One JSON value -> a validated item; every problem raises a one-line `DataError` naming line and field."""
    if not isinstance(obj, dict):
        kind = type(obj).__name__
        raise DataError(f"{_where(path, line)} expected a JSON object, got {kind}; accepted: {ACCEPTED_LAYOUTS}")
    context = _context_field(obj, path, line)
    if "question" in obj and "options" in obj:
        options = _options_from(obj, path, line)
        stem = _text_field(obj, "question", path, line)
        return _Item(stem, _mc_answer(obj, options, path, line), options, context, "options", line)
    if "question" in obj and any(k in obj for k in (*MEDMCQA_FIELDS, "cop")):
        options, letter = _medmcqa(obj, path, line, cop_base)
        return _Item(_text_field(obj, "question", path, line), letter, options, context, "medmcqa", line)
    if "prompt" in obj:
        if "answer" not in obj:
            raise DataError(f"{_where(path, line)} missing field 'answer' (the reference answer for 'prompt')")
        stem, answer = _text_field(obj, "prompt", path, line), _text_field(obj, "answer", path, line)
        return _Item(stem, answer, None, context, "prompt", line)
    field_name = "options" if "question" in obj else "prompt"
    raise DataError(f"{_where(path, line)} missing field {field_name!r}; accepted layouts: {ACCEPTED_LAYOUTS}")


def render_prompt(item: _Item, answer_format: str = ScoringOptions.answer_format) -> str:
    """The user-turn text x: stem, the options as ``A. ...`` lines, then the instruction of `answer_format`
    (`instruction_for`: the ``<answer>`` request for ``tag``, a short-reply request for the others)."""
    instruction = instruction_for(answer_format, item.options is not None)
    if item.options is None:
        return f"{item.stem}\n\n{instruction}"
    block = "\n".join(f"{letter}. {text}" for letter, text in item.options.items())
    return f"{item.stem}\n\n{block}\n\n{instruction}"


def read_items(path: str | Path, cop_base: int = 0) -> list[_Item]:
    """All items of a JSONL file (blank lines skipped); missing / empty / malformed files raise `DataError`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: JSONL file not found; pass an existing file as path=")
    try:
        lines = [ln.rstrip("\r") for ln in path.read_text(encoding="utf-8-sig").split("\n")]  # not splitlines: U+2028
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); save the file as UTF-8") from None
    items = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            raise DataError(f"{_where(path, number)} not valid JSON ({err.msg} at column {err.colno})") from None
        except RecursionError:
            raise DataError(f"{_where(path, number)} nests too deeply; an item is one flat JSON object") from None
        item = parse_item(obj, path, number, cop_base)
        items.append(dataclasses.replace(item, other=raw_other(obj, _where(path, number))))
    if not items:
        raise DataError(f"{path}: no items (the file is empty or only blank lines); add one JSON object per line")
    return items


def read_context_file(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: context file not found; fix context_file= or drop it")
    try:
        text = path.read_text(encoding="utf-8-sig").strip()
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: context file is not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8"
        ) from None
    if not text:
        raise DataError(f"{path}: context file is empty; put the shared context in it or drop context_file=")
    return text


def _dedupe(items: list[_Item], path: Path) -> list[_Item]:
    """Exact repeats (other context and answer included) kept once, with a warning; a copy of an item that differs
    only in its other_context / other_answer is refused with both lines (one of them would be dropped)."""
    seen: dict[str, _Item] = {}
    kept = []
    for item in items:
        first = seen.get(item.uid)
        if first is not None and first.other != item.other:
            raise DataError(
                f"{path}: line {item.line} repeats line {first.line} with another other_context/other_answer; "
                "keep one copy, or make the questions differ"
            )
        if first is not None:
            warnings.warn(f"{path}: line {item.line} repeats line {first.line} exactly; kept once", stacklevel=3)
            continue
        seen[item.uid] = item
        kept.append(item)
    return kept


def is_test_uid(uid: str, test_fraction: float) -> bool:
    """Deterministic split by content hash: test iff the first 60 bits, read as a fraction, are < test_fraction."""
    return int(uid[:15], 16) / float(16**15) < test_fraction
