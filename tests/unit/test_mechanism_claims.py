"""The intervention claims (mechopd.report.mechanism_claims) on synthetic probe artifacts written in the probes' formats:
every verdict is reachable and the values come from the files."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechopd.core.artifacts import write_csv, write_json
from mechopd.probes import mechanism_stats as ms
from mechopd.probes.delta_svd import COLUMNS as SVD_COLUMNS
from mechopd.probes.delta_svd import CSV, JSON, summarize_svd
from mechopd.probes.weightpatch import COLUMNS, summarize
from mechopd.report import mechanism_claims as mc
from mechopd.report.verdicts import FAILS, HOLDS, NA, NA_FRAGILE
from mechopd.runset import RunSet


def _wp_rows(acc: float, qk: float, vo: float, ctrl: float, harm: float = 0.4, harm_qk: float = 0.0) -> list[dict]:
    def row(layer, module, acc_x, h, draw=""):
        r = {c: None for c in COLUMNS}
        r.update(
            model="opd",
            donor="base",
            layer=layer,
            module=module,
            draw=draw,
            n_params=100,
            n=50,
            acc_x=acc_x,
            acc_xc=0.5,
            harm=h,
            d_acc_x=acc_x - acc,
            d_harm=None if h is None else h - harm,
        )
        return r

    return [
        row("none", "none", acc, harm),
        row("all", "qk", acc - qk, harm_qk),
        row("all", "vo", acc - vo, harm),
        *(row("all", "ctrl_qk", acc - ctrl + 0.01 * j, harm, j) for j in range(3)),
    ]


def _svd_rows(mlp_dsq: float, e90: float, overlap: float) -> list[dict]:
    from tests.unit.claim_probes import svd_rows

    return svd_rows(mlp_dsq, e90, overlap)


def _run(root: Path, wp: list[dict] | None, svd: list[dict] | None) -> RunSet:
    probes = root / "probes"
    probes.mkdir(parents=True)
    if wp is not None:
        write_csv(probes / "weightpatch.csv", wp, COLUMNS)
        write_json(probes / "weightpatch.json", {"probe": "weightpatch", "settings": {}, "summary": summarize(wp)})
    if svd is not None:
        write_csv(probes / CSV, svd, SVD_COLUMNS)
        write_json(probes / JSON, {"settings": {}, "summary": summarize_svd(svd)})
    return RunSet.of_models(root, "rules", {"base": root / "b", "opd": root / "o"})


def _items_run(root: Path, qk: float, vo: float, ctrl: float, harm_qk: float = 0.3) -> RunSet:
    """A seed whose weightpatch_items.jsonl holds per-item outcomes: OPD Acc_x 0.95, Harm 0.3; each group's
    reversion removes ``qk`` / ``vo`` / ``ctrl`` of Acc_x (and q+k leaves Harm ``harm_qk``)."""
    from tests.unit.claim_probes import _write_weightpatch

    run = _run(root, None, None)
    _write_weightpatch(
        run.probes_dir,
        {
            "none": (0.95, 0.65, 0.3),
            "qk": (0.95 - qk, 0.65 - qk, harm_qk),
            "vo": (0.95 - vo, 0.65 - vo, 0.3),
            "ctrl": (0.95 - ctrl, 0.65 - ctrl, 0.3),
        },
    )
    return run


@pytest.mark.parametrize(
    "qk, vo, ctrl, verdict",
    [
        ([0.6, 0.5, 0.55], [0.1, 0.0, 0.05], [0.0, 0.05, 0.02], HOLDS),
        ([0.0, 0.05, 0.0], [0.5, 0.4, 0.6], [0.5, 0.45, 0.4], FAILS),
        ([0.6, 0.0, 0.3], [0.1, 0.5, 0.05], [0.0, 0.4, 0.02], NA_FRAGILE),
    ],
)
def test_qk_causal_rule_verdicts_from_items(tmp_path, qk, vo, ctrl, verdict):
    runs = [_items_run(tmp_path / f"s{i}", qk[i], vo[i], ctrl[i]) for i in range(3)]
    row = mc.claim_qk_causal_rule(runs)
    assert row["verdict"] == verdict, row
    stat = ms.qk_margin_stat(runs, "opd", "vo")
    assert stat["values"] == pytest.approx([q - v for q, v in zip(qk, vo)], abs=0.006)  # 200 items: 1/200 steps
    assert stat["low"] < stat["mean"] < stat["high"] and "hierarchical" in stat["method"]


def test_qk_margin_seed_reader_matches_the_table(tmp_path):
    runs = [_run(tmp_path / f"s{i}", _wp_rows(1.0, 0.6, 0.1, 0.2), None) for i in range(1)]
    assert mc.qk_margin(runs[0], "opd", "vo") == pytest.approx(0.5)
    assert mc.qk_margin(runs[0], "opd", "ctrl_qk") == pytest.approx(0.6 - (0.2 - 0.01))  # mean of 3 draws


def test_qk_claims_not_measurable(tmp_path):
    runs = [_items_run(tmp_path / f"z{i}", 0.0, 0.0, 0.0, harm_qk=0.3) for i in range(2)]
    for r in runs:  # OPD right on no item without c: no rule internalised, nothing to remove
        _write_zero(r)
    assert mc.claim_qk_causal_rule(runs)["verdict"] == mc.NA_NO_RULE
    none = [_run(tmp_path / f"n{i}", None, None) for i in range(2)]
    assert mc.claim_qk_causal_harm(none)["verdict"] == NA
    legacy = [_run(tmp_path / f"l{i}", _wp_rows(1.0, 0.5, 0.0, 0.0), None) for i in range(2)]  # no per-item outcomes
    assert mc.claim_qk_causal_rule(legacy)["verdict"] == mc.NA_NO_ITEMS
    one = [_items_run(tmp_path / "h", 0.5, 0.0, 0.0, harm_qk=0.0)]
    out = mc.claim_qk_causal_harm(one)
    assert out["verdict"] == HOLDS and "one seed" in out["measured"]


def _write_zero(run: RunSet) -> None:
    from tests.unit.claim_probes import _write_weightpatch

    _write_weightpatch(
        run.probes_dir,
        {"none": (0.0, 0.6, None), "qk": (0.0, 0.5, None), "vo": (0.0, 0.5, None), "ctrl": (0.0, 0.5, None)},
    )


@pytest.mark.parametrize(
    "mlp, e90, overlap, verdict",
    [
        (9.0, 0.05, 0.1, HOLDS),  # MLP-heavy, sparse, away from W0's directions
        (9.0, 0.40, 0.1, FAILS),  # dense
        (0.5, 0.05, 0.1, FAILS),  # not MLP-heavy
        (9.0, 0.05, 0.6, FAILS),  # aligned with W0's directions
    ],
)
def test_sparse_update_verdicts(tmp_path, mlp, e90, overlap, verdict):
    runs = [
        _run(tmp_path / f"s{i}", None, _svd_rows(mlp * (1 + 0.01 * i), e90 + 0.001 * i, overlap + 0.001 * i))
        for i in range(3)
    ]
    assert mc.claim_sparse_update(runs)["verdict"] == verdict
    assert mc.svd_value(runs[0], "opd", "mlp_energy_share") == pytest.approx(mlp / (1 + mlp))


def test_claims_have_the_table_shape():
    assert [k for k, *_ in mc.MECHANISM_CLAIMS] == ["qk_causal_rule", "qk_causal_harm", "sparse_update"]
    assert all(callable(fn) and claim and paper for _, claim, paper, fn in mc.MECHANISM_CLAIMS)


def _loc_run(root: Path, harms: dict[str, float], clean: float, n: int = 40) -> RunSet:
    """A seed's localization.csv / .json and localization_items.jsonl: ``n`` items, all right without c, a share
    ``clean`` flipping unpatched and ``harms[site]`` flipping after patching ``site``."""
    from mechopd.core.artifacts import write_jsonl
    from mechopd.probes.localization import COLUMNS as LOC

    run = _run(root, None, None)
    rows = [
        {c: None for c in LOC}
        | {"model": "opd", "donor": "x", "site": s, "layer": None, "depth": d, "harm": h, "harm_clean": clean}
        for d, (s, h) in enumerate(harms.items())
    ]
    write_csv(run.probes_dir / "localization.csv", rows, LOC)
    write_json(
        run.probes_dir / "localization.json",
        {
            "summary": {
                "model": "opd",
                "donor": "x",
                "harm_clean": clean,
                "n_right": n,
                "removed_share": 0.9,
                "removed_at": "final_norm",
            },
            "settings": {},
        },
    )
    write_jsonl(
        run.probes_dir / "localization_items.jsonl",
        [
            {
                "uid": f"u{i}",
                "prompt_ids_x": [1],
                "prompt_ids_c": [2],
                "response_ids": [3],
                "right_x": True,
                "flips_clean": i < round(clean * n),
                "flips": {s: i < round(h * n) for s, h in harms.items()},
            }
            for i in range(n)
        ],
    )
    return run


def test_localization_table_bootstraps_over_seeds_and_items(tmp_path):
    sites = ("embed", "layers.0.resid_post", "final_norm")
    per_seed = ([0.5, 0.4, 0.0], [0.6, 0.3, 0.0], [0.55, 0.35, 0.0], [0.55, 0.35, 0.0])  # 2 seeds (t = 12.7): fragile
    runs = [_loc_run(tmp_path / f"s{i}", dict(zip(sites, h)), 0.6) for i, h in enumerate(per_seed)]
    lines = mc.localization_table(runs)
    text = "\n".join(lines)
    row = next(line for line in lines if line.startswith("| layers.0.resid_post"))
    want = ms.site_harm_stat(runs, "layers.0.resid_post")
    assert want["mean"] == pytest.approx(0.35) and "hierarchical" in want["method"]
    assert f"{want['mean']:.3f} [{want['low']:.3f}, {want['high']:.3f}]" in row  # the bootstrap, not a t interval
    assert 0.0 <= want["low"] < 0.35 < want["high"] <= 1.0
    assert "removing" not in text and "**final_norm**" in text and row.endswith(f"| {FAILS} |")
    # a seed whose deep layer leaves the harm: that site is no longer decided, and no site removes it
    runs.append(_loc_run(tmp_path / "s9", dict(zip(sites, [0.6, 0.5, 0.6])), 0.6))
    assert "**none**" in "\n".join(mc.localization_table(runs))
    assert mc.localization_table([_run(tmp_path / "empty", None, None)]) == []
