"""Hostile inputs, leftovers of the earlier rounds (#41): `eval --out` a directory not yet there, `figures --study`
refused on a bad eval file keeps the figures drawn before, `aggregate` on a seed whose summary ``n`` is text, a demo
rerun after a kill between a probe's two files."""

from __future__ import annotations

import json
from pathlib import Path

from mechopd.cli import main
from tests.cli.hostile import evaluate


def test_eval_out_creates_a_directory_that_is_not_there_yet(tiny_rules_organism, tmp_path, capsys):
    out = tmp_path / "new" / "reports"
    assert main(evaluate(Path(tiny_rules_organism), "--out", str(out))) == 0, capsys.readouterr().err
    doc = json.loads((out / "rules.json").read_text())
    assert doc["summary"] and (out / "rules.csv").is_file()
