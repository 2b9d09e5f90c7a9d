"""Hostile inputs, `mechopd run STUDY.yaml` (#41): the whole study is checked before the first file or job.

Every key, path, model and option of a study (each probe's options included) is checked in one pass before anything is
written: a probe option its probe would refuse, a student that is a file, has NaN weights or only a pickled ``.bin``,
a teacher whose tokenizer is another model's: exit 2, one ``error:`` line, the workspace and the models unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.cli.hostile import Hostile, check_in_workspace, copy_org, write
from tests.cli.reliability_harness import pickle_only, poison


def study(w: Path, student: str | Path, **more) -> list[str]:
    """``w/s.yaml``: a one-seed OPD study of ``student`` on rules (one step), run into ``w/out``."""
    doc = {
        "task": "rules",
        "student": str(student),
        "seeds": [0],
        "train": {"steps": 1, "batch_size": 2, "estimator": "full"},
        "runs": {"opd": {"method": "opd"}},
        "eval": {"n": 2, "other_contexts": False},
        **more,
    }
    write(w, "s.yaml", yaml.safe_dump(doc, sort_keys=False))
    return ["run", str(w / "s.yaml"), "--out", str(w / "out")]


def _zoo_qwen3() -> Path:
    from mechopd.testing.zoo import build_zoo

    return Path(build_zoo().student("qwen3"))


CASES = [
    Hostile(
        "probe-option",
        "weightpatch-modules-bogus",
        lambda o, w: study(w, copy_org(o, w), probes={"weightpatch": {"modules": "qk,bogus"}}),
        "bogus",
    ),
    Hostile(
        "probe-option",
        "weightpatch-layers-text",
        lambda o, w: study(w, copy_org(o, w), probes={"weightpatch": {"layers": "0,x"}}),
        "neither a layer index nor 'all'",
    ),
    Hostile(
        "probe-option",
        "gradients-one-term",
        lambda o, w: study(w, copy_org(o, w), probes={"gradients": {"terms": "opd"}}),
        "must name two terms",
    ),
    Hostile(
        "probe-option",
        "donor-not-a-role",
        lambda o, w: study(w, copy_org(o, w), probes={"weightpatch": {"donor": "./nowhere"}}),
        "reads the role(s) ./nowhere, which the study lacks",
    ),
    Hostile("model", "student-is-a-file", lambda o, w: study(w, write(w, "afile", "precious\n")), "afile"),
    Hostile("model", "student-nan-weights", lambda o, w: study(w, poison(copy_org(o, w), float("nan"))), "NaN/inf"),
    Hostile("model", "student-pickle-only", lambda o, w: study(w, pickle_only(o, w)), "pickle"),
    Hostile(
        "model",
        "teacher-nan-weights",
        lambda o, w: study(w, copy_org(o, w), teacher=str(poison(copy_org(o, w, "t"), float("inf")))),
        "NaN/inf",
    ),
    Hostile(
        "model",
        "teacher-another-tokenizer",
        lambda o, w: study(w, copy_org(o, w), teacher=str(_zoo_qwen3())),
        "tokenizers differ",
    ),
    Hostile(
        "model",
        "checkpoint-nan-weights",
        lambda o, w: study(w, copy_org(o, w), runs={"old": {"checkpoint": str(poison(copy_org(o, w, "c"), 1e400))}}),
        "runs.old.checkpoint",
    ),
    Hostile(
        "model",
        "checkpoint-another-tokenizer",
        lambda o, w: study(w, copy_org(o, w), runs={"old": {"checkpoint": str(_zoo_qwen3())}}),
        "the student and runs.old.checkpoint tokenizers differ",
    ),
    Hostile(
        "study",
        "checkpoint-and-a-training-field",
        lambda o, w: study(w, copy_org(o, w), runs={"old": {"checkpoint": str(copy_org(o, w, "c")), "beta": 0.5}}),
        "runs.old names a checkpoint and sets beta",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.cls}-{c.name}" for c in CASES])
def test_a_bad_study_is_refused_before_any_file(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    check_in_workspace(case, Path(tiny_rules_organism), tmp_path, monkeypatch, capsys)
    assert not (tmp_path / "ws" / "out").exists()


def test_a_finished_study_rerun_on_another_model_of_the_same_name_is_refused(
    tiny_rules_organism, tmp_path, monkeypatch, capsys
):
    """``student: ./base`` finished from one folder, rerun from another where ``./base`` is another model: the
    finished run is not reused as this model's results (it compares content, not names); nothing changes."""
    from tests.cli.hostile import Case, _run, snapshot

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    copy_org(Path(tiny_rules_organism), a, "base")
    poison(copy_org(Path(tiny_rules_organism), b, "base"), 0.5)  # another model, finite, the same name
    out = tmp_path / "out"
    monkeypatch.chdir(a)
    argv = [*study(a, "./base")[:2], "--out", str(out)]
    assert _run(Case("stale", "first", lambda o, w: argv, ""), argv, a, capsys)[0] == 0
    monkeypatch.chdir(b)
    argv = [*study(b, "./base")[:2], "--out", str(out)]
    before = snapshot(out, b)
    code, err = _run(Case("stale", "second", lambda o, w: argv, ""), argv, b, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    # the study files sit in two folders, so their `./base` resolves to two paths (a study's relative paths mean its
    # file's folder): refused as another study's run, by the resolved student, before any content is compared
    assert lines[-1].startswith("error:") and "keys that differ: student" in lines[-1], lines
    assert snapshot(out, b) == before


def test_eval_scores_a_distilled_student_on_the_rule_it_was_trained_with(tiny_rules_organism, tmp_path, capsys):
    """`mechopd eval --task rules --compare base=ORG opd=RUN/final` where opd was distilled with ``rule: reverse``:
    every model is scored on reverse (the record's options), not on the task's default rule; two models trained on
    different rules are refused with one line (unless --option picks one)."""
    import json

    from mechopd.cli import main
    from tests.cli.hostile import train

    org = str(tiny_rules_organism)
    for name, rule in (("rev", "reverse"), ("shift2", "shift:2")):
        argv = train(org, tmp_path, "--task", "rules", "--option", f"rule={rule}")
        argv[argv.index("--out") + 1] = str(tmp_path / name)
        assert main(argv) == 0, capsys.readouterr().err
    cmp = ["eval", "--task", "rules", "--n", "2", "--out", str(tmp_path / "cmp"), "--compare", f"base={org}"]
    assert main([*cmp, f"opd={tmp_path / 'rev' / 'final'}"]) == 0, capsys.readouterr().err
    for label in ("base", "opd"):
        doc = json.loads((tmp_path / "cmp" / f"{label}.json").read_text())
        assert doc["settings"]["task_options"] == {"rule": "reverse"}, (label, doc["settings"])
    capsys.readouterr()
    both = ["eval", "--task", "rules", "--n", "2", "--out", str(tmp_path / "c2"), "--compare"]
    assert main([*both, f"a={tmp_path / 'rev'}/final", f"b={tmp_path / 'shift2'}/final"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "different rule" in lines[0], lines
    assert not (tmp_path / "c2").exists()


def test_the_report_says_how_the_study_ran_and_shows_paths_as_text(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    """A study with ``other_contexts: false`` and ``n_boot: 50``, its student in a folder whose name holds a newline, a
    heading and an ``<img onerror>``: report.md's eval line reproduces that evaluation (no --other-contexts, --n-boot
    50), and the folder's name is text (no live element, no heading: every line outside code is escaped)."""
    from mechopd.cli import main

    monkeypatch.chdir(tmp_path)
    evil = copy_org(Path(tiny_rules_organism), tmp_path, "org\n# Injected <img src=x onerror=alert(1)>")
    argv = study(tmp_path, evil, eval={"n": 2, "other_contexts": False, "n_boot": 50})
    assert main(argv) == 0, capsys.readouterr().err
    report = (tmp_path / "out" / "report.md").read_text()
    line = next(ln for ln in report.splitlines() if ln.startswith("mechopd eval "))
    assert "--other-contexts" not in line and "--n-boot 50" in line, line
    assert not [ln for ln in report.splitlines() if ln.startswith("# Injected")], report
    outside = [ln for ln in report.split("```bash")[0].splitlines() if "<img" in ln]
    assert all(ln.count("`") >= 2 and "\\n" in ln for ln in outside), outside  # inside a one-line code span


def test_a_rerun_after_a_kill_between_a_probes_two_files_runs_that_probe_again(
    tiny_rules_organism, tmp_path, monkeypatch, capsys
):
    """A finished study whose similarity probe was cut between its files (a kill during a ``--force`` rerun's commit:
    the manifest gone, one table renamed in, the other not): the rerun is not "done", it runs that probe again and
    leaves its whole file set."""
    from mechopd.cli import main
    from mechopd.core.artifacts import FileSet

    monkeypatch.chdir(tmp_path)
    argv = study(
        tmp_path,
        copy_org(Path(tiny_rules_organism), tmp_path),
        probes={"similarity": {"n": 2, "models": ["base", "opd"]}},
    )
    assert main(argv) == 0, capsys.readouterr().err
    probes = tmp_path / "out" / "probes"
    assert FileSet.complete(probes, "similarity", ("similarity.csv", "similarity.json"))
    FileSet.manifest_path(probes, "similarity").unlink()
    (probes / "similarity.json").unlink()
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    assert "nothing to run" not in capsys.readouterr().out
    assert FileSet.complete(probes, "similarity", ("similarity.csv", "similarity.json"), verify=True)


def test_an_eval_file_named_with_markup_is_text_in_the_report(tmp_path):
    """``eval/x\\n# H <img onerror>.json`` beside a run's reports (a file's name, not a checked label): report.md
    shows the name as one-line code, neither a heading nor an element."""
    import shutil

    from mechopd.report import write_report_md
    from tests.unit.plotting_run import make_run

    run = make_run(tmp_path / "run")
    shutil.copy(run / "eval" / "opd.json", run / "eval" / "x\n# H <img src=x onerror=alert(1)>.json")
    report = write_report_md(run).read_text()
    assert not [ln for ln in report.splitlines() if ln.startswith("# H")], report
    prose = report.split("```bash")[0].splitlines()
    assert all(ln.count("`") >= 2 and "\\n" in ln for ln in prose if "<img" in ln), [ln for ln in prose if "<img" in ln]
