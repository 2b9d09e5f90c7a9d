"""`mechopd` verbs' shared plumbing: the command table and the flag readers (a leaf: `cli/` and every verb module
import it, it imports no verb)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {}  # name -> (help, handler)


def command(name: str, help: str):
    def deco(fn):
        COMMANDS[name] = (help, fn)
        return fn

    return deco


def kv(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    """``--option`` / ``--chat-template-kwarg`` pairs, read as ``--set task_options.K=V`` is (`config.parse_options`)."""
    from mechopd.config import parse_options

    return parse_options(pairs, flag)


def kv_raw(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    from mechopd.core.config_parse import parse_overrides

    return parse_overrides(pairs or [], flag)


def text(value: str | None, flag: str) -> str | None:
    from mechopd.config import flag_text

    return flag_text(value, flag)  # the rule --set applies to text fields


def named(pairs: list[str] | None, flag: str) -> dict[str, str]:
    """``["base=DIR", "opd=DIR"]`` -> ordered dict; malformed items, non-plain labels and duplicates refused."""
    from mechopd.core.checks import parse_labels

    return parse_labels(pairs, flag)
