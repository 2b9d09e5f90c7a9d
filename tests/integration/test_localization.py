"""The localization curve on a tiny rules organism and a perturbed copy: fixed points and an independent count."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mechopd.core.artifacts import read_csv
from mechopd.models import load_model
from mechopd.probes.setup import ProbeSetup

from .test_weightpatch import _perturb_attention


@pytest.fixture(scope="module")
def models(tiny_rules_organism, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("loc")
    return {
        "base": str(tiny_rules_organism),
        "opd": _perturb_attention(tiny_rules_organism, root / "opd", scale=0.2),
        "nca": _perturb_attention(tiny_rules_organism, root / "nca", seed=5, scale=0.2),
    }


def _setup(models):
    return ProbeSetup(task="rules", n=10, batch_size=4, max_new_tokens=6, seed=1, models=models)


def test_self_donor_fixed_points_and_an_independent_flip_count(models, tmp_path):
    from mechopd.probes.localization import LocalizationOptions, run_localization

    run_localization(_setup(models), tmp_path, LocalizationOptions(model="opd", n_boot=50))
    rows = {r["site"]: r for r in read_csv(tmp_path / "localization.csv")}
    assert float(rows["final_norm"]["flip_all"]) == 0.0  # the context view's output := the no-context view's
    assert float(rows["embed"]["flip_all"]) == pytest.approx(_clean_flip_all(tmp_path))  # same tokens: no change
    items = [json.loads(line) for line in (tmp_path / "localization_items.jsonl").read_text().splitlines()]
    model = load_model(models["opd"])
    flips = []
    for rec in items:  # the context view fed y, one item at a time, no padding: does greedy leave y?
        ids = torch.tensor([rec["prompt_ids_c"] + rec["response_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(rec["prompt_ids_c"]) - 1 : -1]
        flips.append(bool((logits.argmax(-1) != torch.tensor(rec["response_ids"])).any()))
    assert flips == [rec["flips_clean"] for rec in items]
    right = np.array([rec["right_x"] for rec in items])
    if right.any():
        assert float(rows["embed"]["harm_clean"]) == pytest.approx(np.array(flips)[right].mean())
    doc = json.loads((tmp_path / "localization.json").read_text())
    assert doc["summary"]["model"] == "opd" and doc["summary"]["donor"] == "x"


def _clean_flip_all(out) -> float:
    items = [json.loads(line) for line in (out / "localization_items.jsonl").read_text().splitlines()]
    return float(np.mean([rec["flips_clean"] for rec in items]))


def test_cross_model_donor_and_figure(models, tmp_path):
    from mechopd.cli import main
    from mechopd.plots.interventions import plot_localization

    out = tmp_path / "run" / "probes"
    assert (
        main(
            [
                "probe",
                "localization",
                "--task",
                "rules",
                "--n",
                "6",
                "--max-new-tokens",
                "6",
                "--model",
                models["opd"],
                "--donor",
                models["nca"],
                "--layers",
                "0,final_norm",
                "--out",
                str(out),
                "--n-boot",
                "20",
            ]
        )
        == 0
    )
    rows = read_csv(out / "localization.csv")
    assert [r["site"] for r in rows] == ["layers.0.resid_post", "final_norm"]
    assert plot_localization(tmp_path / "run", tmp_path / "run" / "figures")
