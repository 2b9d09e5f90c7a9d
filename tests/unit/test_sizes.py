"""The size rules of CONTRIBUTING.md, checked: no file of mechopd/ over 400 lines, no function over 60.

A function's length is counted from its first decorator (or its ``def``) to its last line (ast's ``end_lineno``),
docstring and comments inside included; nested functions count inside their parent and on their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mechopd

ROOT = Path(mechopd.__file__).parent
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def long_files(root: Path = ROOT, limit: int = MAX_FILE_LINES) -> list[tuple[str, int]]:
    """(path relative to root's parent, lines) of every .py file under root longer than `limit` lines."""
    out = []
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append((str(path.relative_to(root.parent)), n))
    return out


def long_functions(root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """("path:line name", lines) of every function or method under root longer than `limit` lines."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                n = (node.end_lineno or node.lineno) - first + 1
                if n > limit:
                    out.append((f"{path.relative_to(root.parent)}:{node.lineno} {node.name}", n))
    return out


def test_no_file_over_the_limit():
    found = long_files()
    assert found == [], (
        f"files over {MAX_FILE_LINES} lines (CONTRIBUTING.md: split the file by responsibility): "
        + "; ".join(f"{p} has {n}" for p, n in found)
    )


def test_no_function_over_the_limit():
    found = long_functions()
    assert found == [], (
        f"functions over {MAX_FUNCTION_LINES} lines (CONTRIBUTING.md: split the function): "
        + "; ".join(f"{f} has {n}" for f, n in found)
    )


def test_the_size_checks_see_long_files_and_functions(tmp_path):
    pkg = tmp_path / "mechopd"
    (pkg / "sub").mkdir(parents=True)
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    (pkg / "ok.py").write_text(f"def f():\n{body}")  # 60 lines: at the limit
    method = body.replace("    ", "        ")
    (pkg / "sub" / "long.py").write_text(
        f"@decorator\ndef g():\n{body}\n\nclass C:\n    async def h(self):\n{method}"
        "        pass\n    def short(self):\n        pass\n"
    )
    assert long_functions(pkg) == [("mechopd/sub/long.py:2 g", 61), ("mechopd/sub/long.py:65 h", 61)]
    (pkg / "big.py").write_text("x = 1\n" * 401)
    (pkg / "edge.py").write_text("x = 1\n" * 400)
    assert long_files(pkg) == [("mechopd/big.py", 401)]
