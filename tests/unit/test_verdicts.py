"""verdicts.decide: a quantity of a several-seed study defined in one seed only is fragile, not decided."""

from __future__ import annotations

from mechopd.core.stats import seed_stat
from mechopd.report.verdicts import FAILS, HOLDS, NA, NA_FRAGILE, decide


def test_one_defined_value_of_a_three_seed_study_is_fragile_not_a_verdict():
    stat = {**seed_stat([0.05, None, None]), "of": 3}
    d = decide(stat, 0.1, "<=", "at the OPD checkpoint")
    assert d.verdict == NA_FRAGILE and "defined in 1 of 3 seeds" in d.note
    # a one-seed study still decides on its value (marked), and a study without "of" behaves as before
    assert decide({**seed_stat([0.05]), "of": 1}, 0.1, "<=").verdict == HOLDS
    assert decide(seed_stat([0.05]), 0.1, "<=").verdict == HOLDS
    assert decide({**seed_stat([0.2, 0.21, 0.22]), "of": 3}, 0.1, "<=").verdict == FAILS
    assert decide({**seed_stat([None, None]), "of": 2}, 0.1, "<=").verdict == NA
