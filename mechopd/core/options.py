"""Options declared once: a config field carries its help, range and choices as dataclass field metadata, and ONE
binder reads YAML, ``--set KEY=VALUE`` and flags into those dataclasses, checks the values, generates the CLI flags
and the docs tables (TRL's ``field(metadata={"help": ...})``; `mechopd.config.TrainConfig`, `EvalConfig`, a probe's
options dataclass and `mechopd.probes.setup.ProbeSetup` are built from them).

* ``option(default, help, range=..., choices=..., short=..., flag=..., metavar=...)`` is a ``dataclasses.field``
  whose metadata holds the facts; `field_facts(cls)` reads them back. ``range`` is the one range language,
  `Range` (below), with ``GE0``, ``GT0``, ``GE1``, ``UNIT``; the seed and temperature rules every verb shares
  (`check_seed`, `check_temperature`: train, eval, the probes, pretraining and task options) read it too.
* `coerce` turns a YAML value or a command-line `CliValue` into the field's declared type, read from the type hint's
  structure (``typing.get_origin`` / ``get_args``), never from its text: text fields keep command-line text as typed,
  numbers and booleans are parsed once, mappings read ``KEY: VALUE`` pairs.
* `check_value` refuses a value outside the field's range or choices with one line naming the field.
* `bind(cls, data, sets, flags)`: a file's keys, then the flags, then ``--set`` (the last one wins), coerced and
  checked, into ``cls``.
* `add_flags`, the one flag generator: one ``--kebab-name VALUE`` flag per field, help from `flag_help`; text mode
  (train, eval: read back by `flag_values`, bound by `bind`) or ``typed`` (``mechopd probe``: parsed by argparse).
* `docs_table` / `docs_row`, the one docs writer: docs/config.md's tables and docs/probes.md's, the range and choices
  in `limits`' words (what ``--help`` shows too).
* Choices a package above the config extends (a loss-term set, a selector) come from a registry: ``option(...,
  registry="selector")``. The registry lives here, a name -> live-names lookup (`register_registry`) that the package
  owning it fills when it is imported; `check_value` and `limits` (``--help``, the docs) read its live names. The
  loaders `mechopd/__init__.py` hands over (`add_registry_loader`) import those packages on the first read, so no
  check runs against an unfilled registry and the config imports nothing above itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import MISSING, dataclass
from typing import Any, Union

import yaml

from mechopd.core.config_parse import CliValue, StrictLoader, merge, scalar, template_options, text_value, typed_options
from mechopd.core.errors import ConfigError


# ------------------------------------------------------------------------- the one range language
@dataclass(frozen=True)
class Range:
    """``lo`` (inclusive unless ``open_lo``) up to ``hi`` (inclusive); None = unbounded on that side."""

    lo: float | None
    hi: float | None = None
    open_lo: bool = False

    def text(self) -> str:
        hi = f"{self.hi:g}" if isinstance(self.hi, float) else f"{self.hi}"  # 1.0 -> 1; an integer bound as written
        if self.lo is None:
            return f"<= {hi}"
        return f"{'>' if self.open_lo else '>='} {self.lo:g}" + (f" and <= {hi}" if self.hi is not None else "")

    def holds(self, value: float) -> bool:
        low = self.lo is None or (value > self.lo if self.open_lo else value >= self.lo)
        return low and (self.hi is None or value <= self.hi)


SEED_MAX = 2**63 - 1  # every verb's seed: 0..SEED_MAX (torch, numpy and random all take it)
# A sampling temperature below this is refused in every verb (train, eval, probes, task options): logits / T
# overflows float32 long before T reaches 0; omit the temperature for greedy decoding (eval, probes) instead.
MIN_TEMPERATURE = 1e-4
SEED_RANGE = Range(0, SEED_MAX)
TEMPERATURE_RANGE = Range(MIN_TEMPERATURE)
PLACEMENTS = ("system", "user")  # where a context goes: the system message or spliced before the user turn


def in_range(name: str, value: Any, rng: Range, integer: bool = False, optional: bool = False, who: str = "") -> None:
    """Refuse a value outside ``rng`` (numbers: finite; ``integer``: an int), naming the field (``NAME=VALUE``, or
    ``who`` when given) and the range: the one range check (`check_value` calls it)."""
    if value is None and optional:
        return
    bad_type = isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float))
    if bad_type or not math.isfinite(value) or not rng.holds(value):
        kind = "an integer" if integer else "a finite number"
        raise ConfigError(
            f"{who or f'{name}={value!r}'} is invalid: it must be {kind} {rng.text()}{' (or null)' if optional else ''}"
        )


def check_seed(value: Any, flag: str = "seed") -> int:
    """The one seed rule of every verb: an integer 0..SEED_MAX."""
    in_range(flag, value, SEED_RANGE, integer=True)
    return value


def check_temperature(value: Any, flag: str = "temperature", optional: bool = True) -> Any:
    """The one temperature rule of every verb: finite and >= MIN_TEMPERATURE (None = the default, where allowed)."""
    in_range(flag, value, TEMPERATURE_RANGE, optional=optional)
    return value


META = "mechopd"  # the metadata key under which `option` keeps a field's facts


GE0, GT0, GE1, UNIT = Range(0), Range(0, open_lo=True), Range(1), Range(0, 1)


@dataclass(frozen=True)
class Facts:
    """One configurable field: its name (= YAML key = ``--set`` key), type hint, default, help, range, choices,
    ``short`` (listed in the short help), ``onoff`` (a text field that also takes YAML 1.1's bare on/off booleans),
    ``flag`` (its command-line spelling; default ``--kebab-name``), ``metavar`` (its value's name in ``--help``),
    ``registry`` (its choices: the live names of that registry, `registry_names`); a typed flag's shape: ``switch`` (a
    bool flag that takes no value), ``repeat`` (a list flag given once per item); a ``flag`` without dashes is a
    positional argument (a list: one or more values; a None default: optional)."""

    name: str
    hint: Any
    default: Any
    help: str
    range: Range | None = None
    choices: tuple[str, ...] | None = None
    short: bool = False
    onoff: bool = False
    section: str = ""
    flag: str = ""
    metavar: str | None = None
    registry: str = ""
    switch: bool = False
    repeat: bool = False

    def __post_init__(self) -> None:
        if not self.flag:
            object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))


def option(
    default: Any = MISSING,
    help: str = "",
    *,
    range: Range | None = None,
    choices: tuple[str, ...] | None = None,
    short: bool = False,
    onoff: bool = False,
    default_factory: Any = MISSING,
    flag: str = "",
    metavar: str | None = None,
    registry: str = "",
    switch: bool = False,
    repeat: bool = False,
) -> Any:
    """A dataclass field carrying its facts (`Facts`): ``option(default, help, range=GE0, ...)`` (``help`` is
    required; ``range`` a `Range`: ``GE0``, ``GE1``, ``GT0``, ``UNIT`` or ``Range(lo, hi)``); ``default_factory`` for a
    mutable default; ``flag`` / ``metavar``: a command-line spelling other than ``--kebab-name`` and its value's name;
    ``registry``: the name of the registry whose live names are the choices (`register_registry`); ``switch`` /
    ``repeat``: a typed flag's shape (`Facts`); no default: a required argument."""
    if not help:
        raise TypeError("option(...) needs its help: option(default, help, ...)")
    facts = {"help": help, "range": range, "choices": choices, "short": short, "onoff": onoff}
    facts |= {"registry": registry} if registry else {}
    facts |= {"switch": switch} if switch else {}
    facts |= {"repeat": repeat} if repeat else {}
    meta = {META: {**facts, **({"flag": flag} if flag else {}), **({"metavar": metavar} if metavar else {})}}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def option_of(cls: type, name: str) -> Any:
    """A field declared as ``cls``'s field ``name`` is (its default and facts: help, range, ...): the one declaration
    shared by another dataclass (`DemoConfig.workers` is `PoolOptions.workers`)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if f.default_factory is not MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata=f.metadata)
    return dataclasses.field(default=f.default, metadata=f.metadata)


def field_facts(cls: type) -> list[Facts]:
    """Every field of ``cls`` declared with `option`, in field order; ``section``: the dataclass that declares it."""
    hints = typing.get_type_hints(cls)
    owner: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        for name in getattr(base, "__annotations__", {}):
            owner.setdefault(name, base.__name__)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(META)
        if meta is None:
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        out.append(Facts(f.name, hints[f.name], default, section=owner.get(f.name, cls.__name__), **meta))
    return out


def _parts(hint: Any) -> tuple[Any, bool]:
    """``(the type without None, whether None is allowed)`` of a hint such as ``float | None``."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        union = args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007 (a union built at run time)
        return union, len(args) < len(typing.get_args(hint))
    return hint, False


def coerce(facts: Facts, value: Any, source: str) -> Any:
    """A YAML or command-line value as the field's declared type (one reading, by the hint's structure)."""
    base, optional = _parts(facts.hint)
    origin, name = typing.get_origin(base) or base, facts.name
    if value is None or (isinstance(value, CliValue) and value in ("null", "~") and optional):
        if optional:
            return None
        raise ConfigError(f"{source}: {name} must not be null")
    if base is str:
        if isinstance(value, bool) and facts.onoff:
            return value  # YAML 1.1's bare off/on; the field reads it (`TrainConfig.__post_init__`)
        return text_value(value, name, optional, source)
    if isinstance(value, CliValue) and origin is not dict:
        value = scalar(value)
    if name == "chat_template_kwargs" and isinstance(value, dict):
        value = template_options(
            value
        )  # --set chat_template_kwargs.enable_thinking=0: a flag, as on --chat-template-kwarg
    try:
        return _typed(base, origin, value)
    except (TypeError, ValueError, OverflowError, yaml.YAMLError, RecursionError):
        if origin is dict:
            value = scalar(value) if isinstance(value, CliValue) else value  # as read: task_options=5, not '5'
            raise ConfigError(
                f"{source}: {name}={value!r} is not a mapping; pass KEY: VALUE pairs (--set {name}.KEY=VALUE)"
            ) from None
        raise ConfigError(f"{source}: {name}={value!r} is not a valid {getattr(base, '__name__', base)}") from None


def _typed(base: Any, origin: Any, value: Any) -> Any:
    if base is float:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    if base is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        return int(value)
    if base is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        if not isinstance(value, bool):
            raise ValueError
        return value
    if origin is dict:
        if isinstance(value, CliValue):
            value = yaml.load(value, Loader=StrictLoader) if value.strip() else {}  # noqa: S506
        if not isinstance(value, dict):
            raise ValueError
        return typed_options(value)
    return value  # lists and untyped values: checked by the dataclass (`__post_init__`)


def check_value(facts: Facts, value: Any, subject: str = "") -> None:
    """The field's range (numbers: finite, in range; None where the hint allows) and choices; one line naming it:
    ``NAME=VALUE`` or, given, ``subject`` (a probe's ``probe NAME: --flag VALUE``)."""
    base, optional = _parts(facts.hint)
    if value is None and optional:
        return
    who = subject or f"{facts.name}={value!r}"
    if base is str and not isinstance(value, str) and not (facts.onoff and isinstance(value, bool)):
        raise ConfigError(f"{who} is not text; pass a string (quote it in YAML)")
    if base is bool and not isinstance(value, bool):
        raise ConfigError(f"{who} is invalid: use true or false")
    if typing.get_origin(base) is dict and not isinstance(value, dict):
        raise ConfigError(f"{who} is not a mapping; pass key: value pairs (--set {facts.name}.KEY=VALUE)")
    allowed = allowed_choices(facts)
    if allowed is not None and isinstance(value, str) and value not in allowed:
        note = _NOTES[facts.registry](value) if facts.registry in _NOTES else ""
        raise ConfigError(f"{who} is unknown; choose one of {', '.join(allowed)}{note}")
    if facts.range is not None:
        in_range(facts.name, value, facts.range, integer=base is int, optional=optional, who=who)


def check_fields(obj: Any, facts: list[Facts] | None = None) -> None:
    """`check_value` on every declared field of a dataclass instance (its ``__post_init__`` calls this)."""
    for f in facts if facts is not None else field_facts(type(obj)):
        check_value(f, getattr(obj, f.name))


def bind(
    cls: type,
    data: dict[str, Any] | None = None,
    sets: dict[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
    source: str = "config",
    fixed: dict[str, Any] | None = None,
    also: tuple[str, ...] = (),
) -> Any:
    """``cls`` from a file's keys, then flags, then ``--set`` (later wins): unknown keys refused, naming the known
    ones; every value coerced by its field's type (`coerce`), then checked by the dataclass (its ``__post_init__``).
    ``fixed``: keyword values passed as they are (already typed; not keys); ``also``: further keys the caller reads
    (named in the message)."""
    merged = merge(merge(dict(data or {}), flags or {}), sets or {})
    facts = {f.name: f for f in _all_facts(cls) if f.name not in (fixed or {})}
    unknown = sorted(set(merged) - set(facts))
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted({*facts, *also}))}"
        )
    return cls(**{k: coerce(facts[k], v, source) for k, v in merged.items()}, **(fixed or {}))


def _all_facts(cls: type) -> list[Facts]:
    """`field_facts`, plus a bare entry (no help) for a field declared without `option`, but those whose metadata
    says ``bound: False`` (not a key: `TrainConfig.plugins`)."""
    declared = {f.name: f for f in field_facts(cls)}
    hints = typing.get_type_hints(cls)
    return [
        declared.get(f.name) or Facts(f.name, hints[f.name], f.default, "")
        for f in dataclasses.fields(cls)
        if f.metadata.get("bound", True)
    ]


# ------------------------------------------------------------------------- choices from registries
_REGISTRIES: dict[str, Callable[[], Mapping[str, Any]]] = {}  # name -> its live lookup (name -> entry)
_NOTES: dict[str, Callable[[str], str]] = {}  # name -> the words added to the refusal of an unknown name
_LOADERS: list[Callable[[], None]] = []  # import the packages that fill the registries (`mechopd/__init__.py`)


def register_registry(
    name: str, lookup: Callable[[], Mapping[str, Any]], note: Callable[[str], str] | None = None
) -> None:
    """The package that owns the registry ``name`` hands over its live lookup (called at each read: a name
    registered later is seen) and, optionally, ``note(value)``: words added to the refusal of an unknown value."""
    _REGISTRIES[name] = lookup
    if note is not None:
        _NOTES[name] = note


def add_registry_loader(load: Callable[[], None]) -> None:
    """``load()`` imports the packages that fill the registries; run on the first read of one not yet filled."""
    _LOADERS.append(load)


def registry(name: str) -> Mapping[str, Any]:
    """The live contents of the registry ``name`` (name -> entry), its packages imported first if need be."""
    if name not in _REGISTRIES:
        for load in _LOADERS:
            load()
    if name not in _REGISTRIES:
        raise LookupError(f"no registry {name!r} is filled: import the package that registers it (register_registry)")
    return _REGISTRIES[name]()


def registry_names(name: str) -> tuple[str, ...]:
    """The names the registry ``name`` holds now, in registration order."""
    return tuple(registry(name))


def allowed_choices(facts: Facts) -> tuple[str, ...] | None:
    """A field's choices: its static ones, or its registry's live names (None: any value)."""
    return facts.choices if facts.choices is not None or not facts.registry else registry_names(facts.registry)


PLUGINS: dict[type, str] = {}  # plug-in options dataclasses, in registration order -> who registered them


def register_options(cls: type, owner: str) -> None:
    """Make a plug-in's options dataclass (a loss term's, a selector's) bindable: its fields become config keys and
    flags (`plugin_facts`, which refuses a key that another class or `TrainConfig` already declares)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{owner}: options must be a dataclass, got {cls!r}")
    PLUGINS[cls] = owner


def unregister_options(cls: type) -> None:
    PLUGINS.pop(cls, None)


def plugin_facts(host: type) -> list[Facts]:
    """The facts of every registered options class that is not a section of ``host`` (its fields are ``host``'s)."""
    out: list[Facts] = []
    taken = {f.name for f in dataclasses.fields(host)}
    for cls, owner in PLUGINS.items():
        if cls in host.__mro__:
            continue
        for f in field_facts(cls):
            if f.name in taken:
                raise ConfigError(f"{owner}: option {f.name!r} is already a config key; rename it")
            taken.add(f.name)
            out.append(f)
    return out


def add_flags(
    parser: argparse.ArgumentParser,
    facts: list[Facts],
    *,
    typed: bool = False,
    taken: Set[str] = frozenset(),
    sets: bool = True,
) -> None:
    """One flag per field: ``f.flag`` (``--kebab-name``), its help with default, range and choices (`flag_help`),
    default None (a flag left out is told from one given), a bool's value optional (``--x`` = true, ``--x false``).
    The one difference is when the value is read:

    * text (``typed=False``: train, eval): the flag's value stays text (`CliValue`, dest ``opt_NAME``) and is read
      once, with the file's keys and ``--set``, by `bind` (`flag_values` -> `coerce`); a mapping has no flag (``--set
      NAME.KEY=VALUE``); ``sets``: the verb takes ``--set`` too (the help says so).
    * typed (``typed=True``: ``mechopd probe``, no file or ``--set`` beneath the flags): the value is parsed here,
      dest the field's name: ``int`` / ``float`` / ``bool`` typed, ``list[...]`` -> ``nargs="+"``, a mapping -> a
      repeated ``KEY=VALUE`` flag, ``Sequence[...]`` one comma-separated text value (its dataclass parses it).

    ``taken``: flags the verb already has (skipped)."""
    for f in facts:
        base, _ = _parts(f.hint)
        mapping = typing.get_origin(base) is dict
        if (mapping and not typed) or f.flag in taken:
            continue
        kw: dict[str, Any] = {
            "default": None,
            "metavar": f.metavar or ("BOOL" if base is bool else f.name.upper()),
            "help": flag_help(f),
        }
        listed = typing.get_origin(base) in (list, tuple)
        if typed and not f.flag.startswith("-"):  # a positional argument, dest its name
            kw.update(nargs="+" if listed else "?" if f.default is None else None)
            parser.add_argument(f.flag, **{k: v for k, v in kw.items() if v is not None or k == "default"})
            continue
        if typed and f.switch:  # --x, no value
            parser.add_argument(f.flag, dest=f.name, action="store_true", default=None, help=kw["help"])
            continue
        if typed and f.default is MISSING:  # no default: the flag is required
            kw.pop("default")
            kw["required"] = True
        if base is bool:
            kw.update(nargs="?", const=True if typed else CliValue("true"))
        if not typed:
            kw.update(dest=f"opt_{f.name}", type=CliValue)
            kw["help"] += f"; same as --set {f.name}=..." if sets else ""
        elif mapping:
            kw.update(dest=f.name, action="append")
        else:
            kw.update(dest=f.name, type={int: int, float: float, bool: boolean}.get(base))
            if listed:
                kw.update(action="append") if f.repeat else kw.update(nargs="+")
        parser.add_argument(f.flag, **kw)


def boolean(text: str) -> bool:
    """A typed flag's bool (``--x false``): true / false / 1 / 0 / yes / no, as `coerce` reads one."""
    return bool(_typed(bool, bool, text))


def limits(f: Facts) -> str:
    """A field's range and choices in words (``>= 0``, ``a | b``): what ``--help`` and every docs table show."""
    parts = [f.range.text()] if f.range is not None else []
    if choices := allowed_choices(f):
        parts.append(" | ".join(map(str, choices)))
    return "; ".join(parts)


def flag_help(f: Facts) -> str:
    """A field's help with its default (unless the help words its own) and its `limits` (``--help``)."""
    quiet = "default" in f.help or f.switch or f.repeat or f.default is MISSING  # a flag's shape says it
    extra = [] if quiet else [f"default {f.default!r}"]
    extra += [limits(f)] if limits(f) else []
    return (f"{f.help} ({'; '.join(extra)})" if extra else f.help).replace("%", "%%")


def flag_values(args: argparse.Namespace, facts: list[Facts]) -> dict[str, Any]:
    """The flags given on the command line, by field name (values still `CliValue`: `bind` reads them once)."""
    return {f.name: CliValue(v) for f in facts if (v := getattr(args, f"opt_{f.name}", None)) is not None}


DOCS_HEAD = "| key / flag | type | default | range / choices | help |\n|---|---|---|---|---|"


def type_text(hint: Any) -> str:
    """A field's type as the docs name it: ``int``, ``Role``, ``list[str]``, ``dict[str, Any]``; ``str`` for a
    ``Sequence[...]`` (one comma-separated text value, parsed by its dataclass); `` or null`` where None is allowed."""
    base, optional = _parts(hint)
    return _type_name(base) + (" or null" if optional else "")


def _type_name(t: Any) -> str:
    origin = typing.get_origin(t)
    if origin is Sequence:
        return "str"
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(t))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(t) if a is not Ellipsis)}]"
    return getattr(t, "__name__", str(t))


def docs_row(f: Facts, typed: bool = False) -> str:
    """One Markdown row (`DOCS_HEAD`): key and flag, type, default, range or choices (`limits`, ``--help``'s words),
    help. ``typed``: `add_flags`'s mode (a mapping is then a repeated ``--flag KEY=VALUE``, else ``--set``)."""
    base, _ = _parts(f.hint)
    if typing.get_origin(base) is dict and not typed:
        flag = f"`--set {f.name}.KEY=VALUE`"
    else:
        flag = f"`{f.flag}`"
    commas = typing.get_origin(base) is Sequence and isinstance(f.default, (list, tuple))
    shown = ",".join(map(str, f.default)) if commas else f.default  # a comma-separated default as typed
    cells = [f"`{f.name}` {flag}", type_text(f.hint), f"`{shown!r}`", limits(f), f.help]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def docs_table(facts: list[Facts], typed: bool = False, sections: bool = True) -> str:
    """The Markdown table of ``facts`` (`docs_row`), one per section (``## Section`` above it) unless not
    ``sections``: docs/config.md (train, eval) and docs/probes.md (a probe's options, ``typed``)."""
    lines: list[str] = []
    section = None
    for f in facts:
        if not lines or (sections and f.section != section):
            section = f.section
            lines += ["", f"## {section}", ""] if sections else []
            lines += DOCS_HEAD.split("\n")
        lines.append(docs_row(f, typed))
    return "\n".join(lines).lstrip("\n") + "\n"
