"""Hostile inputs, study files and the artifacts `figures` / `aggregate` read (`mechopd.runset.checks`,
`mechopd.core.checks.check_display_label` / `inside_root`, `mechopd.core.artifacts` readers).

A study is checked whole before anything is written: a role naming no run, a ``root:`` outside the study file's
folder, a task that contradicts the runs, a label with a newline or markup, a role or a block missing from one seed,
a number out of range or not a number: exit 2, one ``error:`` line naming the file and the fix, the disk unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli.hostile import Hostile, check, write
from tests.unit.plotting_run import make_run


def _study(ws: Path, runs: dict, name: str = "run/rules/study.yaml", **more) -> str:
    return str(write(ws, name, yaml.safe_dump({**more, "runs": runs}, sort_keys=False, allow_unicode=True)))


ROLES = {"base": "base", "opd": "opd", "nca": "nca", "ta_opd": "ta_opd"}


def _edit_eval(run: Path, name: str, fn) -> None:
    p = run / "eval" / f"{name}.json"
    doc = json.loads(p.read_text())
    fn(doc)
    p.write_text(json.dumps(doc))


def _seeds(ws: Path, edit=None) -> list[str]:
    runs = [make_run(ws / f"seed-{k}", seed=k) for k in range(2)]
    if edit is not None:
        edit(runs[1])
    return ["aggregate", *map(str, runs), "--out", str(ws / "agg")]


def _drop(*keys):
    def fn(doc):
        for k in keys:
            doc["summary"].pop(k, None) if k != "other_contexts" else doc.pop(k, None)

    return fn


def _set(key, value):
    def fn(doc):
        doc["summary"][key]["value"] = value

    return fn


def _metrics_line(run: Path, line: str) -> None:
    with (run / "train" / "opd" / "metrics.jsonl").open("a") as fh:
        fh.write(line + "\n")


FIGURES = [
    Hostile(
        "study",
        "role-names-no-run",
        lambda o, w: ["figures", "--study", _study(w, {**ROLES, "nca": "ghost"})],
        "role 'nca' names run 'ghost'",
    ),
    Hostile(
        "study",
        "root-outside-the-study-folder",
        lambda o, w: ["figures", "--study", _study(w, ROLES, "studies/s.yaml", root="../run/rules")],
        "leads outside the study file's folder",
    ),
    Hostile(
        "study",
        "root-absolute-elsewhere",
        lambda o, w: ["figures", "--study", _study(w, ROLES, "studies/s.yaml", root=str(w / "run" / "rules"))],
        "leads outside the study file's folder",
    ),
    Hostile(
        "study",
        "task-contradicts-the-runs",
        lambda o, w: ["figures", "--study", _study(w, ROLES, task="sokoban")],
        "task 'sokoban', but the runs were trained on rules",
    ),
    Hostile(
        "study",
        "label-with-newline",
        lambda o, w: [
            "figures",
            "--study",
            _study(w, {**ROLES, "opd": {"name": "opd", "label": "OPD\n# Injected\n<img src=x onerror=alert(1)>"}}),
        ],
        "runs.opd.label 'OPD\\n# Injected",
    ),
    Hostile(
        "study",
        "label-with-html",
        lambda o, w: [
            "figures",
            "--study",
            _study(w, {**ROLES, "opd": {"name": "opd", "label": "<script>alert(1)</script>"}}),
        ],
        "contains '<'",
    ),
    Hostile(
        "study",
        "label-with-table-bar",
        lambda o, w: [
            "figures",
            "--study",
            _study(w, {**ROLES, "opd": {"name": "opd", "label": "OPD | 1.000 | fake"}}),
        ],
        "contains '|'",
    ),
    Hostile(
        "study",
        "label-with-link",
        lambda o, w: [
            "figures",
            "--study",
            _study(w, {**ROLES, "opd": {"name": "opd", "label": "[click](javascript:x)"}}),
        ],
        "contains '['",
    ),
    Hostile(
        "study",
        "yaml-alias-bomb",
        lambda o, w: [
            "figures",
            "--study",
            str(
                write(
                    w,
                    "run/rules/study.yaml",
                    "a: &a [x,x,x,x,x,x,x,x,x]\n"
                    + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
                    + "runs: {opd: opd}\n",
                )
            ),
        ],
        "aliases",
    ),
]

AGGREGATE = [
    Hostile(
        "aggregate",
        "role-missing-from-a-seed",
        lambda o, w: _seeds(w, lambda r: (r / "eval" / "nca.json").unlink()),
        "role 'nca' has no evaluation in seed run",
    ),
    Hostile(
        "aggregate",
        "older-seed-without-following",
        lambda o, w: _seeds(
            w, lambda r: _edit_eval(r, "opd", _drop("follow_other", "stick", "retention", "other_contexts"))
        ),
        "has no follow_other, other_contexts, stick for role 'opd' (written by an older mechopd)",
    ),
    Hostile(
        "aggregate",
        "number-1e308",
        lambda o, w: _seeds(w, lambda r: _edit_eval(r, "opd", _set("acc_x", 1e308))),
        "summary.acc_x = 1e+308 is outside [0.0, 1.0]",
    ),
    Hostile(
        "aggregate",
        "number-minus-1e308",
        lambda o, w: _seeds(w, lambda r: _edit_eval(r, "opd", _set("delta_len", -1e308))),
        "summary.delta_len = -1e+308 is outside",
    ),
    Hostile(
        "aggregate",
        "text-for-a-number",
        lambda o, w: _seeds(w, lambda r: _edit_eval(r, "nca", _set("harm", "lots"))),
        "'lots' is not a number",
    ),
    Hostile(
        "aggregate",
        "summary-n-text",
        lambda o, w: _seeds(w, lambda r: _edit_eval(r, "nca", lambda d: d["summary"].__setitem__("n", "many"))),
        "summary.n = 'many' is not a count of items",
    ),
    Hostile(
        "aggregate",
        "metrics-line-bare-number",
        lambda o, w: _seeds(w, lambda r: _metrics_line(r, "42")),
        "metrics.jsonl line 8: not a metrics record",
    ),
    Hostile(
        "aggregate",
        "metrics-line-100000-deep",
        lambda o, w: _seeds(w, lambda r: _metrics_line(r, "[" * 100000 + "]" * 100000)),
        "not a metrics record",
    ),
    Hostile(
        "aggregate",
        "eval-json-100000-deep",
        lambda o, w: _seeds(w, lambda r: (r / "eval" / "nca.json").write_text("[" * 100000 + "]" * 100000)),
        "nests too deeply",
    ),
    Hostile(
        "aggregate",
        "eval-json-not-utf8",
        lambda o, w: _seeds(w, lambda r: (r / "eval" / "nca.json").write_bytes(b'{"summary": "\xff\xfe"}')),
        "is not UTF-8",
    ),
]


@pytest.mark.parametrize("case", FIGURES + AGGREGATE, ids=[c.name for c in FIGURES + AGGREGATE])
def test_a_bad_study_is_refused_before_anything_is_written(case, tmp_path, monkeypatch, capsys):
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    if case.cls == "study":
        make_run(ws / "run")
    org = tmp_path / "no-model"  # these verbs load no model
    org.mkdir()
    check(case, org, ws, capsys)
    assert not (ws / "agg").exists() and not (ws / "run" / "rules" / "figures").exists()


def test_a_good_study_still_draws_and_aggregates(tmp_path, monkeypatch, capsys):
    """The same fixtures unchanged (a safe unicode label, a root inside the folder, no task line): accepted; the task
    comes from the runs."""
    from mechopd.cli import main
    from mechopd.runset import RunSet
    from mechopd.runset.checks import check_study

    run = make_run(tmp_path / "run")
    spec = _study(
        tmp_path,
        {**ROLES, "opd": {"name": "opd", "label": "OPD (ρ=0.10, β=0.5; kept 50%)"}},
        "run/study.yaml",
        root="rules",
    )
    assert check_study(RunSet.load(spec)).task == "rules"
    assert main(["figures", "--study", spec]) == 0, capsys.readouterr().err
    assert "OPD (ρ=0.10, β=0.5; kept 50%)" in (run / "report.md").read_text()
    args = _seeds(tmp_path)
    assert main(args) == 0, capsys.readouterr().err
    agg = json.loads((tmp_path / "agg" / "aggregate.json").read_text())
    assert agg["models"]["opd"]["acc_x"]["n"] == 2


def _drop_column(p: Path, col: str) -> None:
    rows = [ln.split(",") for ln in p.read_text().splitlines()]
    i = rows[0].index(col)
    p.write_text("".join(",".join(r[:i] + r[i + 1 :]) + "\n" for r in rows))


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda p: _drop_column(p, "layer"), "similarity.csv has no column 'layer'"),
        (lambda p: p.write_text(p.read_text() + "opd,extra,1,2,3,4,5,6,7,8,9\n"), "more cells than its header"),
        (lambda p: p.write_bytes(p.read_bytes() + b"opd,\xff\xfe\n"), "similarity.csv is not UTF-8"),
    ],
)
def test_a_damaged_probe_csv_is_one_error_line(tmp_path, capsys, damage, needle):
    """The CSV readers of the figures and the report (`artifacts.read_csv`): a missing column, a row with extra
    cells, bytes that are not UTF-8 -> one line naming the file and the fix; no figure left half-written."""
    from mechopd.cli import main

    run = make_run(tmp_path / "run")
    damage(run / "probes" / "similarity.csv")
    assert main(["figures", str(run)]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and lines == lines[-1:] and needle in lines[-1], lines
    assert not [p for p in (run / "figures").glob(".*")] if (run / "figures").exists() else True
