"""Paths and other free text in report.md, as a Markdown renderer shows them: never an element, a heading or a link.

A run's labels are checked where they enter (`core.checks.check_display_label`); paths are not (a folder may be named
anything, newlines and ``<img onerror=...>`` included), so the report escapes them where it writes them:

* `md_code(text)`: an inline code span on one line (control characters and line separators shown as ``\\n``,
  ``\\x1b``, ...; a fence longer than any run of backticks inside), so no HTML is live and no line break starts a
  block;
* `sh_arg(text)`: one shell word on one line inside the Reproduce block, that bash reads back as the same text
  (``'...'``, or ``$'...'`` with escapes when the text holds a control character).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def _escape(ch: str) -> str:
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return named.get(ch, f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def one_line(text: Any) -> str:
    """``text`` with every control character and line separator shown as its escape (one line, visible)."""
    return _CONTROL.sub(lambda m: _escape(m.group()), str(text))


def md_code(text: Any) -> str:
    """``text`` as an inline code span on one line (nothing inside renders as markup)."""
    shown = one_line(text)
    longest = max((len(run) for run in re.findall(r"`+", shown)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def sh_arg(text: Any) -> str:
    """``text`` as one shell word on one line that bash reads back unchanged."""
    s = str(text)
    if not _CONTROL.search(s):
        return shlex.quote(s)
    body = s.replace("\\", "\\\\").replace("'", "\\'")
    return "$'" + _CONTROL.sub(lambda m: _escape(m.group()), body) + "'"
