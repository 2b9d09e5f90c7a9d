"""The import layering of docs/DESIGN: nothing below or beside training imports `mechopd.train`.

Every module of mechopd/ is parsed (ast, so imports inside functions count too) and each import is resolved to a
module name (relative imports included). Arrows from the analysis side, the evaluation, the config, the generation
layer and the objectives into `mechopd.train` are refused.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mechopd

ROOT = Path(mechopd.__file__).parent
FORBIDDEN_SOURCES = ("mechopd.probes", "mechopd.evaluate", "mechopd.config", "mechopd.generate",
                     "mechopd.objectives")
TARGET = "mechopd.train"


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module name `path` imports (``from a import b`` yields ``a`` and ``a.b``: b may be a submodule)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


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
    (pkg / "evaluate.py").write_text("from .train.checkpoint import latest\n")
    arrows = forbidden_arrows(pkg)
    assert {src for src, _ in arrows} == {"mechopd.probes.a", "mechopd.probes.b", "mechopd.probes.c",
                                         "mechopd.evaluate"}
