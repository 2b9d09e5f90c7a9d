"""The README stays a newcomer's page (short, the two commands exactly) and no relative link in the docs is dead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_is_short_and_holds_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 180
    for command in ('pip install torch==2.13.0 && pip install -e ".[test]"', "mechopd demo", "python -m pytest -q"):
        assert f"```bash\n{command}\n```" in text, command


def test_docs_has_the_pages_the_readme_promises():
    for page in ("method", "results", "organisms", "scaling", "gotchas"):
        assert (ROOT / "docs" / f"{page}.md").is_file()
        assert f"docs/{page}.md" in (ROOT / "README.md").read_text()
        assert f"({page}.md)" in (ROOT / "docs" / "README.md").read_text()  # the docs index lists it


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    dead = []
    prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL))  # code is not links
    for target in LINK.findall(prose):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            dead.append(target)
    assert dead == []
