"""The intervention probes (weightpatch, localization, deltas --svd, attribution) on the zoo's real architectures: Qwen3
(q_norm / k_norm), Qwen2.5 (q/k/v biases, a default system prompt) and Llama-3 (a date header), all GQA (4 query
heads, 2 key/value heads), byte-level BPE and a ~512-token context."""

from __future__ import annotations

import json

import pytest

from mechopd.core.artifacts import read_csv
from mechopd.probes.setup import ProbeSetup

from .helpers import FAMILIES, NO_CONTEXT_SYSTEM, TEMPLATE_KWARGS


def _setup(zoo, family: str) -> ProbeSetup:
    return ProbeSetup(
        task="jsonl",
        task_options=zoo.jsonl_options(max_new_tokens=4),
        placement="system",
        no_context_system=NO_CONTEXT_SYSTEM[family],
        chat_template_kwargs=dict(TEMPLATE_KWARGS[family]),
        n=3,
        batch_size=2,
        seed=0,
        models={"base": str(zoo.student(family)), "other": str(zoo.teacher(family))},
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_weightpatch_and_localization_on_real_architectures(zoo, family, tmp_path):
    from mechopd.probes.localization import LocalizationOptions, run_localization
    from mechopd.probes.weightpatch import WeightpatchOptions, run_weightpatch

    setup = _setup(zoo, family)
    run_weightpatch(
        setup,
        tmp_path,
        WeightpatchOptions(models=["other"], layers="1,all", modules="qk,attn,norms,ctrl_qk", draws=1, n_boot=20),
        progress=False,
    )
    rows = read_csv(tmp_path / "weightpatch.csv")
    n_params = {(r["layer"], r["module"]): int(r["n_params"]) for r in rows}
    hidden, kv = 32, 2 * 8  # zoo: hidden 32, 2 key/value heads of 8
    bias = (hidden + kv) if family == "qwen2" else 0  # Qwen2's q/k biases are reverted with their weights
    assert n_params[("1", "qk")] == hidden * hidden + kv * hidden + bias
    assert n_params[("1", "ctrl_qk")] >= n_params[("1", "qk")] - bias
    norms = 2 * hidden + (2 * 8 if family == "qwen3" else 0)  # + q_norm, k_norm (head_dim 8) in Qwen3
    assert n_params[("1", "norms")] == norms
    items = [json.loads(line) for line in (tmp_path / "weightpatch_items.jsonl").read_text().splitlines()]
    assert len(items) == 3 and all(set(rec["outcomes"]["other"]) >= {"none/none", "all/attn"} for rec in items)
    run_localization(setup, tmp_path, LocalizationOptions(model="other", n_boot=20))
    loc = {r["site"]: r for r in read_csv(tmp_path / "localization.csv")}
    assert float(loc["final_norm"]["flip_all"]) == 0.0


@pytest.mark.parametrize("family", ["qwen2"])
def test_deltas_svd_on_a_real_architecture(zoo, family, tmp_path):
    import torch

    from mechopd.models import load_model
    from mechopd.probes.deltas import DeltasOptions, run_deltas

    model = load_model(zoo.student(family))  # a trained copy: every weight moved a little
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    model.save_pretrained(tmp_path / "moved")
    opts = DeltasOptions(models={"moved": str(tmp_path / "moved")}, svd=True)  # a mapping: label -> dir
    run_deltas(_setup(zoo, family), tmp_path, opts, progress=False)
    rows = read_csv(tmp_path / "deltas_svd.csv")
    assert len(rows) == 2 * 7 and all(
        1.0 <= float(r["eff_rank"]) <= min(int(r["rows"]), int(r["cols"])) + 1e-9 for r in rows
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_attribution_on_gqa_architectures(zoo, family, tmp_path):
    from mechopd.probes.attribution_run import AttributionOptions, run_attribution

    run_attribution(_setup(zoo, family), tmp_path, AttributionOptions(models=["base"], layers=[1]))
    rows = read_csv(tmp_path / "attribution.csv")
    heads = {r["head"] for r in rows if r["component"] == "head"}
    assert heads == {"0", "1", "2", "3"}  # 4 query heads (2 key/value heads): o_proj's input has 4
    f = json.loads((tmp_path / "attribution.json").read_text())["summary"]["faithfulness"]
    assert f["sites"] == 3 + 4 and f["seconds_exact"] > 0
