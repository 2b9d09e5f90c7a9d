"""Cluster resampling inside a seed (#53 item 4): the evaluation saves each item's cluster where the task names one
(``meta["cluster"]``: the facts task's fact), the claims' item level resamples whole clusters, and a task without
clusters writes and reads exactly what it did."""

from __future__ import annotations

import json
from pathlib import Path

from mechopd.evaluation.evaluate import item_cluster
from mechopd.report.seed_items import eval_clusters, metric_stat, other_clusters
from mechopd.runset import RunSet
from mechopd.tasks.base import Example
from tests.unit.claim_runs import seed_runs


def test_the_record_carries_the_cluster_only_where_the_task_names_one() -> None:
    assert item_cluster(Example("f001.q03", "q", "c", "a", {"fact": "f001", "cluster": "f001"})) == {"cluster": "f001"}
    assert item_cluster(Example("u1", "q", "c", "a", {"rule": "shift:2"})) == {}


def test_the_facts_task_names_each_items_fact_as_its_cluster() -> None:
    from mechopd.tasks import get_task

    items = get_task("facts").examples("test", 8, 0)
    assert all(e.meta["cluster"] == e.uid.partition(".q")[0] for e in items)


def _cluster(run: Path, size: int) -> None:
    """Every role's records (and other-context records) in clusters of ``size`` consecutive items."""
    for path in (run / "eval").glob("*.json"):
        doc = json.loads(path.read_text())
        for r in doc["records"]:
            r["cluster"] = f"fact{int(r['uid'][1:]) // size}"
        path.write_text(json.dumps(doc))


def test_clustered_records_widen_a_one_seed_interval_and_unclustered_ones_read_as_before(tmp_path: Path) -> None:
    """One seed, OPD Acc_x 0.55 with the right items contiguous: in clusters of 10 items (a fact's paraphrases share
    their outcome) the interval is wider than the item resample's; without a cluster key nothing changes."""
    plain, clustered = (seed_runs(tmp_path / k, {"acc_x": {"opd": 0.55}})[0] for k in ("a", "b"))
    _cluster(clustered, 10)
    sp, sc = RunSet.load(plain), RunSet.load(clustered)
    assert eval_clusters(sp, ("opd",)) is None and other_clusters(sp, "opd") is None
    ids = eval_clusters(sc, ("opd", "base"))
    assert ids is not None and len(set(ids.tolist())) == len(ids) // 10
    assert other_clusters(sc, "opd") is not None
    a, b = metric_stat([sp], "opd", "acc_x"), metric_stat([sc], "opd", "acc_x")
    assert a["mean"] == b["mean"] and b["high"] - b["low"] > 1.5 * (a["high"] - a["low"]), (a, b)
    assert b["df"] == len(ids) // 10 - 1
