"""No relay re-exports: a module of mechopd/ does not import names only to hand them on under its own path (issue
56, item 6); an importer reads a name where it lives. ruff's F401 refuses an unused import, so a relay needs a
``noqa: F401``: the only ones allowed load a module for its registrations (the built-in tasks, the registries). A
name listed in ``__all__`` is "used" too: outside a package's ``__init__.py`` (the package's public surface),
``__all__`` lists only what the module itself defines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import mechopd

ROOT = Path(mechopd.__file__).parent
NOQA = re.compile(r"#\s*noqa:[^\n]*\bF401\b(?P<why>[^\n]*)")


def relays(root: Path = ROOT) -> list[str]:
    """Every ``noqa: F401`` of `root` whose comment does not say it registers something."""
    return [
        f"{path.relative_to(root.parent)}:{n}"
        for path in sorted(root.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if (m := NOQA.search(line)) and "regist" not in m.group("why")
    ]


def all_relays(root: Path = ROOT) -> list[str]:
    """Names in a module's ``__all__`` that it imports instead of defining (package ``__init__.py`` files aside)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                imported = {
                    a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
                }
                out += [
                    f"{path.relative_to(root.parent)}: {name}"
                    for name in ast.literal_eval(node.value)
                    if name in imported
                ]
    return out


def test_no_all_relays_another_modules_names():
    assert all_relays() == [], "names in __all__ that live elsewhere: " + ", ".join(all_relays())


def test_no_module_relays_another_modules_names():
    assert relays() == [], "relay re-exports (import the names where they live instead): " + ", ".join(relays())


def test_the_check_sees_a_relay(tmp_path):
    pkg = tmp_path / "mechopd"
    pkg.mkdir()
    (pkg / "a.py").write_text("from mechopd.b import x  # noqa: F401  (re-exported: it used to live here)\n")
    (pkg / "c.py").write_text("from mechopd import tasks  # noqa: F401  (registers the built-in tasks)\n")
    assert relays(pkg) == ["mechopd/a.py:1"]
    (pkg / "d.py").write_text('from mechopd.b import y\n\n__all__ = ["y", "z"]\n\n\ndef z():\n    return y\n')
    assert all_relays(pkg) == ["mechopd/d.py: y"]
