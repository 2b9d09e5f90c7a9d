"""`mechopd probe cache` and ``--cache DIR``: similarity and lens read from the activation store give the numbers they
give without it; shards stay within their size; the manifest names items, sites, dtype, paths and weight hashes; a
store of other items or without a requested site is refused."""

from __future__ import annotations

import csv
import hashlib
import json

import pytest
import torch
from safetensors import safe_open

from mechopd.cli import main
from mechopd.config import TrainConfig
from mechopd.probes.store import MANIFEST, ActivationStore
from mechopd.train.trainer import train


@pytest.fixture(scope="module")
def run(tiny_rules_organism, tmp_path_factory):
    out = tmp_path_factory.mktemp("store") / "nca"
    train(
        TrainConfig(
            student=str(tiny_rules_organism),
            task="rules",
            method="nca",
            steps=2,
            batch_size=4,
            lr=3e-3,
            max_new_tokens=6,
            pool_size=16,
        ),
        out,
        progress=False,
    )
    return out


def _probe(*args) -> int:
    return main(["probe", *map(str, args)])


def _rows(path, key_cols=("model", "site")):
    return {tuple(r[k] for k in key_cols): r for r in csv.DictReader(open(path))}


@pytest.fixture(scope="module")
def store(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("cache")
    assert _probe("cache", "--run", run, "--n", "6", "--batch-size", "4", "--shard-mb", "0.004", "--out", out) == 0
    return out


def test_similarity_and_lens_from_the_store_equal_the_forwards(run, store, tmp_path):
    sim_cols = ("cos_mean", "cos_median", "cos_example_mean", "cos_stop")
    for probe, table, cols in (
        ("similarity", "similarity.csv", sim_cols),
        ("lens", "lens.csv", ("kl_c_x", "top1_agree")),
    ):
        args = ["--run", run, "--n", "6", "--batch-size", "4"]
        assert _probe(probe, *args, "--out", tmp_path / probe) == 0
        assert _probe(probe, *args, "--cache", store, "--out", tmp_path / f"{probe}-cached") == 0
        want, got = _rows(tmp_path / probe / table), _rows(tmp_path / f"{probe}-cached" / table)
        assert set(want) == set(got) and {m for m, _ in want} == {"base", "nca"}
        for key, row in want.items():
            assert got[key]["n_tokens"] == row["n_tokens"] and int(row["n_tokens"]) > 0
            for c in cols:  # the store's forwards do not share the context prefix: float rounding only
                assert float(got[key][c]) == pytest.approx(float(row[c]), rel=1e-5, abs=1e-6), (probe, key, c)
        items = [json.loads(x)["response_ids"] for x in (tmp_path / probe / f"{probe}_items.jsonl").open()]
        cached = [json.loads(x)["response_ids"] for x in (tmp_path / f"{probe}-cached" / f"{probe}_items.jsonl").open()]
        assert items == cached  # the same responses: the store's


def test_shards_are_bounded_and_the_manifest_names_what_it_holds(run, store):
    s = ActivationStore(store)
    limit = 0.004 * 2**20
    assert s.labels == ["base", "nca"] and s.sites[0] == "embed" and s.sites[-1] == "final_norm"
    assert len(s.items) == 6 and s.manifest["n_items"] == 6
    for label in s.labels:
        rec = s.manifest["models"][label]
        shards = rec["shards"]
        assert len(shards) > 1 and sum(sh["count"] for sh in shards) == 6
        item_bytes = []
        for sh in shards:
            with safe_open(str(store / sh["file"]), framework="pt") as f:
                off = f.get_tensor("offsets")
                per_row = sum(f.get_slice(k).get_shape()[1] * 4 for k in f.keys() if k != "offsets")
            item_bytes += [(b - a) * per_row for a, b in zip(off.tolist(), off[1:].tolist())]
            assert sh["bytes"] == sum(item_bytes[-sh["count"] :])
            assert sh["bytes"] - item_bytes[-1] < limit  # closed by the item that reached the limit
        path = rec["path"]
        want = hashlib.sha256(open(f"{path}/model.safetensors", "rb").read()).hexdigest()
        assert rec["sha256"]["model.safetensors"] == want
    n_tokens = 0
    for mask, pairs in s.batches("nca", ["layers.0.resid_post"], "response"):
        hx, hc = pairs["layers.0.resid_post"]
        assert hx.shape == hc.shape and hx.shape[:2] == mask.shape and hx.dtype == torch.float32
        assert float(hx.norm(dim=-1)[mask].min()) > 0 and float(hc.norm(dim=-1)[mask].min()) > 0  # real rows filled
        assert torch.equal(hx.norm(dim=-1)[~mask], torch.zeros(int((~mask).sum())))  # padding stays zero
        n_tokens += int(mask.sum())
    assert n_tokens == sum(len(it["response_ids"]) for it in s.items)


def test_a_store_of_other_items_or_sites_is_refused(run, store, tmp_path, capsys):
    assert _probe("similarity", "--run", run, "--n", "5", "--cache", store, "--out", tmp_path / "a") == 2
    assert "holds other items" in capsys.readouterr().err
    assert not (tmp_path / "a" / "similarity.csv").exists()
    part = tmp_path / "part"
    assert (
        _probe(
            "cache",
            "--run",
            run,
            "--n",
            "6",
            "--batch-size",
            "4",
            "--sites",
            "0,layers.1.mlp",
            "--models",
            "nca",
            "--out",
            part,
        )
        == 0
    )
    assert ActivationStore(part).sites == ["layers.0.resid_post", "layers.1.mlp"]
    assert _probe("similarity", "--run", run, "--n", "6", "--cache", part, "--out", tmp_path / "b") == 2
    assert "holds no" in capsys.readouterr().err
    assert not (tmp_path / "b" / "similarity.csv").exists()
    assert (part / MANIFEST).is_file()
