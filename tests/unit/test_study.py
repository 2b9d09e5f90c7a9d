"""The typed study: runs by role. Renaming a run (role nca -> a run called ``my_nca``) through a study YAML changes no
number in the report or the claims table; the typed eval report parses the on-disk format and writes it back."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from mechopd.core.errors import ConfigError, DataError
from mechopd.report import write_report_md
from mechopd.report.claims import claims_json, evaluate_claims
from mechopd.runset import EvalReport, RunSet
from tests.unit.plotting_run import make_run

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _rename_csv(path: Path, columns: tuple[str, ...], old: str, new: str) -> None:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for c in columns:
            if r.get(c) == old:
                r[c] = new
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def _rename_json_keys(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    path.write_text(text.replace(f'"{old}"', f'"{new}"'))


def renamed_copy(run: Path, dest: Path, old: str = "nca", new: str = "my_nca") -> Path:
    """The run as if its NCA run had been called ``new``: directories, eval files, probe rows, demo.json."""
    shutil.copytree(run, dest)
    (dest / "train" / old).rename(dest / "train" / new)
    for suffix in (".json", ".csv"):
        if (dest / "eval" / f"{old}{suffix}").exists():
            (dest / "eval" / f"{old}{suffix}").rename(dest / "eval" / f"{new}{suffix}")
    _rename_csv(dest / "probes" / "similarity.csv", ("model",), old, new)
    _rename_csv(dest / "probes" / "deltas.csv", ("model", "vs"), old, new)
    for name in ("similarity.json", "deltas_summary.json", "demo.json"):  # model lists and keys; not loss terms
        _rename_json_keys(dest / name if name == "demo.json" else dest / "probes" / name, old, new)
    return dest


def _numbers(text: str, root: Path) -> list[str]:
    return NUMBER.findall(text.replace(str(root), "RUN"))


def test_renaming_a_run_through_the_study_changes_no_number(tmp_path):
    run = make_run(tmp_path / "a")
    before_claims = claims_json(evaluate_claims([run]))
    before = write_report_md(run).read_text()
    other = renamed_copy(run, tmp_path / "b" / "rules")
    # without the study the NCA role is missing: the NCA claims cannot be measured (the mapping is what matters)
    plain = {c["key"]: c for c in claims_json(evaluate_claims([other]))}
    assert all(plain[k]["verdict"].startswith("not measurable here") for k in ("nca_removes", "cosine_order"))
    assert "Harm NCA n/a" in plain["nca_removes"]["measured"] and "nca n/a" in plain["cosine_order"]["measured"]
    (other / "study.yaml").write_text(
        yaml.safe_dump(
            {"task": "rules", "runs": {"base": "base", "opd": "opd", "nca": "my_nca", "ta_opd": "ta_opd"}},
            sort_keys=False,
        )
    )
    assert (
        RunSet.load(other).name("nca") == "my_nca"
        and RunSet.load(other).run("nca").train_dir == other / "train" / "my_nca"
    )
    assert claims_json(evaluate_claims([other])) == before_claims
    after = write_report_md(other).read_text()
    assert _numbers(after, other) == _numbers(before, run)
    assert "my_nca" not in before and "NCA" in after  # the label comes from demo.json, by the run's name


def test_a_study_file_applied_to_a_run_dir_and_a_study_yaml_on_its_own(tmp_path):
    run = make_run(tmp_path / "a")
    other = renamed_copy(run, tmp_path / "b" / "rules")
    spec = tmp_path / "elsewhere.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"runs": {"opd": "opd", "nca": {"name": "my_nca", "label": "anchored"}}, "root": str(other)},
            sort_keys=False,
        )
    )
    by_file = RunSet.load(spec)
    applied = RunSet.load(other, spec)
    assert by_file.root == other and applied.root == other
    assert by_file.roles == ["base", "opd", "nca"] and by_file.label("nca") == "anchored"
    assert [c.measured for c in evaluate_claims([by_file])] == [c.measured for c in evaluate_claims([applied])]
    assert by_file.value("nca", "acc_x") == RunSet.load(run).value("nca", "acc_x")


@pytest.mark.parametrize(
    "text, message",
    [
        ("runs: [opd]\n", "'runs' mapping"),
        ("runs: {nca: {name: x, colour: red}}\n", "unknown key 'colour'"),
        ("runs: {nca: ../escape}\n", "not a plain name"),
        ("runs: {opd: x, nca: x}\n", "plays two roles"),
    ],
)
def test_bad_study_files_are_refused(tmp_path, text, message):
    bad = tmp_path / "s.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=message):
        RunSet.load(bad)


def test_a_missing_study_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        RunSet.load(tmp_path, tmp_path / "missing.yaml")


def test_eval_report_round_trips_the_on_disk_format(tmp_path):
    run = make_run(tmp_path / "a")
    doc = json.loads((run / "eval" / "opd.json").read_text())
    rep = EvalReport.load(run / "eval" / "opd.json")
    assert rep.summary.value("acc_x") == doc["summary"]["acc_x"]["value"]
    assert rep.summary.metrics["harm"].low == doc["summary"]["harm"]["low"]
    assert rep.summary.regime == doc["summary"]["regime"] and rep.records == doc["records"]
    json_path, csv_path = rep.save(tmp_path / "copy.json")
    assert json.loads(json_path.read_text()) == doc and csv_path.read_text().count("\n") == len(doc["records"]) + 1
    (tmp_path / "broken.json").write_text(json.dumps({"summary": {"acc_x": {"value": 1.0}}}))
    with pytest.raises(DataError, match="lacks 'acc_xc'"):
        EvalReport.load(tmp_path / "broken.json")


def test_figures_cli_takes_a_study_file(tmp_path, capsys):
    from mechopd.cli import main

    run = make_run(tmp_path / "a")
    assert main(["figures", str(run)]) == 0
    before = (run / "report.md").read_text()
    other = renamed_copy(run, tmp_path / "b" / "rules")
    spec = tmp_path / "roles.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"root": str(other), "runs": {"base": "base", "opd": "opd", "nca": "my_nca", "ta_opd": "ta_opd"}},
            sort_keys=False,
        )
    )
    assert main(["figures", "--study", str(spec)]) == 0, capsys.readouterr().err
    after = (other / "report.md").read_text().replace(str(spec), "STUDY")
    assert _numbers(after, other) == _numbers(before, run) and (other / "figures" / "layer_cosine.png").is_file()
    assert main(["figures"]) == 2 and "RUN_DIR or --study" in capsys.readouterr().err
