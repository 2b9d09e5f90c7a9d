"""Shared runner of the hostile-input tests (tests/cli/test_hostile_*.py): the reliability harness's contract.

Each case is argv as a user types it, run in a fresh workspace that is also the cwd; it must exit 2 with exactly one
``error:`` line naming the problem (``needle``), no traceback, and leave every file in the workspace and the organism
as it was (`tests.cli.reliability_harness.snapshot`). Most refusals happen before any model loads, which the cases that
set ``before_load`` assert (no "Loading weights" progress bar on stderr).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.cli.reliability_harness import Case, _run, snapshot, train  # noqa: F401  (the one harness)


@dataclass(frozen=True)
class Hostile:
    cls: str
    name: str
    argv: Callable[[Path, Path], list[str]]  # (organism, workspace) -> argv; prepares the workspace
    needle: str
    before_load: bool = True
    subprocess: bool = False


def check_in_workspace(case: Hostile, org: Path, tmp_path: Path, monkeypatch, capsys) -> str:
    """`check` from a fresh working directory ``tmp_path/ws`` (the parametrised refusal tests)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    return check(case, org, ws, capsys)


def check(case: Hostile, org: Path, ws: Path, capsys) -> str:
    argv = case.argv(org, ws)
    before = snapshot(ws, org)
    code, err = _run(
        Case(case.cls, case.name, lambda o, w: argv, case.needle, subprocess=case.subprocess), argv, ws, capsys
    )
    after = snapshot(ws, org)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert lines and [ln for ln in lines if ln.startswith("error:")] == lines[-1:], lines
    assert case.needle in lines[-1], lines[-1]
    if case.before_load:
        assert "Loading weights" not in err, err[-2000:]  # refused before any model loaded
    changed = sorted(set(before) ^ set(after) | {k for k in before if k in after and before[k] != after[k]})
    assert not changed, changed
    return lines[-1]


def copy_org(org: Path, ws: Path, name: str = "org") -> Path:
    dst = ws / name
    shutil.copytree(org, dst)
    return dst


def write(ws: Path, name: str, data: str | bytes) -> Path:
    p = ws / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data) if isinstance(data, bytes) else p.write_text(data, encoding="utf-8")
    return p


def evaluate(org: Path, *more: str) -> list[str]:
    return ["eval", "--task", "rules", "--model", str(org), "--n", "2", *more]


def set_template(d: Path, template: str) -> Path:
    """The model directory's chat template replaced (as a user editing tokenizer_config.json would)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    tok.chat_template = template
    tok.save_pretrained(d)
    return d


def edit_json(d: Path, name: str, **changes) -> Path:
    f = d / name
    data = json.loads(f.read_text())
    data.update(changes)
    f.write_text(json.dumps(data))
    return d
