"""CONTRIBUTING.md's map is the tree (issue 43): the package block under "The layering rule" names every top-level
package of mechopd/ and only those, the layered ones in the order of the layering test (`LAYERS`, read top first), each
module named in a package's parentheses exists, and every repository path the file names exists."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_layout import LAYERS, ROOT, TOP

REPO = ROOT.parent
CONTRIBUTING = REPO / "CONTRIBUTING.md"
BESIDE = "beside the layers:"


def package_block(text: str) -> str:
    """The first fenced block after the "## The layering rule" heading."""
    section = text.split("## The layering rule", 1)[1]
    return section.split("```", 2)[1]


def listed_packages(block: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(layered, beside): (package, description) per ``name/  description`` entry, in order; an indented line continues
    the entry above; the entries after the "beside the layers:" line are the beside ones."""
    layered: list[tuple[str, str]] = []
    beside: list[tuple[str, str]] = []
    current = layered
    for line in block.splitlines():
        if line.strip() == BESIDE:
            current = beside
        elif m := re.match(r"(\w+)/\s+(.*)", line):
            current.append((m.group(1), m.group(2)))
        elif line.startswith(" ") and line.strip() and current:
            name, words = current[-1]
            current[-1] = (name, f"{words} {line.strip()}")
    return layered, beside


def named_modules(description: str) -> list[str]:
    """The module names in a description's last parentheses (``(a, b, c)`` at its end), else []."""
    m = re.search(r"\(([\w, ]+)\)$", description)
    return [w.strip() for w in m.group(1).split(",")] if m else []


def top_level_packages(root: Path = ROOT) -> set[str]:
    """The top-level packages (directories with an ``__init__.py``) of `root`."""
    return {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}


def map_problems(text: str, root: Path = ROOT, layers: tuple[str, ...] = LAYERS) -> list[str]:
    """What in `text`'s package block disagrees with the tree under `root` and the bottom-first `layers`."""
    layered, beside = listed_packages(package_block(text))
    names = [n for n, _ in layered + beside]
    problems = [f"{n}/ is listed but is no directory of mechopd/" for n in names if not (root / n).is_dir()]
    problems += [
        f"{n}/ is a package of mechopd/ missing from the map" for n in sorted(top_level_packages(root) - set(names))
    ]
    if [n for n, _ in layered] != list(reversed(layers)):
        problems.append(f"layer order {[n for n, _ in layered]} is not LAYERS top first {list(reversed(layers))}")
    for name, words in layered + beside:
        problems += [
            f"{name}/{m}.py is named but does not exist"
            for m in named_modules(words)
            if not (root / name / f"{m}.py").is_file()
        ]
    return problems


def test_the_map_is_the_tree():
    assert map_problems(CONTRIBUTING.read_text()) == []


def test_the_beside_packages_are_the_layout_tests_top():
    _, beside = listed_packages(package_block(CONTRIBUTING.read_text()))
    assert {n for n, _ in beside} & top_level_packages() == TOP


def test_every_path_the_guide_names_exists():
    """Every `mechopd/...`, `tests/...`, `docs/...`, `training/...`, `probes/...` and `bench/...` path in backticks
    (placeholders like ``<name>`` aside) is a file or directory of the repository."""
    paths = re.findall(r"`((?:mechopd|tests|docs|training|probes|bench)/[\w./-]*)`", CONTRIBUTING.read_text())
    missing = sorted({p for p in paths if not (REPO / p).exists()})
    assert paths and missing == []


def _tree(tmp_path: Path, packages: list[str]) -> Path:
    root = tmp_path / "mechopd"
    for name in packages:
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
        (root / name / "a.py").write_text("")
    return root


def test_the_map_check_fails_on_a_missing_an_extra_and_a_misordered_package(tmp_path):
    root = _tree(tmp_path, ["core", "cli", "extra"])
    text = "## The layering rule\n\n```\ncli/   top (a)\ncore/  bottom (a, b)\ngone/  x\n```\n"
    assert map_problems(text, root, ("core", "cli")) == [
        "gone/ is listed but is no directory of mechopd/",
        "extra/ is a package of mechopd/ missing from the map",
        "layer order ['cli', 'core', 'gone'] is not LAYERS top first ['cli', 'core']",
        "core/b.py is named but does not exist",
    ]
    ordered = "## The layering rule\n\n```\ncore/  bottom\ncli/   top\n\nbeside the layers:\nextra/  x\n```\n"
    assert map_problems(ordered, root, ("core", "cli")) == [
        "layer order ['core', 'cli'] is not LAYERS top first ['cli', 'core']"
    ]
    good = "## The layering rule\n\n```\ncli/   top\n       (a)\ncore/  bottom\n\nbeside the layers:\nextra/  x\n```\n"
    assert map_problems(good, root, ("core", "cli")) == []
