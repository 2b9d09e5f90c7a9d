"""The size rules of CONTRIBUTING.md, checked: no .py file of the repository over 400 lines, no function over 60.

Both rules cover every .py file of the repository this test file lives in: the package (mechopd/), the benchmarks
(bench/), the tests (tests/), the probe studies (probes/) and any other source folder or top-level script. Not entered:
hidden directories (.venv/, .git/, the tools' caches) and the generated, git-ignored ones (runs/, build/, dist/, venv/,
*.egg-info/, __pycache__/); the repository holds no generated .py file elsewhere (notebooks are generated from their
percent-format .py, which is checked).

A function's length is counted from its first decorator (or its ``def``) to its last line (ast's ``end_lineno``),
docstring and comments inside included; nested functions count inside their parent and on their own.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
GENERATED_DIRS = frozenset({"runs", "build", "dist", "venv", "node_modules", "__pycache__"})


def python_files(repo: Path = REPO) -> list[Path]:
    """Every .py file under `repo`, sorted, without entering hidden or generated directories."""
    out = []
    for dirpath, dirnames, filenames in os.walk(repo):
        dirnames[:] = sorted(
            d for d in dirnames if not (d.startswith(".") or d in GENERATED_DIRS or d.endswith(".egg-info"))
        )
        out += [Path(dirpath, f) for f in filenames if f.endswith(".py")]
    return sorted(out)


def long_files(repo: Path = REPO, limit: int = MAX_FILE_LINES) -> list[tuple[str, int]]:
    """(path relative to repo, lines) of every .py file of the repository longer than `limit` lines."""
    out = []
    for path in python_files(repo):
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append((path.relative_to(repo).as_posix(), n))
    return out


def long_functions(repo: Path = REPO, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """("path:line name", lines) of every function or method of the repository longer than `limit` lines."""
    out = []
    for path in python_files(repo):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                n = (node.end_lineno or node.lineno) - first + 1
                if n > limit:
                    out.append((f"{path.relative_to(repo).as_posix()}:{node.lineno} {node.name}", n))
    return out


def test_the_checks_see_the_package_the_benchmarks_and_the_tests():
    seen = {p.relative_to(REPO).as_posix() for p in python_files()}
    assert {"mechopd/__init__.py", "bench/gpu_check.py", "tests/unit/test_sizes.py"} <= seen, sorted(seen)[:5]


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
    assert long_functions(tmp_path) == [("mechopd/sub/long.py:2 g", 61), ("mechopd/sub/long.py:65 h", 61)]
    (pkg / "big.py").write_text("x = 1\n" * 401)
    (pkg / "edge.py").write_text("x = 1\n" * 400)
    assert long_files(tmp_path) == [("mechopd/big.py", 401)]
    # outside the package: benchmarks, tests, top-level scripts count; hidden and generated directories do not
    long_def = f"def f():\n{body}    pass\n"  # 61 lines
    for d in ("bench", "tests/unit", "", ".venv/lib", "runs/demo", "build", "mechopd.egg-info", "tests/__pycache__"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
        (tmp_path / d / "script.py").write_text(long_def + "x = 1\n" * 340)  # 401 lines
    assert long_files(tmp_path) == [
        ("bench/script.py", 401),
        ("mechopd/big.py", 401),
        ("script.py", 401),
        ("tests/unit/script.py", 401),
    ]
    assert [f for f, _ in long_functions(tmp_path)] == [
        "bench/script.py:1 f",
        "mechopd/sub/long.py:2 g",
        "mechopd/sub/long.py:65 h",
        "script.py:1 f",
        "tests/unit/script.py:1 f",
    ]
