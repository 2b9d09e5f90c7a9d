"""Every option is declared once (issue 43): a default lives in its ``option(...)`` field and nowhere else.

The scanner reads every .py file under ``mechopd/`` (AST, nothing imported but the declarations themselves):

* **Declared options**: every field of a dataclass imported from ``mechopd/`` whose metadata carries option facts
  (`mechopd.core.options.field_facts`): name -> its defaults and the files that declare it.
* **A restatement** is a literal (anything `ast.literal_eval` reads: numbers, strings, bools, None, tuples of them)
  standing in for an option's default under the option's own name, outside its declaration:
    - a function or method parameter named like an option, with a literal default;
    - ``X.get("name", literal)`` and ``getattr(x, "name", literal)``;
    - a class-level field ``name: T = literal`` (or ``= field(default=literal)``) in a class that does not declare
      that option with ``option(...)``.
  Only a declaration the file can read counts (its package at or above the declaring one, and not imported by it:
  `tests/unit/test_layout.py`'s LAYERS and KNOWN_UPWARD): a parameter ``layers=None`` in ``core/`` is not a copy of
  a probe's ``--layers``, which ``core/`` cannot import.
  The None rule: a literal None is a restatement only where the option's declared default is None too (it repeats
  the default); where the declared default is not None, a None parameter means "not given: read the declaration" and
  is not counted. A literal counts when it equals a readable declaration's default (1 == 1.0, False != 0, a tuple ==
  the list of its items): a different literal under the name is another quantity, not a copy.

The fix is to read the declaration (``TrainConfig.beta``: a field's default is its class attribute; ``XOptions.n``)
or to pass the section object (`Selector` takes `SignalOptions`, `models.lora` the config's `LoraOptions`).

The test fails listing each restatement as ``file:line name=value (declared in file)``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import mechopd
from mechopd.core.options import field_facts
from mechopd.tasks.base import TaskOptions
from tests.unit.test_layout import KNOWN_UPWARD, LAYERS

ROOT = Path(mechopd.__file__).resolve().parent
REPO = ROOT.parent

# (file, name) -> why: the "not given" sentinel (None / False) of a public library function that a researcher calls
# directly (docs/probes.md, "From Python"): ``layers=None`` is every site, ``greedy=False`` samples, ``cka=False`` is
# off. The probe's option passes its value explicitly; the library keeps a usable call without one. Only None / False
# go here (the test below checks): a default that is a value reads its declaration.
LIBRARY_SENTINELS = {
    ("mechopd/probes/capture.py", "layers"): "resolve_sites / capture_views: None = every residual site",
    ("mechopd/probes/causal_items.py", "models"): "resolve: None = the run's own models",
    ("mechopd/probes/causal_items.py", "greedy"): "resolve: sampled responses unless asked",
    ("mechopd/probes/delta_sums.py", "pair"): "parameter_deltas: None = no pair comparison",
    ("mechopd/probes/deltas.py", "pair"): "DeltaSummary.pair: None when no pair was compared",
    (
        "mechopd/probes/grad_align.py",
        "layers",
    ): "select_parameters / term_gradients / split_half_cos: None = every layer",
    ("mechopd/probes/interop.py", "layers"): "two_view_cosine_tl / _nnsight: None = every residual site",
    ("mechopd/probes/items.py", "greedy"): "sample_responses / make_batches: sampled unless asked",
    ("mechopd/probes/lens.py", "sites"): "lens(): None = every site",
    ("mechopd/probes/patch_views.py", "window"): "Patch / patching(): None = every response position",
    ("mechopd/probes/patch_views.py", "sites"): "patching(): None = every site",
    ("mechopd/probes/runner.py", "greedy"): "ProbeContext.sample: sampled unless asked",
    ("mechopd/probes/setup.py", "greedy"): "ProbeSetup.items: sampled unless asked",
    ("mechopd/probes/teachability_bank.py", "temperature"): "build_bank: None = the model's sampling temperature 1",
    ("mechopd/probes/teachability_rescore.py", "temperature"): "rescore: None = temperature 1",
    ("mechopd/probes/view_cosine.py", "layers"): "two_view_cosine / compare_models: None = every residual site",
    ("mechopd/probes/view_cosine.py", "cka"): "two_view_cosine / compare_models: CKA off unless asked",
    ("mechopd/probes/weightpatch.py", "follow"): "weightpatch_model: the other contexts off unless asked",
}

# (file, name) -> what the parameter is: a parameter that shares an option's name but is another quantity. A copy of
# an option's default never goes here: it reads the declaration instead.
OTHER_MEANING = {
    ("mechopd/generate/vllm_engine.py", "seed"): "vLLM's engine seed (the sampler passes each call's seed)",
    (
        "mechopd/objectives/losses.py",
        "teacher",
    ): "LossInputs.teacher: the teacher's log-probabilities, not its checkpoint",
    (
        "mechopd/objectives/schedule.py",
        "warmup",
    ): "AnchorSchedule.warmup: the anchor's β ramp (beta_warmup), not the lr's",
    ("mechopd/tasks/gametask.py", "seed"): "the seed of a policy's test games, not a training or evaluation seed",
    ("mechopd/testing/families.py", "seed"): "a test model's initialisation seed",
    ("mechopd/testing/zoo.py", "seed"): "the seed of generated test items",
    ("mechopd/pipeline/run.py", "student"): "a pretrained student checkpoint, not a probe's --student role",
    ("mechopd/pipeline/spec.py", "student"): "a pretrained student checkpoint, not a probe's --student role",
}


_NONE = object()  # "no literal here"


@dataclasses.dataclass(frozen=True)
class Declared:
    """One declaration of an option: its default, the file and the class (``file:Class``) that declare it."""

    default: Any
    file: str
    owner: str
    scope: frozenset[str] | None = None  # the files it binds (a task's option: its own modules); None: every file


def declared_options() -> dict[str, list[Declared]]:
    """Option name -> every declaration of it: each field declared with ``option(...)`` by a dataclass defined in
    ``mechopd/`` (each module imported once)."""
    found: dict[str, list[Declared]] = {}
    for info in pkgutil.walk_packages([str(ROOT)], "mechopd."):
        if info.name.endswith("__main__"):  # runs the CLI when imported
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional engine (vllm) absent here; its module declares no option
            continue
        for obj in vars(module).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == info.name:
                path = _rel(Path(module.__file__ or ""))
                own = obj.__dict__.get("__annotations__", {})  # the fields this class itself declares
                scope = _task_scope(obj)
                for f in field_facts(obj):
                    if f.name in own:
                        decl = Declared(f.default, path, f"{path}:{obj.__name__}", scope)
                        found.setdefault(f.name, []).append(decl)
    return found


def _task_scope(cls: type) -> frozenset[str] | None:
    """A task's options (`TaskOptions`) bind in their task's modules only (the declaring class's and its
    subclasses'): ``temperature`` of the jsonl task is not the sampler's, ``path`` not every path."""
    if not issubclass(cls, TaskOptions):
        return None
    classes, todo = [], [cls]
    while todo:
        c = todo.pop()
        classes.append(c)
        todo += c.__subclasses__()
    return frozenset(_rel(Path(sys.modules[c.__module__].__file__ or "")) for c in classes)


def _rel(path: Path) -> str:
    return path.resolve().relative_to(REPO).as_posix()


def _literal(node: ast.AST | None) -> Any:
    """The node's value when it is a literal, else `_NONE`."""
    if node is None:
        return _NONE
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NONE


def _package(path: str) -> str:
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else ""


def _readable(decl: str, path: str) -> bool:
    """Whether the file at ``path`` may import the module at ``decl``: its package is at or above the declaring one
    in the layering (`tests/unit/test_layout.py` LAYERS; outside every layer: the top), and the declaring package
    does not import the file's (`KNOWN_UPWARD`: two packages never import each other)."""
    below, above = _package(decl), _package(path)
    rank = {name: i for i, name in enumerate(LAYERS)}
    return rank.get(below, len(LAYERS)) <= rank.get(above, len(LAYERS)) and (below, above) not in KNOWN_UPWARD


def restated(value: Any, path: str, decls: list[Declared]) -> list[Declared]:
    """The declarations whose default ``value`` repeats, of those the file at ``path`` can read (`_readable`)."""
    if value is _NONE:
        return []
    return [
        d
        for d in decls
        if (d.scope is None or path in d.scope) and _readable(d.file, path) and _equal(value, d.default)
    ]


def _equal(a: Any, b: Any) -> bool:
    """Equal as option values: 1 == 1.0, False != 0, None == None only, a list == the tuple of its items."""
    a, b = (tuple(v) if isinstance(v, list) else v for v in (a, b))
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return a is b
    try:
        return bool(a == b) and type(a) in (int, float, str, tuple) and type(b) in (int, float, str, tuple)
    except (TypeError, ValueError):
        return False


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[tuple[ast.arg, ast.AST | None]]:
    a = node.args
    positional = a.posonlyargs + a.args
    pad: list[ast.AST | None] = [None] * (len(positional) - len(a.defaults))
    yield from zip(positional, pad + list(a.defaults), strict=True)
    yield from zip(a.kwonlyargs, a.kw_defaults, strict=True)


def _class_fields(node: ast.ClassDef) -> Iterator[tuple[str, ast.AST, ast.AST]]:
    """``(name, value, node)`` of the class body's ``name: T = value`` / ``name = value``."""
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            yield stmt.target.id, stmt.value, stmt
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            yield stmt.targets[0].id, stmt.value, stmt


def _field_default(value: ast.AST) -> Any:
    """A field's literal default: ``= 3``, ``= field(default=3)``; an ``option(...)`` call is a declaration."""
    if isinstance(value, ast.Call):
        if getattr(value.func, "id", getattr(value.func, "attr", "")) != "field":
            return _NONE
        return _literal(next((k.value for k in value.keywords if k.arg == "default"), None))
    return _literal(value)


def _lookups(node: ast.Call) -> tuple[str, Any] | None:
    """``X.get("name", literal)`` / ``getattr(x, "name", literal)`` -> (name, literal)."""
    func, args = node.func, node.args
    is_get = isinstance(func, ast.Attribute) and func.attr == "get" and len(args) == 2
    is_getattr = isinstance(func, ast.Name) and func.id == "getattr" and len(args) == 3
    if not (is_get or is_getattr):
        return None
    key = args[0] if is_get else args[1]
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return None
    return key.value, _literal(args[-1])


def _help_text(node: ast.AST | None) -> str:
    """A help text's literal parts (an f-string's constant pieces joined, its fields left out)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return ""


_DEFAULT = re.compile(r"\bdefault\b:?\s*([^)]*)", re.IGNORECASE)
_LITERAL_START = re.compile(r"""^(['"`]?[-+]?\.?\d|['"`]?(true|false|none|null)\b)""", re.IGNORECASE)


def names_a_default(text: str, defaults: list[Any]) -> str | None:
    """The words of a help text that state a default (``default 8``, ``(default: 'rules')``, or the option's own
    declared default after the word "default"), else None: the docs and ``--help`` add the declared one."""
    for m in _DEFAULT.finditer(text):
        said = m.group(1).strip()
        own = [str(d) for d in defaults if d is not None and not isinstance(d, bool) and str(d).strip()]
        if _LITERAL_START.match(said) or any(re.search(rf"(?<![\w-]){re.escape(d)}(?![\w-])", said) for d in own):
            return m.group(0).strip()
    return None


def lists_members(text: str, registries: Mapping[str, Sequence[str]]) -> str | None:
    """Two or more of one registry's names written as a list in a help text (``opd, nca, ta_opd``, ``rules |
    sokoban``), else None: the live names are read from the registry (`limits`), never copied."""
    for name, members in registries.items():
        alt = "|".join(re.escape(m) for m in sorted(members, key=len, reverse=True))
        one = rf"(?<![\w-])(?:{alt})(?![\w-])"
        for m in re.finditer(rf"{one}(?:\s*(?:,|\||/|\bor\b)\s*{one})+", text):
            if not re.search(r"e\.g\.\s*(--\S+\s+)?$", text[: m.start()]):  # an example value, not the list
                return f"{name}: {m.group(0)}"
    return None


def _call_name(node: ast.Call) -> str:
    return getattr(node.func, "attr", getattr(node.func, "id", ""))


def _flag_option(node: ast.Call, declared: dict[str, list[Declared]]) -> str | None:
    """The declared option an ``add_argument("--kebab-name", ...)`` call names, else None."""
    for a in node.args:
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"):
            name = a.value[2:].replace("-", "_")
            if name in declared:
                return name
    return None


def _help_hits(
    node: ast.Call, path: str, declared: dict[str, list[Declared]], registries: Mapping[str, Sequence[str]]
) -> list[str]:
    """A help text of ``add_argument(..., help=)`` / ``option(default, help, ...)`` that states a default or lists a
    registry's names: ``path:line help ...``."""
    kind = _call_name(node)
    keyword = next((k.value for k in node.keywords if k.arg == "help"), None)
    if kind == "option":
        text = _help_text(keyword if keyword is not None else (node.args[1] if len(node.args) > 1 else None))
        defaults = [_literal(node.args[0])] if node.args else []
    elif kind == "add_argument":
        text = _help_text(keyword)
        flag = _flag_option(node, declared)
        defaults = [d.default for d in declared.get(flag or "", [])]
    else:
        return []
    out = []
    if said := names_a_default(text, [d for d in defaults if d is not _NONE]):
        out.append(f"{path}:{node.lineno} help states a default: {said!r}")
    if listed := lists_members(text, registries):
        out.append(f"{path}:{node.lineno} help lists a registry's names ({listed})")
    return out


def restatements(
    source: str,
    path: str,
    declared: dict[str, list[Declared]],
    other: dict[tuple[str, str], str] = OTHER_MEANING,
    registries: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """Every restatement in one file's source: ``path:line name=value (declared in file, ...)``, and ``path:line
    help ...`` for a help text that states a default or lists a registry's names (``registries``: name -> members)."""
    out: list[tuple[int, str, Any, list[Declared]]] = []
    helps: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        hits: list[tuple[int, str, Any]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            hits = [(arg.lineno, arg.arg, _literal(d)) for arg, d in _parameters(node) if arg.arg in declared]
        elif isinstance(node, ast.Call) and (hit := _lookups(node)) and hit[0] in declared:
            hits = [(node.lineno, *hit)]
        elif (
            isinstance(node, ast.Call) and _call_name(node) == "add_argument" and (flag := _flag_option(node, declared))
        ):
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            value = _literal(default)  # None: argparse's "not given" (the declaration then decides)
            hits = [(node.lineno, flag, value)] if default is not None and value is not None else []
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            value = _literal(node.values[-1])
            for x in node.values[:-1]:
                name = x.id if isinstance(x, ast.Name) else x.attr if isinstance(x, ast.Attribute) else None
                if name in declared:
                    hits.append((node.lineno, name, value))
        elif isinstance(node, ast.ClassDef):
            hits = [
                (stmt.lineno, name, _field_default(value))
                for name, value, stmt in _class_fields(node)
                if name in declared and f"{path}:{node.name}" not in {d.owner for d in declared[name]}
            ]
        if isinstance(node, ast.Call):
            helps += [(node.lineno, h) for h in _help_hits(node, path, declared, registries or {})]
        out += [
            (line, name, value, ds)
            for line, name, value in hits
            if (path, name) not in other and (ds := restated(value, path, declared[name]))
        ]
    found = [
        (line, f"{path}:{line} {name}={value!r} (declared in {', '.join(sorted({d.file for d in ds}))})")
        for line, name, value, ds in out
    ]
    return [text for _, text in sorted(found + helps, key=lambda r: r[0])]


def live_registries() -> dict[str, tuple[str, ...]]:
    """Every registry's live names (`mechopd.core.options.registry_names`) and the task names."""
    from mechopd.core import options
    from mechopd.tasks import task_names

    options.registry("method")  # fill the registries (their packages imported)
    return {**{name: options.registry_names(name) for name in options._REGISTRIES}, "task": tuple(task_names())}


def all_restatements(declared: dict[str, list[Declared]]) -> list[str]:
    found: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        found += restatements(
            path.read_text(encoding="utf-8"),
            _rel(path),
            declared,
            {**OTHER_MEANING, **LIBRARY_SENTINELS},
            live_registries(),
        )
    return found


def test_no_option_default_is_restated() -> None:
    found = all_restatements(declared_options())
    assert not found, f"{len(found)} restated option defaults; read the declaration instead:\n" + "\n".join(found)


def test_library_sentinels_are_none_or_false_and_still_there() -> None:
    """Every LIBRARY_SENTINELS entry is reported without it (no stale entry), and only as a None / False default."""
    declared = declared_options()
    for rel, name in LIBRARY_SENTINELS:
        source = (REPO / rel).read_text(encoding="utf-8")
        found = [r for r in restatements(source, rel, declared, other={}) if f" {name}=" in r]
        assert found, (rel, name)
        assert all(f" {name}=None " in r or f" {name}=False " in r for r in found), found


def test_other_meanings_are_still_there() -> None:
    """Every OTHER_MEANING entry names a parameter that the scan would report without it (no stale entries)."""
    declared = declared_options()
    for rel, name in OTHER_MEANING:
        source = (REPO / rel).read_text(encoding="utf-8")
        assert any(f" {name}=" in r for r in restatements(source, rel, declared, other={})), (rel, name)


def test_the_scanner_finds_each_kind_of_restatement() -> None:
    sections, probe = "mechopd/config/sections.py", "mechopd/probes/x.py"
    declared = {
        "beta": [Declared(0.5, sections, f"{sections}:NCAOptions")],
        "model": [Declared(None, probe, f"{probe}:XOptions")],
        "seed": [Declared(0, sections, "m.py:RunOptions")],
    }
    source = (
        "def f(beta=0.5, *, model=None, seed=None, other=3):\n"  # 1: beta; model (None where None is declared)
        "    return over.get('beta', 0.5), getattr(c, 'seed', 0), over.get('beta', x), getattr(c, 'seed', 7)\n"
        "class Copy:\n"
        "    beta: float = 0.5\n"  # 4
        "    seed: int = field(default=0)\n"  # 5
        "class RunOptions:\n"
        "    seed: int = option(0, help='declared here')\n"  # the declaration
    )
    found = restatements(source, "m.py", declared)
    assert [line.split(" (")[0] for line in found] == [
        "m.py:1 beta=0.5",
        "m.py:1 model=None",
        "m.py:2 beta=0.5",
        "m.py:2 seed=0",
        "m.py:4 beta=0.5",
        "m.py:5 seed=0",
    ]
    assert found[0] == f"m.py:1 beta=0.5 (declared in {sections})"
    # below the probes' layer, a parameter named `model` cannot be restating a probe's option (it cannot import it)
    below = [r.split(" (")[0] for r in restatements(source, "mechopd/evaluation/y.py", declared)]
    assert len(below) == 5 and not any("model=" in r for r in below)
    # core/ cannot read config/ (it lies below it), so nothing there copies config's beta
    assert restatements(source, "mechopd/core/y.py", declared) == []


def files_naming(option: str) -> dict[str, int]:
    """Files of ``mechopd/`` whose CODE names ``option`` (an attribute, keyword, parameter, variable or string
    constant: docs and comments not counted), with the count: the walk of issue 43's acceptance."""
    hits: dict[str, int] = {}
    for path in sorted(ROOT.rglob("*.py")):
        n = 0
        for node in ast.walk(ast.parse(path.read_text())):
            names = {ast.Attribute: "attr", ast.keyword: "arg", ast.Name: "id", ast.arg: "arg", ast.Constant: "value"}
            attr = names.get(type(node))
            n += attr is not None and getattr(node, attr) == option
        if n:
            hits[_rel(path)] = n
    return hits


def test_a_walk_of_beta_lora_rank_and_a_probes_n_crosses_at_most_five_files() -> None:
    """Issue 43: each declared once; ``beta`` and ``lora_rank`` named in code in <= 5 files (the declaration, the
    code that uses the value, the label); a probe's ``n`` is ProbeSetup's one field (EvalConfig.n, the evaluation's
    held-out items, is another option), and no probe declares an ``n`` of its own."""
    declared = declared_options()
    for name in ("beta", "lora_rank"):
        assert len({d.file for d in declared[name]}) == 1, declared[name]
        files = files_naming(name)
        assert len(files) <= 5, (name, files)
    owners = sorted({d.file for d in declared["n"]})
    assert owners == ["mechopd/evaluation/config.py", "mechopd/probes/setup.py"], owners


def test_the_widened_scanner_finds_each_new_kind() -> None:
    """Issue 56 item 5: ``add_argument(--flag, default=LITERAL)``, ``x or LITERAL`` and help texts that state a
    default or list a registry's names are found, each as ``file:line``; a None argparse default, an ``e.g.``
    example and another literal are not."""
    sections = "mechopd/config/sections.py"
    declared = {
        "beta": [Declared(0.5, sections, f"{sections}:NCAOptions")],
        "seed": [Declared(0, sections, f"{sections}:RunOptions")],
    }
    registries = {"method": ("opd", "nca", "ta_opd")}
    source = (
        "p.add_argument('--beta', default=0.5, help='the weight')\n"  # 1: a flag's default
        "p.add_argument('--seed', default=None, help='seed')\n"  # 2: argparse's "not given": no hit
        "x = cfg.beta or 0.5\n"  # 3: x or LITERAL
        "y = seed or 0\n"  # 4
        "z = seed or 7\n"  # 5: another literal: no hit
        "p.add_argument('--seed', help='the seed (default 0)')\n"  # 6: help states a default
        "a: int = option(3, 'how many (default: 3)')\n"  # 7: an option's help states its own default
        "b: str = option('opd', help='opd | nca | ta_opd')\n"  # 8: a registry's names
        "c: str = option(None, 'labels, e.g. opd,nca')\n"  # 9: an example: no hit
    )
    found = restatements(source, "m.py", declared, other={}, registries=registries)
    assert [r.split(" (declared")[0] for r in found] == [
        "m.py:1 beta=0.5",
        "m.py:3 beta=0.5",
        "m.py:4 seed=0",
        "m.py:6 help states a default: 'default 0'",
        "m.py:7 help states a default: 'default: 3'",
        "m.py:8 help lists a registry's names (method: opd | nca | ta_opd)",
    ]
