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
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.cls}-{c.name}" for c in CASES])
def test_a_bad_study_is_refused_before_any_file(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    check_in_workspace(case, Path(tiny_rules_organism), tmp_path, monkeypatch, capsys)
    assert not (tmp_path / "ws" / "out").exists()
