"""The probe protocol and registry: a new probe is one file plus one `register_probe` call.

A registration (`ProbeSpec`) says everything the rest of mechopd needs, and nothing else lists probes:
  * ``mechopd probe <name>``: the verb, its help, its own flags (``options``: a dataclass whose fields carry their
    help, flag, range and choices, `mechopd.probes.options`; the setup flags -- --run, --task, --option, --placement,
    --no-context-system, --chat-template-kwarg, --n, ... -- are `ProbeSetup`'s fields, generated alike, on every verb;
    the verb itself is `mechopd.cli.probe_cmd`);
  * the run function ``run(setup: ProbeSetup, out_dir: Path, opts: XOptions) -> list[str]`` (writes the artifacts,
    returns the lines the CLI prints); `ProbeSpec` builds ``opts`` from the dataclass's defaults and the given values
    (`ProbeSpec.options_of`), so ``get_probe(name)(setup, out_dir, **values)`` is the keyword form of every probe;
  * its place in ``mechopd demo``: ``demo`` = the options it runs with there, None = not in the demo; the options
    named in ``role_options`` hold ROLES of the study (``base``, ``opd``, ``nca``, ...: `mechopd.runset`), which the
    demo turns into the study's run names; the demo skips it when ``outputs[0]`` exists (which probes run on the
    first seed only is the study's ``first_seed_only``); ``checkpoint``: which saved step of a study run its role
    options read, ``checkpoint(train_dir) -> (checkpoint_dir, why)`` (None: the run's final checkpoint; the choice is
    recorded in ``RUN/<name>_checkpoint.json``);
  * ``reads_teacher``: a forward-only probe whose role options may name the study's ``teacher`` (no run of the study;
    a cross-model teacher of another depth or width too, of the student's tokenizer): similarity, lens;
  * ``order``: its place in the listings (CLI, report, figures); the built-ins 10, 20, ...; default after them;
  * its typed result ``summary``: a class with ``load(probes_dir) -> instance | None`` and ``lines() -> list[str]``
    (an `mechopd.core.artifacts.Summary` subclass, defined in the probe's module): `ProbeSpec.load` is what the report,
    the claims and the figures read (`probe_result`);
  * (its figures register themselves in their plot modules: `mechopd.plots.registry`, group "probe");
  * its report lines ``report(probes_dir) -> list[str]`` (markdown bullets), read by `mechopd.report`; default: the
    summary's ``lines()``.

A probe registers itself at the end of its own module (``register_probe(ProbeSpec(..., options=XOptions))``). The
registry imports no probe module by name: the first `probes` / `get_probe` call imports every module of the
``mechopd.probes`` package (`_discover`), then the ``mechopd.probes`` entry points; a probe module calls the registry
only in that last statement, so no import cycle arises. Callables may be given as ``"module:attribute"`` strings
(imported when first called).
Third-party probes: register in your module and expose it under the ``mechopd.probes`` entry-point group (or import
it before calling mechopd).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mechopd.core.artifacts import FileSet
from mechopd.core.errors import ConfigError
from mechopd.core.options import field_facts
from mechopd.probes.options import check, defaults, facts_of, flags

if TYPE_CHECKING:
    from mechopd.core.artifacts import Summary

Ref = Callable[..., Any] | str
ENTRY_POINT_GROUP = "mechopd.probes"


def resolve(ref: Ref) -> Callable[..., Any]:
    """A callable, or ``"package.module:name"`` imported now."""
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class ProbeSpec:
    """A probe's registration (see the module docstring)."""

    name: str
    help: str
    run: Ref
    options: type | None = None
    outputs: tuple[str, ...] = ()
    demo: dict[str, Any] | None = None
    report: Ref | None = None
    summary: Ref | None = None
    role_options: tuple[str, ...] = ()
    order: float = 1000.0
    checkpoint: Ref | None = None
    reads_teacher: bool = False

    def values(self, **given: Any) -> dict[str, Any]:
        """The probe's options by name, as given: the dataclass's defaults, then ``given`` (unknown keys refused, naming
        the known ones; ranges, choices and the dataclass's own checks run: `options_of`)."""
        self.options_of(**given)
        return {**defaults(self.options), **given}

    def options_of(self, **given: Any) -> Any:
        """The options instance the run function takes: the dataclass's defaults, then ``given`` (unknown keys
        refused, naming the known ones; ranges and choices checked, then the dataclass's own ``__post_init__``: a
        list's syntax, a name's spelling, before any model loads). None for a probe without options."""
        known = defaults(self.options)
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ConfigError(
                f"probe {self.name}: unknown option(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(known)) or 'none'}"
            )
        out = {**known, **given}
        check(self.name, self.options, out)
        return None if self.options is None else self.options(**out)

    def __call__(self, setup: Any, out_dir: str | Path, **options: Any) -> list[str]:
        """Run the probe on ``setup`` into ``out_dir`` with the options ``options`` names (`options_of`): ``run(setup,
        dir, opts)``; returns the lines to print. Its files land as one set (`artifacts.FileSet`, named after the
        probe): all of them or none."""
        opts = self.options_of(**options)
        with FileSet(out_dir, self.name) as stage:
            lines = list(resolve(self.run)(setup, stage.dir, opts))
        return stage.relocate(lines)

    def load(self, probes_dir: str | Path) -> Any:
        """The probe's typed result in ``probes_dir`` (its ``summary`` class), None when it did not run there."""
        if self.summary is None:
            return None
        summary = cast("type[Summary]", resolve(self.summary))  # ``summary`` names a core.artifacts.Summary class
        return summary.load(Path(probes_dir))

    def report_lines(self, probes_dir: str | Path) -> list[str]:
        if self.report is not None:
            return list(resolve(self.report)(Path(probes_dir)))
        result = self.load(probes_dir)
        return list(result.lines()) if result is not None else []

    def demo_options(self, study: Any) -> dict[str, Any] | None:
        """``demo`` with every role in ``role_options`` replaced by the study's run name (`demo_options`)."""
        return demo_options(self, study)


_REGISTRY: dict[str, ProbeSpec] = {}
_loaded = False
VERB_FLAGS = ("-h", "--help", "--out", "--force")  # `mechopd probe NAME`'s own flags besides the setup's


def _setup_class() -> type:
    from mechopd.probes.setup import ProbeSetup  # (function-local: setup imports the probes' shared modules)

    return ProbeSetup


def register_probe(spec: ProbeSpec, *, replace: bool = False) -> ProbeSpec:
    """Add a probe to `mechopd probe`, the demo, the figures and the report. A taken name raises unless ``replace``."""
    if not replace and spec.name in _REGISTRY and _REGISTRY[spec.name] != spec:
        raise ConfigError(f"probe {spec.name!r} is already registered; pick another name or pass replace=True")
    setup = _setup_class()
    taken = {*VERB_FLAGS, *flags(setup), *(f.name for f in field_facts(setup)), "out", "force", "probe"}  # + dests
    own = [name for f in facts_of(spec.options) for name in (f.flag, f.name)]  # its flags and their dests
    clash = next((f for i, f in enumerate(own) if f in taken or f in own[:i]), None)
    if clash is not None:
        raise ConfigError(
            f"probe {spec.name!r}: flag {clash} is a setup flag every probe has (or is "
            "given twice); read it from the setup instead, or rename it"
        )
    _REGISTRY[spec.name] = spec
    return spec


def unregister_probe(name: str) -> None:
    _REGISTRY.pop(name, None)


def _discover() -> None:
    """Import every module of the ``mechopd.probes`` package once (each built-in probe registers itself at the end of
    its module), then the entry points of ``ENTRY_POINT_GROUP``."""
    global _loaded
    if _loaded:
        return
    _loaded = True

    package = __name__.rpartition(".")[0]  # mechopd.probes, by its directory (no import of the package here)
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        importlib.import_module(f"{package}.{info.name}")

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()


def probes() -> list[ProbeSpec]:
    """Every registered probe, by ``order`` (the built-ins first), then registration order."""
    _discover()
    return sorted(_REGISTRY.values(), key=lambda spec: spec.order)


def get_probe(name: str) -> ProbeSpec:
    _discover()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown probe {name!r}; known probes: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


COMPARE_OPTIONS = ("pair", "cross")  # role options naming two of the compared ``models`` (deltas, patching)


def study_options(spec: Any, own: dict[str, Any]) -> dict[str, Any]:
    """A study's options for a listed probe: its own over the registration's ``demo`` role options, except that
    ``models`` (the models to compare, declared default None: "every model of the run") left out by the study is left
    out here too, so ``similarity: {}`` reads every run of the study, as the flag's help says, not the demo's three
    roles; a study's own ``models`` drops the demo's ``pair`` / ``cross`` unless both of its models are listed
    (``deltas: {models: [trl, opd]}`` compares the first two, not the demo's opd, nca). The single-role options (``model: opd``, ``trained: ta_opd``, ``pair``, ``cross``, ``donor``) keep the
    demo's. Every other option the study leaves out takes its documented default (its `mechopd probe NAME` flag's):
    ``deltas: {}`` runs no SVD (the demo's ``svd: true``), as ``mechopd probe deltas`` without ``--svd`` does."""
    roles = getattr(spec, "role_options", ())
    demo = {k: v for k, v in (spec.demo or {}).items() if k in roles}
    declared = defaults(spec.options) if getattr(spec, "options", None) is not None else {}
    if "models" in roles and "models" not in own and declared.get("models", 0) is None:
        demo.pop("models", None)
    if own.get("models"):  # the demo's comparison of two of ITS models does not apply to the study's own list
        for key in COMPARE_OPTIONS:
            named = demo.get(key)
            if isinstance(named, str) and not set(named.split(",")) <= set(own["models"]):
                demo.pop(key)
    return {**demo, **own}


def demo_options(spec: Any, study: Any) -> dict[str, Any] | None:
    """A registration's ``demo`` options with every role in its ``role_options`` replaced by the study's run name;
    None when the probe is not in the demo or a role it needs is not in the study. (Any object with ``demo`` and,
    optionally, ``role_options`` will do.)"""
    if spec.demo is None:
        return None
    out = dict(spec.demo)
    for key in getattr(spec, "role_options", ()):
        value = out.get(key)
        if value is None:
            continue
        many = isinstance(value, (list, tuple))
        roles = list(value) if many else [r.strip() for r in str(value).split(",")]
        names = [study.name(r) for r in roles]
        if None in names:
            return None
        out[key] = names if many else ",".join(names)
    return out


def probe_result(name: str, probes_dir: str | Path) -> Any:
    """The typed result (``ProbeSpec.summary``) of the probe ``name`` in ``probes_dir``: what the report, the claims
    and the figures read; None when the probe did not run there or is not registered (it cannot have run)."""
    spec = next((p for p in probes() if p.name == name), None)
    return None if spec is None else spec.load(probes_dir)


def report_lines(probes_dir: str | Path) -> list[str]:
    """Every registered probe's report lines for the artifacts in ``probes_dir`` (probes that did not run: none)."""
    return [line for spec in probes() for line in spec.report_lines(probes_dir)]
