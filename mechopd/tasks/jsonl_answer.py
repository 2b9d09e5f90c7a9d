"""Answer parsing of the ``jsonl`` task (`mechopd.tasks.jsonl`); import these names from here.

The task option ``answer_format`` (`ScoringOptions`, declared once) says where the answer is read:

* ``tag`` (default): the LAST closed ``<answer>...</answer>`` span of a response (`parse_answer`);
* ``exact``: the whole response;
* ``first_line``: the first non-blank line of the response;
* ``contains``: the reference anywhere in the response, as whole words (`contains_phrase`).

Multiple-choice spans name a letter or one option's exact text (`choice_letter`); free-form answers compare on
`normalize_text`. Invisible characters (zero-width, bidi marks: `strip_invisible`) are removed from the reply, the
reference and the options before any format compares. What a file must hold to be scoreable is checked when it is
read (`mechopd.tasks.jsonl_checks`). The prompt's closing instruction follows the format (`instruction_for`).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from mechopd.core.options import check_value, field_facts, option

_SPAN_RE = re.compile(r"<\s*answer\s*>((?:(?!<\s*answer\s*>).)*?)<\s*/\s*answer\s*>", re.IGNORECASE | re.DOTALL)
_CHOICE_RE = re.compile(r"^[(\[]?\s*([A-Za-z])\s*(?:[)\]]|[.:)](?:\s.*)?)?$", re.DOTALL)
_WORDS_RE = re.compile(r"\w+")

ANSWER_FORMATS = ("tag", "exact", "contains", "first_line")
FREE_INSTRUCTION = "Think it through, then give your final answer inside <answer> and </answer>."
MC_INSTRUCTION = "Think it through, then give the letter of the correct option inside <answer> and </answer>."
SHORT_FREE_INSTRUCTION = "Reply with the answer only, in a few words."
SHORT_MC_INSTRUCTION = "Reply with the letter of the correct option only."


@dataclass(frozen=True)
class ScoringOptions:
    """How a ``jsonl`` response is scored (the task option ``answer_format``; docs/tasks.md states each rule)."""

    answer_format: str = option(
        "tag",
        help="where the answer is read: tag (the last <answer> span), exact (the whole response), contains (the "
        "reference as whole words anywhere), first_line (the first non-blank line)",
        choices=ANSWER_FORMATS,
    )

    def __post_init__(self) -> None:
        facts = field_facts(ScoringOptions)[0]
        check_value(facts, self.answer_format, f"jsonl task: answer_format={self.answer_format!r}")


def instruction_for(answer_format: str, multiple_choice: bool) -> str:
    """The instruction that closes a prompt: the ``<answer>`` tag request for ``tag``, a short-reply request else."""
    if answer_format == "tag":
        return MC_INSTRUCTION if multiple_choice else FREE_INSTRUCTION
    return SHORT_MC_INSTRUCTION if multiple_choice else SHORT_FREE_INSTRUCTION


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


def answer_region(text: str, answer_format: str) -> str | None:
    """The part of a response that `answer_format` reads, stripped; None (unparseable) when it is empty: ``tag`` the
    last ``<answer>`` span, ``first_line`` the first non-blank line, ``exact`` and ``contains`` the whole response."""
    if answer_format == "tag":
        return parse_answer(text)
    if answer_format == "first_line":
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[0] if lines else None
    return text.strip() or None


def normalize_text(text: str) -> str:
    """Free-form comparison key: NFKC, casefolded, whitespace collapsed, punctuation stripped at both ends only."""
    text = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return text.strip(" .,;:!?\"'`()[]{}*")


def strip_invisible(text: str) -> str:
    """``text`` without its invisible format characters (Unicode category Cf: zero-width spaces and joiners, bidi marks
    and embeddings, the byte-order mark, soft hyphens): a leading right-to-left mark must not make "Paris" wrong."""
    return "".join(ch for ch in text if unicodedata.category(ch) != "Cf") if not text.isascii() else text


def words_of(text: str) -> list[str]:
    """The ``\\w+`` words of ``text``, NFKC-casefolded (what `contains_phrase` compares)."""
    return _WORDS_RE.findall(unicodedata.normalize("NFKC", text).casefold())


def contains_phrase(text: str, phrase: str) -> bool:
    """`phrase` occurs in `text` as a run of whole words: both NFKC-casefolded and cut into ``\\w+`` words (punctuation
    and spacing ignored); ``Quell`` is in "Ms. Quell." but not in "Quellmann"."""
    words = _WORDS_RE.findall(unicodedata.normalize("NFKC", text).casefold())
    want = _WORDS_RE.findall(unicodedata.normalize("NFKC", phrase).casefold())
    if not want:
        return False
    return any(words[i : i + len(want)] == want for i in range(len(words) - len(want) + 1))


def choice_letter(span: str, options: dict[str, str]) -> str | None:
    """The option letter a span names: ``B``, ``b``, ``B.``, ``(B)``, ``B)``, ``[B]``, ``B. text``, ``B: text``, or the
    exact (normalised) text of one option. Returns the upper-case letter (possibly not among `options`) or None."""
    match = _CHOICE_RE.match(span.strip())
    if match:
        return match.group(1).upper()
    key = normalize_text(span)
    hits = [letter for letter, text in options.items() if normalize_text(text) == key]
    return hits[0] if len(hits) == 1 else None


def score_response(text: str, answer: str, options: dict[str, str] | None, answer_format: str) -> bool:
    """Whether a response names the reference under `answer_format` (docs/tasks.md): multiple choice reads the option
    letter (`choice_letter`) of the region, except ``contains``, which needs the right option's text and no other
    option's; free-form compares `normalize_text` keys, except ``contains`` (`contains_phrase`). Invisible characters
    are stripped from every side first (`strip_invisible`)."""
    text, answer = strip_invisible(text), strip_invisible(str(answer))
    options = {k: strip_invisible(v) for k, v in options.items()} if options else options
    region = answer_region(text, answer_format)
    if region is None:
        return False
    if answer_format == "contains":
        if options:
            found = [letter for letter, option_text in options.items() if contains_phrase(region, option_text)]
            return found == [str(answer).upper()]
        return contains_phrase(region, str(answer))
    if options:
        return choice_letter(region, options) == str(answer).upper()
    return normalize_text(region) == normalize_text(str(answer))
