"""An import sits at the top of its module unless it has a reason to be inside a function (issue 56, item 6).

Every ``import`` / ``from ... import`` inside a function of mechopd/ must be one of:

* in `cli/` or ``mechopd/__init__.py``: a verb loads its library when it runs (`mechopd --help` stays quick);
* guarded: inside ``try: ... except ImportError`` (an optional extra);
* ``torch.distributed`` (FSDP and its state dicts, only when sharding asks for them);
* heavier: at the top it would load a third-party package (torch, transformers, matplotlib, an extra such as vllm)
  that the module does not load today (its top-level imports, followed through mechopd, parents included);
* a load-time cycle: the imported module loads this one at its top;
* listed in `KEPT` with its reason.

Anything else could sit at the top of its module, and this test says where.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import mechopd

ROOT = Path(mechopd.__file__).parent
KEPT = {
    ("mechopd.pipeline.named", "run_study"): "tests/unit/test_named_study.py patches pipeline.run.run_study",
    **{
        ("mechopd.organisms.pretrain", name): "transformers' model classes load torch.distributed.tensor (~1 s) and "
        "every verb's parser reads OrganismConfig here: at the top, `mechopd train` refused bad input in 6.2 s, not 2.3"
        for name in ("LlamaConfig", "Qwen3Config", "AutoModelForCausalLM")
    },
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Scan:
    """The modules of a package root: their top-level imports and their function-local ones."""

    def __init__(self, root: Path = ROOT) -> None:
        self.files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
        self.top: dict[str, set[str]] = {m: set() for m in self.files}
        self.local: list[tuple[str, ast.stmt, bool]] = []  # (module, statement, guarded)
        for m, p in self.files.items():
            self._walk(m, ast.parse(p.read_text()), inside=False, guarded=False)

    def targets(self, m: str, node: ast.stmt) -> list[str]:
        """What an import statement loads: mechopd modules (and their parent packages) or third-party roots."""
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            assert isinstance(node, ast.ImportFrom)
            package = m if self.files[m].name == "__init__.py" else m.rpartition(".")[0]
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names = [mod] + [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in self.files]
        out = []
        for n in names:
            if n.split(".")[0] != ROOT.name:
                out.append(n.split(".")[0])
                continue
            while n not in self.files and "." in n:
                n = n.rpartition(".")[0]
            parts = n.split(".")
            out += [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        return out

    def _walk(self, m: str, node: ast.AST, inside: bool, guarded: bool) -> None:
        for child in ast.iter_child_nodes(node):
            g = guarded or (
                isinstance(node, ast.Try)
                and child in node.body
                and any(h.type is None or "ImportError" in ast.unparse(h.type) for h in node.handlers)
            )
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if inside:
                    self.local.append((m, child, g))
                else:
                    self.top[m].update(self.targets(m, child))
            if isinstance(child, ast.If) and not inside and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            self._walk(m, child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)), g)

    def loads(self, m: str) -> set[str]:
        """Every mechopd module and third-party root that loading `m` loads (its parents first)."""
        parts = m.split(".")
        seen: set[str] = set()
        todo = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        while todo:
            x = todo.pop()
            if x not in seen:
                seen.add(x)
                todo.extend(self.top.get(x, ()))
        return seen

    def third_party(self, names: set[str]) -> set[str]:
        return {n for n in names if n not in self.files and n not in sys.stdlib_module_names and n != "__future__"}


def reason(scan: Scan, m: str, stmt: ast.stmt, guarded: bool) -> str | None:
    """Why a function-local import stays inside its function, or None (it could sit at the top)."""
    mods = [stmt.module or ""] if isinstance(stmt, ast.ImportFrom) else [a.name for a in stmt.names]
    if m == ROOT.name or m.startswith(f"{ROOT.name}.cli"):
        return "start-up"
    if guarded:
        return "guarded"
    if any(x.startswith("torch.distributed") for x in mods):
        return "torch.distributed"
    targets = scan.targets(m, stmt)
    loaded = set().union(*(scan.loads(t) if t in scan.files else {t} for t in targets))
    if scan.third_party(loaded) - scan.third_party(scan.loads(m)):
        return "heavier"
    if any(m in scan.loads(t) for t in targets if t in scan.files):
        return "cycle"
    names = {a.asname or a.name.split(".")[0] for a in stmt.names}
    return next((why for (km, kn), why in KEPT.items() if km == m and kn in names), None)


def movable(root: Path = ROOT) -> list[str]:
    scan = Scan(root)
    return [
        f"{scan.files[m]}:{stmt.lineno} {ast.unparse(stmt)}"
        for m, stmt, guarded in scan.local
        if reason(scan, m, stmt, guarded) is None
    ]


def test_every_function_local_import_has_a_reason():
    assert movable() == [], "function-local imports that could sit at the top of their module: " + "; ".join(movable())


def test_kept_entries_are_still_there():
    scan = Scan()
    local = {(m, a.asname or a.name) for m, stmt, _ in scan.local for a in stmt.names}
    assert set(KEPT) <= local, set(KEPT) - local


def test_the_scan_sees_a_movable_import_and_each_reason(tmp_path):
    pkg = tmp_path / ROOT.name
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("def main():\n    import json\n")  # start-up: stays
    (pkg / "light.py").write_text("import json\n")
    (pkg / "heavy.py").write_text("import numpy\n")
    (pkg / "a.py").write_text(
        "from . import light\n\n"
        "def f():\n    import os\n    from .light import json\n\n"  # both movable
        "def g():\n    from . import heavy\n    try:\n        import vllm\n    except ImportError:\n        pass\n"
        "def h():\n    from . import b\n"  # cycle: b loads a
    )
    (pkg / "b.py").write_text("from . import a\n")
    found = movable(pkg)
    assert [line.split(" ", 1)[1] for line in found] == ["import os", "from .light import json"], found
