"""Every row decided over seeds that differ (#44): each holds / does-not-hold case of `test_claims.CASES`, run over
three seeds jittered around it (every quantity the rows read moves a little from seed to seed; the case's own
changes win where they set the same field), reaches the same verdict — the few-seed interval still decides a clear
case — and the rows that #44's audit found decided on what they cannot show say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechopd.report import claims, multiplicity, verdicts
from tests.unit.claim_runs import seed_runs
from tests.unit.test_claims import CASES, F, H

SEEDS = 3


def jitter(k: int) -> dict:
    """Seed k's small moves of every quantity the rows read (k = 0, 1, 2)."""
    return {
        "acc_x": {"opd": 0.95 + 0.005 * k, "nca": 0.96 - 0.0025 * k},  # NCA − OPD: 3 seeds clear Holm's 0.025 / 4
        "harm": {"opd": 0.3 + 0.02 * k},
        "follow": {"opd": (0.9 - 0.01 * k, 0.9 - 0.01 * k), "nca": (0.95 - 0.005 * k, 0.95 - 0.005 * k)},
        "cos": {"base": [0.9 - 0.01 * k, 0.8, 0.7], "opd": [0.99, 0.97 - 0.005 * k, 0.95]},
        "lens": {"opd": [0.04, 0.5 + 0.05 * k, 0.6, 0.6]},
        "gcos": (0.02 + 0.005 * k, 0.4 + 0.02 * k),
        "qk_factor": 2.0 + 0.1 * k,
        "spread": {"DL": 5.0 + 0.2 * k},
        "wp": {"ctrl": (0.93 - 0.01 * k, 0.63, 0.3)},
        "svd": {"mlp": 9.0 + 0.5 * k, "overlap": 0.1 + 0.01 * k},
        "loc": {"clean": 0.6 + 0.02 * k},
    }


def merged(k: int, case: dict) -> dict:
    """`jitter(k)` under the case's changes: a dict field merged key by key (the case wins), anything else replaced."""
    out = jitter(k)
    for key, value in case.items():
        plain = key.rstrip("_")
        if isinstance(value, dict) and isinstance(out.get(plain), dict) and not key.endswith("_"):
            out[plain] = {**out[plain], **value}
        else:
            out.pop(plain, None)
            out[key] = value
    return out


@pytest.mark.parametrize(("key", "verdict"), [(k, v) for k, vs in CASES.items() for v in (H, F) if v in vs])
def test_each_row_decides_over_seeds_that_differ(tmp_path: Path, key: str, verdict: str) -> None:
    case = CASES[key][verdict][0]
    runs = seed_runs(tmp_path, *(merged(k, case) for k in range(SEEDS)))
    row = {c.key: c for c in claims.evaluate_claims(runs, only={key})}[key]
    assert row.verdict == verdict, (key, row.measured)


def test_a_small_qk_excess_is_not_concentration(tmp_path: Path) -> None:
    """1.10–1.16× the other projections' relative update (the demo's 1.13×) is below the 1.5× bar: does not hold."""
    runs = seed_runs(tmp_path, *({"qk_factor": f} for f in (1.10, 1.13, 1.16)))
    row = {c.key: c for c in claims.evaluate_claims(runs, only={"qk"})}["qk"]
    assert row.verdict == verdicts.FAILS and "≥ 1.5" in row.criterion


def test_lens_row_says_which_depths_it_read(tmp_path: Path) -> None:
    row = {c.key: c for c in claims.evaluate_claims(seed_runs(tmp_path, {}, jitter(1)), only={"nca_lens"})}["nca_lens"]
    assert "read 2 of 4 depths" in row.measured and "every depth where the base's views differ" in row.claim


def test_a_collapsed_nca_removes_nothing_it_could_show(tmp_path: Path) -> None:
    dead = {"acc_x": {"nca": 0.0}, "acc_xc": {"nca": 0.0}, "harm": {"nca": None}}
    runs = seed_runs(tmp_path, *(merged(k, dead) for k in range(SEEDS)))
    got = {c.key: c for c in claims.evaluate_claims(runs)}
    assert got["nca_removes"].verdict == claims.NA_COLLAPSED and got["degradation"].verdict == verdicts.HOLDS


def test_the_multiplicity_line_counts_what_chance_alone_decides() -> None:
    """17 rows at ≤ 5 % each: 0.85 expected by chance; P(≥ 3) = 0.0503 > 5 %, P(≥ 4) = 0.0109: the line says 4."""
    import math

    expect, k = multiplicity.chance_decisions(17)
    tail = lambda j: sum(math.comb(17, i) * 0.05**i * 0.95 ** (17 - i) for i in range(j, 18))  # noqa: E731
    assert expect == pytest.approx(0.85) and k == 4 and tail(3) > 0.05 >= tail(4)
    rows = [claims.Claim("a", "x", "", "", verdicts.HOLDS, ""), claims.Claim("b", "y", "", "", verdicts.NA_FRAGILE, "")]
    note = claims.claims_markdown(rows).splitlines()[-1]
    assert note.startswith("Multiplicity: 2 rows") and "This table decides 1" in note


def test_holm_over_the_confirmatory_rows_leaves_the_exploratory_ones_alone() -> None:
    """p 0.001, 0.004 pass Holm's steps 0.025/4, 0.025/3; 0.015 fails 0.025/2 and so does every later one; an
    exploratory row decided at p 0.02 stays decided, labelled exploratory (#53)."""
    ps = {"degradation": 0.004, "nca_removes": 0.015, "nca_keeps": 0.001, "ta_opd": 0.02, "cosine_order": 0.02}
    rows = [claims.Claim(k, k, "", "m", verdicts.HOLDS, "", p=p) for k, p in ps.items()]
    multiplicity.holm(rows)
    got = {r.key: r.verdict for r in rows}
    assert got == {**{k: verdicts.HOLDS for k in ps}, "nca_removes": verdicts.NA_FRAGILE, "ta_opd": verdicts.NA_FRAGILE}
    assert "p = 0.015 > 0.0125 at step 3" in rows[1].measured
    assert [r.family for r in rows] == ["confirmatory"] * 4 + ["exploratory"]
