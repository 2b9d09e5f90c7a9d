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


def test_the_readme_study_template_is_one_the_checker_accepts(tmp_path):
    """The README's study file, as written (its placeholders filled, its data beside it as in a checkout), loads with
    `StudySpec.load` (#54: it once put placement under render, which the checker refuses)."""
    import yaml

    from mechopd.pipeline.spec import StudySpec

    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Your own model.*?```yaml\n(.*?)```", text, flags=re.DOTALL)
    assert block, "README.md has no study template"
    (tmp_path / "mechopd").symlink_to(ROOT / "mechopd")  # the file sits at a checkout's root
    (tmp_path / "trained").mkdir()
    doc = (
        block.group(1)
        .replace("PATH_OR_organism:NAME", "org/model")
        .replace("{checkpoint: PATH}", "{checkpoint: trained}")
    )
    (tmp_path / "study.yaml").write_text(doc)
    spec = StudySpec.load(tmp_path / "study.yaml")
    assert yaml.safe_load(doc)["task_options"]["placement"] == spec.render.get("placement", "system")
    assert spec.checkpoints() == {"mine": str(tmp_path / "trained")}
