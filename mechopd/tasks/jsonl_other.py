"""Other contexts of the ``jsonl`` task (the context-following study, docs/method.md "Context following").

An item may carry ``"other_context"`` (a context other than its distilled one) and ``"other_answer"`` (the answer that
context implies: an option letter, or one option's exact text, for multiple choice; free text otherwise). The
file-level form is the task option ``other_context=TEXT`` (or ``other_context_file=PATH``): a shared other context for
every item that gives an ``other_answer`` without its own ``other_context``. Labels: ``per-item`` for an item's own
other context, ``shared`` for the file-level one. Items without ``other_answer`` have no other context.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechopd.core.errors import DataError

PER_ITEM, SHARED = "per-item", "shared"


def raw_other(obj: dict, where: str) -> tuple[str | None, str | None]:
    """(other_context, other_answer) of one JSON item, each a non-empty string or None; validated here."""
    out = []
    for key in ("other_context", "other_answer"):
        value = obj.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise DataError(f"{where} field {key!r} must be a non-empty string (or leave it out)")
        out.append(value.strip() if value is not None else None)
    if out[0] is not None and out[1] is None:
        raise DataError(f"{where} field 'other_context' has no 'other_answer'; add the answer that context implies")
    return out[0], out[1]


def resolve_other(
    other_context: str | None,
    other_answer: str | None,
    shared: str | None,
    options: dict[str, str] | None,
    where: str,
    letter_of: Any,
) -> dict[str, str] | None:
    """The item's other context as ``{"label", "context", "answer"}`` (answer: the option letter for multiple
    choice), or None when the item gives no ``other_answer``."""
    if other_answer is None:
        return None
    context = other_context or shared
    if context is None:
        raise DataError(
            f"{where} field 'other_answer' has no other context; add 'other_context' to the item or "
            "pass other_context= / other_context_file= to the task"
        )
    answer = other_answer
    if options:
        answer = letter_of(other_answer, options)
        if answer not in options:
            raise DataError(
                f"{where} field 'other_answer' = {other_answer!r} names no option; use one of {', '.join(options)}"
            )
    return {"label": PER_ITEM if other_context else SHARED, "context": context, "answer": answer}


def shared_other(text: str | None, path: str | Path | None) -> str | None:
    """The file-level other context from ``other_context=`` or ``other_context_file=`` (not both)."""
    if text is not None and path is not None:
        raise DataError("jsonl task: give either other_context= or other_context_file=, not both")
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: other context file not found; fix other_context_file= or drop it")
        text = path.read_text(encoding="utf-8-sig")
    if text is not None and not str(text).strip():
        raise DataError("jsonl task: the other context is empty; give its text or leave other_context= out")
    return None if text is None else str(text).strip()
