"""A probe's options, declared once: one dataclass per probe, each field's help, flag, range and choices in its
``metadata`` (TRL's ``field(metadata={"help": ...})`` style). The binder turns it into

  * the ``mechopd probe NAME`` flags (`add_flags`): ``--<name-with-dashes>`` (or ``metadata["flag"]``), the field's
    name as ``dest``; ``bool`` -> ``store_true``, ``int`` / ``float`` -> typed, ``list[...]`` -> ``nargs="+"``;
  * the defaults of the probe's Python function (``run_x(..., n_boot: int = XOptions.n_boot)``: a field's default is
    its class attribute), and of `ProbeSpec.options` (`defaults`);
  * the checks (`check`: ``range`` = (lo, hi) inclusive, None = open; ``choices``), one-line `ConfigError`s;
  * the docs table (`docs_rows`, docs/probes.md, written by ``python -m mechopd.probes.docs``).

    @dataclass(frozen=True)
    class ToyOptions:
        models: list[Role] | None = option(None, "models to compare", metavar="LABEL|NAME=DIR")
        n_boot: int = option(1000, "bootstrap resamples", flag="--n-boot", range=(0, None))

Role: a label of the study's runs (``base``, ``opd``, ``nca``, ...) or a checkpoint dir; the demo maps the roles in
``ProbeSpec.role_options`` to the study's run names.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from mechopd.core.errors import ConfigError

Role = typing.NewType("Role", str)  # a label of the study's runs (base, opd, nca, ...) or a checkpoint dir
MODEL_HELP = "a label of the run (base, teacher, opd, ...) or a checkpoint dir"
MODELS_METAVAR = "LABEL|NAME=DIR"


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    metavar: str | None = None,
    range: tuple[float | None, float | None] | None = None,  # noqa: A002  (the metadata key)
    choices: tuple[Any, ...] | None = None,
) -> Any:
    """A dataclass field with its CLI facts in ``metadata`` (``flag``: the CLI spelling when it is not the name)."""
    meta = {"help": help, "flag": flag, "metavar": metavar, "range": range, "choices": choices}
    return dataclasses.field(default=default, metadata={k: v for k, v in meta.items() if v is not None})


def _fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    if not dataclasses.is_dataclass(cls):
        raise ConfigError(f"probe options {cls!r} must be a dataclass (see mechopd.probes.options)")
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _bare(hint: Any) -> Any:
    """The hint without ``| None``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return hint


def _kind(hint: Any) -> Any:
    """``int``, ``float``, ``str``, ``bool``, ``Role`` or ``list`` (for ``list[...]``)."""
    hint = _bare(hint)
    return list if typing.get_origin(hint) in (list, tuple) else hint


def type_name(hint: Any) -> str:
    """The docs' name of a field's type: ``int``, ``Role``, ``list[Role]``, ``flag`` (a bool)."""
    hint = _bare(hint)
    if hint is bool:
        return "flag"
    if typing.get_origin(hint) in (list, tuple):
        return f"list[{', '.join(type_name(a) for a in typing.get_args(hint) if a is not Ellipsis)}]"
    return getattr(hint, "__name__", str(hint))


def argparse_kwargs(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """The ``add_argument`` keywords of one field (dest = the field's name)."""
    kind = _kind(hint)
    kw: dict[str, Any] = {"dest": f.name}
    if kind is bool:
        return {**kw, "action": "store_true", "help": f.metadata["help"]}
    kw["default"] = f.default
    if kind is list:
        kw["nargs"] = "+"
    elif kind in (int, float):
        kw["type"] = kind
    if "metavar" in f.metadata:
        kw["metavar"] = f.metadata["metavar"]
    kw["help"] = f.metadata["help"]
    return kw


def add_flags(parser: argparse.ArgumentParser, cls: type | None) -> None:
    """One flag per field of ``cls`` (none when ``cls`` is None)."""
    for f, hint in _fields(cls) if cls is not None else []:
        parser.add_argument(flag_of(f), **argparse_kwargs(f, hint))


def defaults(cls: type | None) -> dict[str, Any]:
    """Field name -> default (a fresh copy of list defaults)."""
    return {
        f.name: (
            list(f.default) if isinstance(f.default, (list, tuple)) and not isinstance(f.default, str) else f.default
        )
        for f, _ in (_fields(cls) if cls is not None else [])
    }


def check(probe: str, cls: type | None, values: dict[str, Any]) -> None:
    """``range`` and ``choices`` of every field; a value out of them raises one line naming the flag and the fix."""
    for f, _ in _fields(cls) if cls is not None else []:
        value, flag = values.get(f.name), flag_of(f)
        if value is None or isinstance(value, bool):
            continue
        lo, hi = f.metadata.get("range", (None, None))
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bound = " and ".join(t for t in (lo is not None and f">= {lo}", hi is not None and f"<= {hi}") if t)
            raise ConfigError(f"probe {probe}: {flag} {value} is out of range; pass a value {bound}")
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"probe {probe}: {flag} {value!r} is unknown; choose one of {', '.join(choices)}")


def docs_rows(cls: type | None) -> list[str]:
    """Markdown rows ``| flag | type | default | help |`` of ``cls`` (docs/probes.md)."""
    rows = []
    for f, hint in _fields(cls) if cls is not None else []:
        kind, typ = _kind(hint), type_name(hint)
        extra = []
        if "range" in f.metadata:
            lo, hi = f.metadata["range"]
            extra.append(f"range [{'' if lo is None else lo}, {'' if hi is None else hi}]")
        if "choices" in f.metadata:
            extra.append("one of " + ", ".join(map(str, f.metadata["choices"])))
        help_text = f.metadata["help"].replace("|", "\\|") + (f" ({'; '.join(extra)})" if extra else "")
        default = "" if kind is bool else f"`{f.default!r}`".replace("|", "\\|")
        rows.append(f"| `{flag_of(f)}` | {typ} | {default} | {help_text} |")
    return rows


# -- value parsers shared by the probes' run adapters (the flags stay text, as typed on the command line) ------------
def int_list(text: str | None, flag: str = "--layers") -> list[int] | None:
    """``"0,1,2"`` -> [0, 1, 2]; None stays None."""
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r} must be comma-separated integers, e.g. {flag} 0,1,2") from None


def site_list(text: str | None, flag: str) -> list[Any] | None:
    """``"0,1,final_norm"`` -> [0, 1, "final_norm"] (integers as ints); None stays None."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ConfigError(f"{flag} {text!r} names nothing; e.g. {flag} 0,1,final_norm")
    return [int(t) if t.lstrip("-").isdigit() else t for t in items]


def pair(text: str | None, flag: str) -> tuple[str, str] | None:
    """``"opd,nca"`` -> ("opd", "nca"): two different items; None stays None."""
    if text is None:
        return None
    parts = tuple(t.strip() for t in text.split(","))
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{flag} {text!r} must name two items, e.g. {flag} opd,nca")
    if parts[0] == parts[1]:  # a term against itself is cos 1.0 by construction, not a measurement
        raise ConfigError(f"{flag} {text!r} names {parts[0]!r} twice; name two different items, e.g. {flag} opd,nca")
    return (parts[0], parts[1])


def cross(text: str | None) -> tuple[str, str] | None:
    """``--cross DONOR,RECIPIENT``: two different model names."""
    parts = site_list(text, "--cross")
    if parts is not None and (len(parts) != 2 or not all(isinstance(p, str) for p in parts)):
        raise ConfigError(f"--cross {text!r} must name two models, donor then recipient, e.g. --cross nca,opd")
    if parts is not None and parts[0] == parts[1]:
        raise ConfigError(
            f"--cross {text!r} names one model twice; cross-model patching needs two different models, "
            "donor then recipient, e.g. --cross nca,opd"
        )
    return None if parts is None else (parts[0], parts[1])


# -- fields several probes share (one declaration each; a call gives a fresh field) ----------------------------------
def models_option(help: str = "models to compare (default: every model of the run but the teacher)") -> Any:  # noqa: A002
    return option(None, help, metavar=MODELS_METAVAR)


def greedy_option() -> Any:
    return option(False, "argmax responses instead of sampled ones")


def detail_option(default: int = 16) -> Any:
    return option(
        default,
        f"items whose per-token values are kept for `mechopd explore` (default {default})",
        flag="--detail-items",
        metavar="N",
        range=(0, None),
    )


def cache_option() -> Any:
    return option(
        None,
        "an activation store written by `mechopd probe cache`: its items, responses and activations "
        "instead of forwards (same numbers)",
        metavar="DIR",
    )
