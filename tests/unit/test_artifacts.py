"""mechopd.core.artifacts: one non-finite policy for every writer, atomic files, typed summaries; the report shows the
teachability interval that the probe writes (one schema: ci_low / ci_high)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mechopd.core import artifacts as A
from mechopd.core.errors import ConfigError, DataError
from mechopd.probes.deltas import DeltaSummary
from mechopd.probes.gradients import GradientSummary
from mechopd.probes.similarity import SimilaritySummary
from mechopd.probes.teachability import TeachabilitySummary

ROWS = [{"a": 1.5, "b": math.nan, "c": None}, {"a": math.inf, "b": -math.inf, "c": "x"}]


def _strict(text: str):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_json_writes_every_non_finite_value_as_null(tmp_path):
    doc = {
        "x": [math.nan, math.inf, -math.inf, 0.25],
        "y": np.float64("nan"),
        "z": (1, np.int64(2)),
        "p": tmp_path / "f",
    }
    back = _strict(A.write_json(tmp_path / "d.json", doc).read_text())
    assert back == {"x": [None, None, None, 0.25], "y": None, "z": [1, 2], "p": str(tmp_path / "f")}
    assert [A.read_float(v) for v in back["x"]][3] == 0.25 and math.isnan(A.read_float(None))


def test_csv_keeps_nan_and_inf_and_writes_none_empty(tmp_path):
    text = A.write_csv(tmp_path / "t.csv", ROWS).read_text().splitlines()
    assert text == ["a,b,c", "1.5,nan,", "inf,-inf,x"]
    back = A.read_csv(tmp_path / "t.csv")
    assert A.read_float(back[1]["a"]) == math.inf and math.isnan(A.read_float(back[0]["b"]))
    assert math.isnan(A.read_float(back[0]["c"]))  # empty cell -> NaN


def test_write_rows_by_suffix_and_refuses_other_suffixes(tmp_path):
    assert _strict(A.write_rows(ROWS, tmp_path / "r.json").read_text())[1] == {"a": None, "b": None, "c": "x"}
    assert A.write_rows(ROWS, tmp_path / "r.csv").read_text().startswith("a,b,c\n")
    with pytest.raises(ConfigError, match=".csv or .json"):
        A.write_rows(ROWS, tmp_path / "r.txt")


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    target = A.write_json(tmp_path / "keep.json", {"v": 1})

    def boom(fh):
        fh.write("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        A.atomic_write(target, boom)
    assert _strict(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["keep.json"]


def test_the_probe_writers_follow_the_policy(tmp_path):
    from mechopd.probes import delta_rows, gradients, teachability_rescore

    row = gradients.GradRow("opd", "nca", "global", None, "", 3, 0.0, 0.0, 1.0, math.nan, 0.0, 0.1, 0.2)
    gradients.write_gradients([row], tmp_path, {"response_tokens": 4})
    doc = _strict((tmp_path / "gradients.json").read_text())
    assert doc["cos"] is None and doc["rows"][0]["cos"] is None and doc["settings"]["response_tokens"] == 4
    assert "nan" in (tmp_path / "gradients.csv").read_text()
    d = delta_rows.DeltaRow("opd", "base", "embed", None, "embed_tokens", "weight", 4, "", "rel_delta", math.inf)
    csv_path, json_path = delta_rows.write_table([d], tmp_path / "deltas")
    assert _strict(json_path.read_text())[0]["value"] is None and csv_path.read_text().splitlines()[1].endswith("inf")
    table = {c: np.array([math.nan, 1.0]) for c in teachability_rescore.COLUMNS}
    assert teachability_rescore.write_table(table, tmp_path / "tok.csv").read_text().splitlines()[1].startswith("nan,")


def test_summaries_round_trip_with_nan_as_null(tmp_path):
    s = GradientSummary("opd", "nca", "opd", math.nan, 2.0, 0.1, 0.2, 7, {"n": 3})
    path = s.save(tmp_path, rows=[{"x": 1}])
    assert _strict(path.read_text())["cos"] is None
    back = GradientSummary.load(tmp_path)
    assert math.isnan(back.cos) and back.norm_ratio == 2.0 and back.settings == {"n": 3}
    assert SimilaritySummary.load(tmp_path / "absent") is None
    (tmp_path / DeltaSummary.FILE).write_text(json.dumps({"models": ["opd"]}))
    with pytest.raises(DataError, match="rel_delta"):
        DeltaSummary.load(tmp_path)


def _teach_summary(ci_low, ci_high) -> dict:
    gap = {"estimate": 0.0123, "ci_low": ci_low, "ci_high": ci_high, "ci": 0.95, "n_boot": 50}
    return {
        "n_tokens": 10,
        "n_sequences": 4,
        "means": {},
        "buckets": {},
        "gap": {"gain_abs": gap, "gain_rel": gap},
        "regression": {},
        "settings": {},
    }


@pytest.mark.parametrize(
    "low,high,shown",
    [(0.001, 0.0456, "0.0123 [0.0010, 0.0456] (95% sequence bootstrap)"), (None, None, "0.0123 (interval undefined")],
)
def test_report_shows_the_teachability_interval(tmp_path: Path, low, high, shown):
    """report.md reads the interval the probe writes (ci_low / ci_high), not keys it never writes."""
    from mechopd.report import write_report_md

    run = tmp_path / "run"
    A.write_json(run / "probes" / TeachabilitySummary.FILE, _teach_summary(low, high))
    GradientSummary("opd", "nca", "opd", -0.05, 3.5, 0.1, 0.2, 40).save(run / "probes")
    text = write_report_md(run).read_text()
    assert f"High-support gain gap** (Q3: low entropy, high divergence; high-C − low-C tercile): {shown}" in text
    assert "cos(∇opd, ∇nca) at the opd checkpoint: -0.050" in text
