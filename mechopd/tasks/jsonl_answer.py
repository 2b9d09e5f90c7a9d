"""Answer parsing of the ``jsonl`` task (split from `mechopd.tasks.jsonl`, which re-exports these names).

Scoring reads the LAST closed ``<answer>...</answer>`` span of a response (`parse_answer`); multiple-choice spans name
a letter or one option's exact text (`choice_letter`); free-form answers compare on `normalize_text`.
"""

from __future__ import annotations

import re
import unicodedata

_SPAN_RE = re.compile(r"<\s*answer\s*>((?:(?!<\s*answer\s*>).)*?)<\s*/\s*answer\s*>", re.IGNORECASE | re.DOTALL)
_CHOICE_RE = re.compile(r"^[(\[]?\s*([A-Za-z])\s*(?:[)\]]|[.:)](?:\s.*)?)?$", re.DOTALL)


def parse_answer(text: str) -> str | None:
    """The stripped content of the LAST closed ``<answer>...</answer>`` span of `text`, or None.

    Tags are case-insensitive and may hold spaces (``< Answer >``). An unclosed ``<answer>`` is not a span; a nested
    ``<answer>`` restarts the span (``<answer>A <answer>B</answer>`` reads ``B``). An empty or whitespace-only last span
    is None: like a missing span, it is unparseable (scored wrong).
    """
    spans = _SPAN_RE.findall(text)
    if not spans:
        return None
    content = spans[-1].strip()
    return content or None


def normalize_text(text: str) -> str:
    """Free-form comparison key: NFKC, casefolded, whitespace collapsed, punctuation stripped at both ends only."""
    text = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return text.strip(" .,;:!?\"'`()[]{}*")


def choice_letter(span: str, options: dict[str, str]) -> str | None:
    """The option letter a span names: ``B``, ``b``, ``B.``, ``(B)``, ``B)``, ``[B]``, ``B. text``, ``B: text``, or the
    exact (normalised) text of one option. Returns the upper-case letter (possibly not among `options`) or None."""
    match = _CHOICE_RE.match(span.strip())
    if match:
        return match.group(1).upper()
    key = normalize_text(span)
    hits = [letter for letter, text in options.items() if normalize_text(text) == key]
    return hits[0] if len(hits) == 1 else None
