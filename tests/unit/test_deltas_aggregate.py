"""Parameter deltas (mechopd.probes.deltas): the aggregates (sums of squares and inner products over the tensors of a
site, layer, module or the whole model) against whole state dicts, and the table's CSV / JSON round trip. The per-tensor
values are in test_deltas.py; the tiny checkpoints in delta_checkpoints.py."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from mechopd.core.errors import ConfigError
from mechopd.core.sites import site_of
from mechopd.probes.delta_rows import read_table, write_table
from mechopd.probes.delta_sums import aggregate_deltas
from tests.unit.delta_checkpoints import by_key, make_trio, run, state


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    """base / opd / nca Qwen3 checkpoints (tied), opd = base + u, nca = opd + v."""
    return make_trio(tmp_path_factory.mktemp("trio"))


# ----------------------------------------------------------------------------------------------- aggregates and io
def group_reference(trio, key) -> dict[tuple, float]:
    """Aggregates from whole state dicts: squares and inner products summed over the tensors of each group."""
    w0, a, b = (state(trio[k]) for k in ("base", "opd", "nca"))
    sums: dict = {}
    for name, w in w0.items():
        g = sums.setdefault(key(site_of(name)), [0.0] * 6)
        da, db = a[name] - w, b[name] - w
        for i, v in enumerate(
            ((w * w).sum(), (da * da).sum(), (db * db).sum(), (da * db).sum(), ((db - da) ** 2).sum(), w.numel())
        ):
            g[i] += float(v)
    return {
        k: (
            math.sqrt(s[0]),
            math.sqrt(s[1]),
            math.sqrt(s[2]),
            s[3] / math.sqrt(s[1] * s[2]),
            math.sqrt(s[4]),
            int(s[5]),
        )
        for k, s in sums.items()
    }


@pytest.mark.parametrize(
    "by, key",
    [
        ("site", lambda s: s.site),
        ("layer", lambda s: f"layers.{s.layer}" if s.layer is not None else s.site),
        ("module", lambda s: "layers.*." + s.site.split(".", 2)[2] if s.layer is not None else s.site),
        ("all", lambda s: "*"),
    ],
)
def test_aggregates_sum_squares_over_tensors(trio, by, key):
    rows = aggregate_deltas(run(trio), by)
    want = group_reference(trio, key)
    got = by_key(rows)
    assert {r.site for r in rows} == set(want) and {r.param for r in rows} == {"*"}
    for site, (w0, na, nb, cos, diff, numel) in want.items():
        assert got[("base", "", site, "*", "w0_norm")] == pytest.approx(w0, rel=1e-9)
        assert got[("opd", "base", site, "*", "delta_norm")] == pytest.approx(na, rel=1e-9)
        assert got[("nca", "base", site, "*", "rel_delta")] == pytest.approx(nb / w0, rel=1e-9)
        assert got[("nca", "opd", site, "*", "cos")] == pytest.approx(cos, abs=1e-9)
        assert got[("nca", "opd", site, "*", "delta_norm")] == pytest.approx(diff, rel=1e-9)
        assert {r.numel for r in rows if r.site == site} == {numel}


def test_site_aggregate_is_a_layer_by_module_grid(trio):
    rows = [r for r in aggregate_deltas(run(trio), "site") if r.model == "opd" and r.metric == "rel_delta"]
    grid = {(r.layer, r.module) for r in rows if r.layer is not None}
    modules = {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "q_norm",
        "k_norm",
        "gate_proj",
        "up_proj",
        "down_proj",
        "input_layernorm",
        "post_attention_layernorm",
    }
    assert grid == {(i, m) for i in range(2) for m in modules} and len(rows) == len(grid) + 2  # + embed, final_norm


def test_aggregate_rejects_aggregated_rows_and_unknown_levels(trio):
    rows = run(trio)
    with pytest.raises(ConfigError):
        aggregate_deltas(aggregate_deltas(rows, "site"), "all")
    with pytest.raises(ConfigError):
        aggregate_deltas(rows, "head")


def test_table_round_trips_through_csv_and_json(trio, tmp_path):
    rows = run(trio, pair=("opd", "nca")) + aggregate_deltas(run(trio), "all")
    rows += [dataclasses.replace(rows[0], metric="cos", value=math.nan), dataclasses.replace(rows[1], value=math.inf)]
    csv_path, json_path = write_table(rows, tmp_path / "probes" / "deltas.csv")
    assert (csv_path.name, json_path.name) == ("deltas.csv", "deltas.json")
    assert csv_path.read_text().splitlines()[0] == "model,vs,site,layer,module,param,numel,tied_to,metric,value"
    json.loads(json_path.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    for back, exact in ((read_table(csv_path), True), (read_table(json_path), False)):
        assert len(back) == len(rows)
        for r, s in zip(rows, back):
            assert r.__dict__ | {"value": 0} == s.__dict__ | {"value": 0}
            if math.isfinite(r.value) or exact:  # CSV keeps nan / inf; JSON writes every non-finite value as null
                assert r.value == s.value or (math.isnan(r.value) and math.isnan(s.value))
            else:
                assert math.isnan(s.value)
    assert json.loads(json_path.read_text())[-1]["value"] is None  # the inf row
