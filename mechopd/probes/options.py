"""What is probe-specific about a probe's options; everything else is `mechopd.core.options`, the one format of
every configurable field. A probe declares one frozen dataclass whose fields are `option(default, help, flag=,
metavar=, range=, choices=)` (`mechopd.core.options.option`; ``range=`` a `Range`: ``GE0``, ``GE1``, ``UNIT``, ...). Core
turns it into the ``mechopd probe NAME`` flags (`add_flags`, ``typed=True``; the setup flags of every probe,
`mechopd.probes.setup.ProbeSetup`'s fields, alike), checks it (`check_value`) and writes its docs/probes.md table
(`docs_table`, the rows of docs/config.md; ``python -m mechopd.probes.docs``). This module keeps

  * `Role` (a label of the study's runs, ``base``, ``opd``, ``nca``, ..., or a checkpoint dir; the demo maps the
    roles in ``ProbeSpec.role_options`` to the study's run names) and the fields several probes share
    (`models_option`, `greedy_option`, `detail_option`, `cache_option`);
  * `facts_of` (a field declared without `option` refused), `flags`, `defaults` (the values `ProbeSpec` starts from
    to build the one value a run function takes, ``run_x(setup, out_dir, opts: XOptions)``) and `check` (ranges and
    choices by core's checker, one line ``probe NAME: --flag VALUE ...``);
  * the parsers of the comma-separated fields: a ``Sequence[...]`` field is one text value on the command line
    (``--layers 0,1,2``) that the dataclass's ``__post_init__`` turns into its typed value once (`normalise` with
    `int_list`, `site_list`, `pair`, `cross`), so a run function reads ``opts.layers`` as a list.

    @dataclass(frozen=True)
    class ToyOptions:
        models: list[Role] | None = option(None, "models to compare", metavar="LABEL|NAME=DIR")
        n_boot: int = option(1000, "bootstrap resamples", flag="--n-boot", range=GE0)
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, overload

from mechopd.core.errors import ConfigError
from mechopd.core.options import GE0, Facts, check_value, field_facts, option

Role = typing.NewType("Role", str)  # a label of the study's runs (base, opd, nca, ...) or a checkpoint dir
MODEL_HELP = "a label of the run (base, teacher, opd, ...) or a checkpoint dir"
MODELS_METAVAR = "LABEL|NAME=DIR"


def facts_of(cls: type | None) -> list[Facts]:
    """The facts of every field of ``cls`` (none when ``cls`` is None); a field declared without `option` refused."""
    if cls is None:
        return []
    if not dataclasses.is_dataclass(cls):
        raise ConfigError(f"probe options {cls!r} must be a dataclass (see mechopd.probes.options)")
    facts = field_facts(cls)
    bare = sorted({f.name for f in dataclasses.fields(cls)} - {f.name for f in facts})
    if bare:
        raise ConfigError(
            f"probe options {cls.__name__}: field(s) {', '.join(bare)} carry no help; declare each with "
            "mechopd.core.options.option(default, help)"
        )
    return facts


def flags(cls: type | None) -> list[str]:
    """The command-line spellings of ``cls``'s fields (`add_flags`'s; none when ``cls`` is None)."""
    return [] if cls is None else [f.flag for f in field_facts(cls)]


def normalise(opts: Any, **parsers: Any) -> None:
    """In an options dataclass's ``__post_init__``: each named field given as command-line text (a ``str``) becomes
    ``parsers[name](text, flag)``, once (frozen dataclasses too); a value given already as a sequence (from Python:
    ``layers=[0, 1]``) is read as its comma-joined text, so both pass the same checks and give the same value."""
    flag = {f.name: f.flag for f in facts_of(type(opts))}
    for name, parse in parsers.items():
        value = getattr(opts, name)
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        if isinstance(value, str):
            object.__setattr__(opts, name, parse(value, flag[name]))


def defaults(cls: type | None) -> dict[str, Any]:
    """Field name -> default (a fresh copy of list defaults)."""
    return {
        f.name: (
            list(f.default) if isinstance(f.default, (list, tuple)) and not isinstance(f.default, str) else f.default
        )
        for f in facts_of(cls)
    }


def check(probe: str, cls: type | None, values: dict[str, Any]) -> None:
    """The ``range`` and ``choices`` of every field that declares them, by the one checker
    (`mechopd.core.options.check_value`): one line ``probe NAME: --flag VALUE ...`` naming the fix."""
    for f in facts_of(cls):
        if f.range is not None or f.choices is not None:
            value = values.get(f.name)
            check_value(f, value, subject=f"probe {probe}: {f.flag} {value!r}")


# -- value parsers of the comma-separated fields (`normalise`; the flags stay text, as typed on the command line) -----
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


@overload
def pair(text: str, flag: str) -> tuple[str, str]: ...
@overload
def pair(text: None, flag: str) -> None: ...
@overload
def pair(text: str | None, flag: str) -> tuple[str, str] | None: ...
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


def cross(text: str | None, flag: str = "--cross") -> tuple[str, str] | None:
    """``--cross DONOR,RECIPIENT``: two different model names."""
    parts = site_list(text, flag)
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
        "items whose per-token values are kept for `mechopd explore`",
        flag="--detail-items",
        metavar="N",
        range=GE0,
    )


def cache_option() -> Any:
    return option(
        None,
        "an activation store written by `mechopd probe cache`: its items, responses and activations "
        "instead of forwards (same numbers)",
        metavar="DIR",
    )
