"""The package layout shows the layers (issue 30): a short top level, imports only downward, no import of a gone path.

mechopd/ has at most 16 modules at its top level (a package counts as one). Every import of every module (function-
local ones and ``import_module("literal")`` included) goes to its own layer or a lower one of LAYERS, but the
KNOWN_UPWARD arrows, each with its reason. The old top-level paths of issue 30 (`mechopd.errors`, ...) are gone
(CHANGELOG.md lists them with their new homes); the library imports none of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mechopd

ROOT = Path(mechopd.__file__).parent
LAYERS = (
    "core",
    "config",
    "models",
    "tasks",
    "organisms",
    "generate",
    "objectives",
    "evaluation",
    "train",
    "runset",
    "probes",
    "plots",
    "report",
    "pipeline",
    "cli",
)
TOP = {"testing"}  # test helpers (tiny models for tests and benches): may import any layer, nothing imports them
# (from layer, to layer): an upward arrow allowed, with the reason. Fix one: drop it (the test fails while it is listed).
KNOWN_UPWARD: dict[tuple[str, str], str] = {}  # none (config read generate/, objectives/, organisms/ until issue 56)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module name `path` imports: import / from-import (relative resolved, `from a import b` yields a and a.b)
    and ``import_module("literal")`` / ``importlib.import_module("literal")`` with a literal first argument."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            out.update([base, *(f"{base}.{a.name}" for a in node.names)])
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.add(node.args[0].value)
    return out


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "mechopd" and len(parts) > 1 else None


def upward_arrows(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(from layer, to layer) -> the 'module -> module' imports that go up LAYERS."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        src = module_name(path, root)
        a = layer(src)
        if a is None or a in TOP:
            continue
        for dst in sorted(imports(path, root)):
            b = layer(dst)
            if b in LAYERS and a in LAYERS and LAYERS.index(b) > LAYERS.index(a):
                out.setdefault((a, b), []).append(f"{src} -> {dst}")
    return out


def test_the_top_level_is_short():
    top = sorted(
        p.stem if p.is_file() else p.name
        for p in ROOT.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    )
    assert len(top) <= 16, f"{len(top)} modules at mechopd/'s top level (at most 16): {top}"
    assert set(top) <= set(LAYERS) | TOP, f"a top-level name outside LAYERS: {sorted(set(top) - set(LAYERS) - TOP)}"


def test_imports_go_down_the_layers():
    arrows = upward_arrows()
    unknown = {k: v for k, v in arrows.items() if k not in KNOWN_UPWARD}
    assert not unknown, (
        "upward imports (add the module to a lower layer, or the arrow to KNOWN_UPWARD with a "
        "reason): " + "; ".join(", ".join(v) for v in unknown.values())
    )
    fixed = set(KNOWN_UPWARD) - set(arrows)
    assert not fixed, f"a known upward arrow is gone: remove it from KNOWN_UPWARD: {sorted(fixed)}"


def top_level_names(root: Path = ROOT) -> set[str]:
    """The modules and packages at `root`'s top level, and the names `root/__init__.py` defines."""
    names = {p.stem for p in root.glob("*.py") if p.name != "__init__.py"}
    names |= {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    tree = ast.parse((root / "__init__.py").read_text())
    names |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return names


def gone_paths(root: Path = ROOT) -> list[str]:
    """'module -> import' for every import inside `root` of a `mechopd.X` whose X is no top-level name of `root`."""
    known = top_level_names(root)
    return [
        f"{module_name(p, root)} -> {m}"
        for p in sorted(root.rglob("*.py"))
        for m in sorted(imports(p, root))
        if layer(m) is not None and layer(m) not in known
    ]


def test_the_library_imports_no_old_path():
    """Inside mechopd/ every `mechopd.X` import names a top-level module or package that exists (no old path)."""
    assert gone_paths() == []


def write_package(root: Path, files: dict[str, str]) -> Path:
    """A synthetic ``mechopd`` package under ``root``: each ``relative path -> source`` written, folders made."""
    pkg = root / "mechopd"
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def test_the_old_path_check_sees_a_gone_path(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "__version__ = '0'\n",
            "core/__init__.py": "",
            "core/a.py": "from mechopd.errors import E\nfrom mechopd.core import b\nimport mechopd\n",
            "core/b.py": "from mechopd import __version__\n",
        },
    )
    assert gone_paths(pkg) == ["mechopd.core.a -> mechopd.errors", "mechopd.core.a -> mechopd.errors.E"]


def test_the_checker_sees_literal_import_module_and_function_imports(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/a.py": "import importlib\ndef f():\n    importlib.import_module('mechopd.cli.x')\n",
            "core/b.py": "def g():\n    from ..report import claims\n",
            "core/c.py": "from importlib import import_module\nM = import_module('mechopd.core.a')\n",
        },
    )
    arrows = upward_arrows(pkg)
    assert arrows == {
        ("core", "cli"): ["mechopd.core.a -> mechopd.cli.x"],
        ("core", "report"): ["mechopd.core.b -> mechopd.report", "mechopd.core.b -> mechopd.report.claims"],
    }
