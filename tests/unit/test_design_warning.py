"""Before the first job, a study says which core claim rows its seeds × items cannot decide (#54 item 2,
`mechopd.report.design`), from the MDE rule the report uses afterwards."""

from __future__ import annotations

import pytest

from mechopd.core.stats import mde
from mechopd.pipeline.demo import DemoConfig, _warn_design
from mechopd.report.design import CORE, design_lines, planned


def test_a_one_seed_eight_item_study_cannot_decide_the_core_rows() -> None:
    lines = design_lines(1, 8)
    assert lines[0] == "design: 1 seed × 8 items: cannot decide 4 of 4 core rows (planned MDE at 80 % power > SESOI):"
    assert all(any(line.strip().startswith(k + ":") for line in lines) for k in CORE)
    assert "one seed: no seed interval" in lines[-1]


def test_a_large_study_is_told_it_can_see_its_effects() -> None:
    assert design_lines(20, 400) == [
        "design: 20 seeds × 400 items: the core rows can see their smallest effects of interest (planned MDE ≤ SESOI)"
    ]


def test_the_planned_mde_is_the_reports_mde_rule_and_the_design_it_names_would_decide() -> None:
    size, need = planned(3, 200)["degradation"]
    assert size == pytest.approx(mde({"se": (0.16 / 300) ** 0.5, "df": 2}))
    assert need is not None and planned(need[0], need[1] * 2)["degradation"][0] <= CORE["degradation"][1]


def test_the_demo_prints_it_before_its_first_job(capsys: pytest.CaptureFixture[str]) -> None:
    _warn_design(DemoConfig(seeds=1, eval_n=8))
    out = capsys.readouterr().out
    assert "design: 1 seed × 8 items: cannot decide 4 of 4 core rows" in out and "nca_keeps" in out
