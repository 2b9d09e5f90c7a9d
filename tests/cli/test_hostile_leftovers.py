"""Hostile inputs, leftovers of the earlier rounds (#41): `eval --out` a directory not yet there, `figures --study`
refused on a bad eval file keeps the figures drawn before, `aggregate` on a seed whose summary ``n`` is text, a demo
rerun after a kill between a probe's two files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mechopd.cli import main
from tests.cli.hostile import evaluate


def test_eval_out_creates_a_directory_that_is_not_there_yet(tiny_rules_organism, tmp_path, capsys):
    out = tmp_path / "new" / "reports"
    assert main(evaluate(Path(tiny_rules_organism), "--out", str(out))) == 0, capsys.readouterr().err
    doc = json.loads((out / "rules.json").read_text())
    assert doc["summary"] and (out / "rules.csv").is_file()


def _bad(doc: dict, how: str) -> dict:
    if how == "records-text":
        doc["records"] = "x"
    elif how == "other-contexts-text":
        doc["other_contexts"] = "x"
    return doc


@pytest.mark.parametrize("how", ["records-text", "other-contexts-text"])
def test_figures_refused_on_a_bad_eval_file_keep_the_figures_drawn_before(tmp_path, capsys, how):
    """`mechopd figures --study` whose run's eval file is damaged: one error line, and figures/ (training curves
    included) and report.md exactly as the last good redraw left them."""
    from tests.cli.reliability_harness import snapshot
    from tests.unit.plotting_run import make_run

    run = make_run(tmp_path / "run")
    assert main(["figures", str(run)]) == 0
    doc = json.loads((run / "eval" / "opd.json").read_text())
    (run / "bad.json").write_text(json.dumps(_bad(doc, how)))
    roles = {"base": "base", "opd": {"name": "opd", "eval": "bad.json"}, "nca": "nca", "ta_opd": "ta_opd"}
    (run / "s.yaml").write_text(yaml.safe_dump({"runs": roles}))
    before = snapshot(run)
    capsys.readouterr()
    assert main(["figures", "--study", str(run / "s.yaml")]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error:"), err[-2000:]
    assert "bad.json" in lines[0], lines
    assert snapshot(run) == before
    assert (run / "figures" / "training_curves.png").is_file()
