"""Reading configs: YAML files and command-line ``KEY=VALUE`` pairs, one rule for every verb (`mechopd.config`).

* A YAML file is read by `StrictLoader`: a SafeLoader that keeps dates as text (``2024-07-26`` stays a string, as
  config.yaml and training.json will save it) and refuses a key given twice; a file that is not UTF-8, a directory, or
  nests deeper than ``MAX_NESTING`` brackets is refused with one line.
* A command-line value (``--set``, ``--option``, ``--chat-template-kwarg``) is a `CliValue`: text until the field's
  declared type reads it (`options.coerce`): a text field keeps it as typed (``no_context_system=Note: be brief.``);
  a number, bool or mapping field parses it; a field without a type (task options, template variables) reads it with
  `scalar` (a YAML scalar or a flow list of scalars, else the text itself).
* `check_saveable`: what a run records must read back equal from JSON and YAML, checked before the first step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from mechopd.core.errors import ConfigError

MAX_NESTING = 64  # brackets a config file may open in a row (20k of them would exhaust the parser's recursion)


class CliValue(str):
    """A value typed at the command line (``--set``, ``--option``): text until the field's declared type reads it
    (`mechopd.core.options.coerce`), so a value meant as text stays text (``no_context_system=Note: be brief.``, ``date_string=2024-07-26``)."""


def parse_overrides(pairs: list[str], flag: str = "--set") -> dict[str, Any]:
    """``["lr=1e-4", "task_options.rule=shift:2"]`` -> a nested dict of `CliValue` leaves (typed later, by field).

    A key given again overrides the earlier value (the last one wins, as flags do); a key that is both a value and a
    mapping (``lr=1e-3`` and ``lr.x=2``) is refused."""
    out: dict[str, Any] = {}
    seen: dict[str, str] = {}  # key -> the pair that set it
    for pair in pairs:
        key, sep, value = pair.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(p.strip() for p in parts):
            raise ConfigError(f"{flag} {pair!r} is not key=value; e.g. {flag} lr=1e-4")
        node = out
        for i, p in enumerate(parts[:-1]):
            if not isinstance(node.setdefault(p, {}), dict):
                other = seen[".".join(parts[: i + 1])]
                raise ConfigError(
                    f"{flag} {pair!r} conflicts with {flag} {other!r}: {'.'.join(parts[: i + 1])} "
                    "cannot be both a value and a mapping; keep one of them"
                )
            node = node[p]
        if isinstance(node.get(parts[-1]), dict):
            other = next(v for k, v in seen.items() if k.startswith(key.strip() + "."))
            raise ConfigError(
                f"{flag} {pair!r} conflicts with {flag} {other!r}: {key.strip()} cannot be both a "
                "value and a mapping; keep one of them"
            )
        node[parts[-1]] = CliValue(value)
        seen[key.strip()] = pair
    return out


def scalar(text: str) -> Any:
    """The one reading of a command-line value whose field declares no type (task options, template variables):
    a YAML scalar (``true``, ``3``, ``0.5``, ``null``), a flow list of scalars (``[shift:1, reverse]``), or else the
    text itself: dates and anything with ``: `` in it (``Note: be brief.``) stay text."""
    if text == "":
        return ""
    try:
        value = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
    except (yaml.YAMLError, RecursionError):
        return str(text)
    if isinstance(value, list) and text.strip().startswith("[") and all(_is_scalar(v) and v is not None for v in value):
        return value
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 reads 1e-3 (no dot) as text
    return value if _is_scalar(value) else str(text)


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def typed_options(options: dict[str, Any]) -> dict[str, Any]:
    """Nested `CliValue` leaves read by `scalar` (what ``--option`` and ``--set task_options.K=V`` hand a task)."""
    return {
        k: typed_options(v) if isinstance(v, dict) else scalar(v) if isinstance(v, CliValue) else v
        for k, v in options.items()
    }


def text_value(value: Any, name: str, optional: bool, source: str) -> str | None:
    """A text field's value: command-line text stays text (``null`` / ``~`` = unset for an optional field); from YAML
    a string (quote a number or a date you mean as text)."""
    if isinstance(value, CliValue):
        return None if optional and value in ("null", "~") else str(value)
    if isinstance(value, str):
        return value
    raise ConfigError(f"{source}: {name}={value!r} is not text; quote it in YAML (e.g. {name}: '{value}')")


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


MAX_ALIASES = 20  # aliases (*name) in one YAML document: a config needs few, an alias bomb many


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that keeps dates as text (``2024-07-26`` is a string, as JSON would save it), refuses a mapping
    that repeats a key (YAML would keep the last silently) and a document with more than `MAX_ALIASES` aliases
    (``*name``: an alias bomb expands exponentially in whatever walks the result)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases = getattr(self, "aliases", 0) + 1
            if self.aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases (*name); write the values out instead")
        return super().compose_node(parent, index)


StrictLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _mapping_without_duplicates(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {key!r} appears twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1}); keep one",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping of config keys (`StrictLoader`); an unreadable, non-UTF-8 or malformed file -> `ConfigError`."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist; pass a YAML file (see training/*.yaml)")
    if not p.is_file():
        raise ConfigError(f"config file {p} is not a file (a directory?); pass a YAML file (see training/*.yaml)")
    try:
        text = p.read_text(encoding="utf-8")
        if max((len(run) for run in re.findall(r"[\[{]+", re.sub(r"\s+", "", text))), default=0) > MAX_NESTING:
            raise RecursionError
        data = yaml.load(text, Loader=StrictLoader) or {}  # noqa: S506
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    except yaml.MarkedYAMLError as e:
        where = f" (line {e.problem_mark.line + 1})" if e.problem_mark is not None else ""
        raise ConfigError(f"{p} is not valid YAML: {e.problem or e.context}{where}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ConfigError(f"{p} nests too deeply to be a config; a config is a flat mapping of keys") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a YAML mapping of config keys, got {type(data).__name__}")
    return data


def check_saveable(data: dict[str, Any], source: str = "config") -> None:
    """What a run records (config.yaml, training.json) must read back equal: refuse, before the first step, a value
    JSON or YAML cannot hold (a date object, a set, NaN)."""
    try:
        same = json.loads(json.dumps(data, allow_nan=False)) == data
        same = same and yaml.load(yaml.safe_dump(data, sort_keys=False), Loader=StrictLoader) == data  # noqa: S506
    except (TypeError, ValueError, yaml.YAMLError):
        same = False
    if not same:
        bad = next((f"{k}={v!r}" for k, v in data.items() if not _saveable(v)), "a value")
        raise ConfigError(
            f"{source}: {bad} cannot be saved in config.yaml / training.json (JSON and YAML read it "
            "back differently); pass it as text, a number, true/false or null"
        )


def _saveable(value: Any) -> bool:
    try:
        return json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError):
        return False


def flag_text(value: str | None, flag: str) -> str | None:
    """A text flag's value (eval's and probe's ``--no-context-system``) by the rule ``--set`` uses for text fields
    (`text_value`: as typed; ``null`` = unset; None = not given)."""
    return None if value is None else text_value(CliValue(value), flag, True, flag)


def parse_options(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    """``--option`` / ``--chat-template-kwarg`` pairs -> a nested dict, values read by `scalar` (the same words and
    the same reading as ``--set task_options.KEY=VALUE``)."""
    options = parse_overrides(pairs or [], flag)
    return template_options(options) if flag == "--chat-template-kwarg" else typed_options(options)


def template_options(options: dict[str, Any]) -> dict[str, Any]:
    """Chat-template variables typed at the command line: as `typed_options`, but a bare ``0``/``1`` stays its text,
    which the render reads as a boolean (`views.template_flags`; ``true``/``false`` are booleans already): a command
    line cannot tell a flag from a number, and templates test flags with ``is false``; a YAML number stays a number."""
    return typed_options(
        {k: str(v) if isinstance(v, CliValue) and v.strip() in ("0", "1") else v for k, v in options.items()}
    )
