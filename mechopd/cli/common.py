"""`mechopd` verbs' shared plumbing: the command table and the flag readers (a leaf: `cli/` and every verb module
import it, it imports no verb)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    """One verb: its help line, its arguments (``args(parser)``) and its handler (``run(namespace) -> exit code``)."""

    help: str
    args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}  # the one verb table: name -> Command, in `mechopd --help`'s order


def command(name: str, help: str, args: Callable[[argparse.ArgumentParser], None]):
    """Register the decorated handler as the verb ``name`` with its help line and its arguments."""

    def deco(fn):
        COMMANDS[name] = Command(help, args, fn)
        return fn

    return deco


def add_given(p: argparse.ArgumentParser, facts: list[Any]) -> None:
    """The flags of declared fields, typed (`mechopd.core.options.add_flags`: None unless given)."""
    from mechopd.core.options import add_flags

    add_flags(p, facts, typed=True)


def setup_facts(*names: str) -> list[Any]:
    """The probes' setup flags (`mechopd.probes.setup.ProbeSetup`: --run, --task, --option, ...) that a verb shares,
    by field name: the one declaration of the render and task flags (eval, train and probe take them from here)."""
    from mechopd.core.options import field_facts
    from mechopd.probes.setup import ProbeSetup

    facts = {f.name: f for f in field_facts(ProbeSetup)}
    return [facts[name] for name in names]


def given(a: argparse.Namespace, facts: list[Any], verb: str = "") -> dict[str, Any]:
    """The declared flags given on the command line (field name -> value); with ``verb``, each is checked against its
    declaration here (range, choices), one line naming the flag: ``VERB --flag VALUE is invalid: ...`` (without:
    the library the verb calls checks them, in its own words)."""
    from mechopd.core.options import check_value

    out = {f.name: v for f in facts if (v := getattr(a, f.name, None)) is not None}
    for f in facts if verb else ():
        if f.name in out:
            check_value(f, out[f.name], subject=f"{verb} {f.flag} {out[f.name]}")
    return out


def kv(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    """``--option`` / ``--chat-template-kwarg`` pairs, read as ``--set task_options.K=V`` is (`config.parse_options`)."""
    from mechopd.core.config_parse import parse_options

    return parse_options(pairs, flag)


def kv_raw(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    from mechopd.core.config_parse import parse_overrides

    return parse_overrides(pairs or [], flag)


def text(value: str | None, flag: str) -> str | None:
    from mechopd.core.config_parse import flag_text

    return flag_text(value, flag)  # the rule --set applies to text fields


def named(pairs: list[str] | None, flag: str) -> dict[str, str]:
    """``["base=DIR", "opd=DIR"]`` -> ordered dict; malformed items, non-plain labels and duplicates refused."""
    from mechopd.core.checks import parse_labels

    return parse_labels(pairs, flag)
