"""The import layering of CONTRIBUTING.md ("The layering rule"): nothing below or beside training imports
`mechopd.train`, no import cycle inside mechopd/, and no loop (of any length) between the top-level units of mechopd/.

Every module of mechopd/ is parsed (ast, so imports inside functions count too) and each import is resolved to a
module name (relative imports included; ``importlib.import_module("literal")`` and ``import_module("literal")`` count
as imports of that module). Arrows from the analysis side, evaluation/, the config, the generation layer and the
objectives into `mechopd.train` are refused; the import graph of every module has no cycle (strongly connected
component) but the listed known exceptions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mechopd

ROOT = Path(mechopd.__file__).parent
FORBIDDEN_SOURCES = ("mechopd.probes", "mechopd.evaluation", "mechopd.config", "mechopd.generate", "mechopd.objectives")
TARGET = "mechopd.train"


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module name `path` imports (``from a import b`` yields ``a`` and ``a.b``: b may be a submodule)."""
    out: set[str] = set()
    for kind, mod, names in import_statements(path, root):
        out.update(names if kind == "import" else [mod, *(f"{mod}.{n}" for n in names)])
    return out


def import_statements(path: Path, root: Path = ROOT):
    """Every import statement of `path` (function-local ones too): ("import", "", [names]) or ("from", module,
    [names]) with relative modules resolved against the file's package; an ``import_module`` call with a literal
    name is an ("import", "", [name])."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield "import", "", [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield "from", mod, [a.name for a in node.names]
        elif (literal := _import_module_literal(node, package)) is not None:
            yield "import", "", [literal]


def _import_module_literal(node: ast.AST, package: str) -> str | None:
    """The module named by ``importlib.import_module("x")`` / ``import_module("x")`` with a literal name (``".x"``
    resolved against the file's package), else None."""
    if not (
        isinstance(node, ast.Call)
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return None
    func = node.func
    if not (
        (isinstance(func, ast.Name) and func.id == "import_module")
        or (
            isinstance(func, ast.Attribute)
            and func.attr == "import_module"
            and isinstance(func.value, ast.Name)
            and func.value.id == "importlib"
        )
    ):
        return None
    name = node.args[0].value
    if name.startswith("."):
        dots = len(name) - len(name.lstrip("."))
        base = package.split(".")[: len(package.split(".")) - (dots - 1)]
        name = ".".join(base + ([name[dots:]] if name[dots:] else []))
    return name


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def forbidden_arrows(root: Path = ROOT) -> list[tuple[str, str]]:
    arrows = []
    for path in sorted(root.rglob("*.py")):
        src = module_name(path, root)
        if not any(_inside(src, s) for s in FORBIDDEN_SOURCES):
            continue
        arrows.extend((src, m) for m in sorted(imported_modules(path, root)) if _inside(m, TARGET))
    return arrows


def test_no_import_arrow_into_train():
    assert forbidden_arrows() == []


def test_the_checker_sees_every_import_form(tmp_path):
    pkg = tmp_path / "mechopd"
    (pkg / "probes").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "probes" / "__init__.py").write_text("")
    (pkg / "probes" / "a.py").write_text("def f():\n    from ..train import trainer\n")
    (pkg / "probes" / "b.py").write_text("import mechopd.train.dist\n")
    (pkg / "probes" / "c.py").write_text("from mechopd import train\nfrom mechopd import views\n")
    (pkg / "probes" / "d.py").write_text("from mechopd.views import x\nimport mechopd.trainer_like\n")
    (pkg / "evaluation").mkdir()
    (pkg / "evaluation" / "evaluate.py").write_text("from ..train.checkpoint import latest\n")
    arrows = forbidden_arrows(pkg)
    assert {src for src, _ in arrows} == {
        "mechopd.probes.a",
        "mechopd.probes.b",
        "mechopd.probes.c",
        "mechopd.evaluation.evaluate",
    }


# ------------------------------------------------------------------------------------------------- import cycles
# Known exceptions, each with its owner; the test fails on any other cycle AND when a listed one is gone (drop it).
KNOWN_CYCLES: set[frozenset[str]] = set()  # none (the probes' builtin.py / default_of cycle went with issue 30)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the mechopd modules it imports, from EVERY import statement (function-local ones too).

    ``from a import b`` is an arrow to the module ``a.b`` when b is a module, else to ``a``; ``import a.b`` to ``a.b``.
    (Importing a submodule also runs its package's ``__init__``; that implicit arrow is not counted, or every package
    that imports its own modules would be a cycle.)"""
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        out: set[str] = set()
        for kind, mod, names in import_statements(path, root):
            targets = names if kind == "import" else [f"{mod}.{n}" if f"{mod}.{n}" in modules else mod for n in names]
            out.update(t for t in targets if t in modules)
        graph[name] = out - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.add(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def test_no_import_cycle_inside_mechopd():
    cycles = set(import_cycles(import_graph()))
    assert cycles - KNOWN_CYCLES == set(), "import cycles (function-local imports count): " + "; ".join(
        " <-> ".join(sorted(c)) for c in cycles - KNOWN_CYCLES
    )
    assert KNOWN_CYCLES <= cycles, "a known cycle is fixed: remove it from KNOWN_CYCLES"


def test_the_cycle_checker_sees_function_local_and_relative_imports(tmp_path):
    pkg = tmp_path / "mechopd"
    (pkg / "plots").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "plots" / "__init__.py").write_text("from mechopd.plots import training\n")  # package -> own module: fine
    (pkg / "plots" / "training.py").write_text("def f():\n    from ..aggregate import seed_stat\n")
    (pkg / "aggregate.py").write_text("def g():\n    import mechopd.report\n")
    (pkg / "report.py").write_text("from mechopd import plots\n")
    (pkg / "stats.py").write_text("import math\n")
    graph = import_graph(pkg)
    assert graph["mechopd.plots.training"] == {"mechopd.aggregate"} and graph["mechopd.report"] == {"mechopd.plots"}
    assert import_cycles(graph) == [
        frozenset({"mechopd.plots", "mechopd.plots.training", "mechopd.aggregate", "mechopd.report"})
    ]
    (pkg / "plots" / "training.py").write_text("def f():\n    from ..stats import math\n")  # the statistics leaf
    assert import_cycles(import_graph(pkg)) == []


def test_the_checkers_see_import_module_with_a_literal_name(tmp_path):
    pkg = tmp_path / "mechopd"
    (pkg / "probes").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "probes" / "__init__.py").write_text("")
    (pkg / "probes" / "registry.py").write_text(
        "import importlib\ndef load():\n    importlib.import_module('mechopd.probes.builtin')\n"
    )
    (pkg / "probes" / "builtin.py").write_text(
        "from importlib import import_module\nimport_module('.gradients', __package__)\nimportlib.import_module(NAME)\n"
    )
    (pkg / "probes" / "gradients.py").write_text("from mechopd.probes import registry\n")
    (pkg / "train.py").write_text("")
    (pkg / "evaluation").mkdir()
    (pkg / "evaluation" / "evaluate.py").write_text(
        "def f():\n    return __import__('x') or importlib.import_module('mechopd.train')\n"
    )
    graph = import_graph(pkg)
    assert graph["mechopd.probes.registry"] == {"mechopd.probes.builtin"}
    assert graph["mechopd.probes.builtin"] == {"mechopd.probes.gradients"}  # a non-literal name is not followed
    assert import_cycles(graph) == [
        frozenset({"mechopd.probes.registry", "mechopd.probes.builtin", "mechopd.probes.gradients"})
    ]
    assert forbidden_arrows(pkg) == [("mechopd.evaluation.evaluate", "mechopd.train")]


# ------------------------------------------------------------------------------- loops between top-level units
# Known loops between packages, each with its owner; the test fails on any other loop AND when a listed one is gone.
KNOWN_PACKAGE_LOOPS: set[frozenset[str]] = set()  # none (config -> generate -> models -> config went with issue 56)


def top_level_unit(module: str) -> str:
    """``mechopd.tasks.base`` -> ``mechopd.tasks``; a top-level module is its own unit."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """top-level unit (a package or a module of mechopd/) -> the units it imports (any module of it, function-local
    imports and ``import_module("literal")`` counted); ``mechopd/__init__.py`` (the public entry points) is left out."""
    out: dict[str, set[str]] = {}
    for a, bs in graph.items():
        if a == "mechopd":
            continue
        unit = top_level_unit(a)
        out.setdefault(unit, set()).update(top_level_unit(b) for b in bs if b != "mechopd")
        out[unit].discard(unit)
    return out


def package_loops(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The loops between top-level units, of any length: the strongly connected components of `package_graph`."""
    return import_cycles(package_graph(graph))


def test_no_loop_between_top_level_packages():
    loops = set(package_loops(import_graph()))
    assert loops - KNOWN_PACKAGE_LOOPS == set(), (
        "loops between top-level units of mechopd/ (any length; function-local imports count; move the shared "
        "piece into the lowest one or below them all): " + "; ".join(" -> ".join(sorted(c)) for c in loops)
    )
    assert KNOWN_PACKAGE_LOOPS <= loops, "a known loop is fixed: remove it from KNOWN_PACKAGE_LOOPS"


def test_the_loop_checker_sees_packages_and_loops_of_any_length(tmp_path):
    pkg = tmp_path / "mechopd"
    for sub in ("config", "generate", "models"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from mechopd.config import x\nfrom mechopd.models import lora\n")
    (pkg / "config" / "sections.py").write_text("")
    (pkg / "config" / "check.py").write_text("def f():\n    from mechopd.generate.lean import DECODERS\n")
    (pkg / "generate" / "lean.py").write_text("from ..models.arch import layers\n")
    (pkg / "models" / "arch.py").write_text("")
    (pkg / "models" / "lora.py").write_text("import importlib\nimportlib.import_module('mechopd.config.sections')\n")
    (pkg / "stats.py").write_text("from mechopd.config import sections\n")
    assert set(package_graph(import_graph(pkg))) == {
        "mechopd.config",
        "mechopd.generate",
        "mechopd.models",
        "mechopd.stats",
    }
    assert package_loops(import_graph(pkg)) == [frozenset({"mechopd.config", "mechopd.generate", "mechopd.models"})]
    (pkg / "models" / "lora.py").write_text("from mechopd.models.arch import layers\n")  # a module of its own unit
    assert package_loops(import_graph(pkg)) == []
    (pkg / "generate" / "lean.py").write_text("from mechopd.config import sections\n")  # a loop of two
    assert package_loops(import_graph(pkg)) == [frozenset({"mechopd.config", "mechopd.generate"})]


def test_the_public_entry_points_are_plain_functions_without_module_tricks():
    import types

    assert isinstance(mechopd.run_train, types.FunctionType) and isinstance(mechopd.run_eval, types.FunctionType)
    swaps = [
        str(p)
        for p in ROOT.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Attribute) and t.attr == "__class__" for t in node.targets)
    ]
    assert swaps == []  # no `sys.modules[__name__].__class__ = ...`
