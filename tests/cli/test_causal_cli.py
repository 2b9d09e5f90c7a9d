"""`mechopd probe lens|patching|attention --run RUN_DIR` on a rules training run (config.yaml + final/) and on a JSONL
run (only final/training.json): models, task, options and render spec from the run alone; items and settings saved."""

from __future__ import annotations

import json

import pytest

from mechopd.cli import main
from mechopd.core.artifacts import read_csv
from mechopd.probes import causal_items as ci

from .test_probe_runs import jsonl_run, rules_run  # noqa: F401  (module-scoped fixtures)


@pytest.mark.parametrize("which", ["rules", "jsonl"])
def test_causal_probes_from_the_run_dir(which, rules_run, jsonl_run, tmp_path, capsys):  # noqa: F811
    run = rules_run if which == "rules" else jsonl_run
    trained = "opd" if which == "rules" else "nca"
    out = tmp_path / "probes"
    for name in ("lens", "patching", "attention"):
        assert main(["probe", name, "--run", str(run), "--n", "4", "--out", str(out)]) == 0, capsys.readouterr().err
        doc = json.loads((out / f"{name}.json").read_text())
        assert doc["settings"]["models"] == {"base": doc["settings"]["models"]["base"], trained: str(run / "final")}
        assert doc["settings"]["responses_from"] == trained and doc["settings"]["n"] == 4
        recs = ci.read_items(out / f"{name}_items.jsonl")
        assert len(recs) == 4 and all(r["response_ids"] for r in recs)
    assert {r["model"] for r in read_csv(out / "lens.csv")} == {"base", trained}
    rec = {
        (r["model"], r["site"], r["component"], r["direction"]): float(r["recovered"])
        for r in read_csv(out / "patching.csv")
        if r["window"] == "all"
    }
    assert rec[(trained, "final_norm", "resid", "c_to_x")] == pytest.approx(1.0, abs=1e-6)
    assert main(["explore", str(out)]) == 0 and (tmp_path / "explore.html").is_file()
