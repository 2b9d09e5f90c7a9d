"""The drift probe (issue 52: which view moved) on a tiny rules organism: an independent forward reproduces each view's
KL to the base, the base against itself is 0 in both views, and a probe without a trained model is refused."""

from __future__ import annotations

import json

import pytest
import torch

from mechopd.core.errors import ConfigError
from mechopd.models import load_model
from mechopd.probes.setup import ProbeSetup

from .test_weightpatch import _perturb_attention


@pytest.fixture(scope="module")
def models(tiny_rules_organism, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("drift")
    return {"base": str(tiny_rules_organism), "opd": _perturb_attention(tiny_rules_organism, root / "opd", scale=0.2)}


def _setup(models):
    return ProbeSetup(task="rules", n=5, batch_size=4, max_new_tokens=6, seed=1, models=models)


def _kl_mean(model, base, items, view: str) -> float:
    """Token-mean KL(q_view ‖ q0_view) over every item's response, one item at a time (no batching, no padding)."""
    total, count = 0.0, 0
    for rec in items:
        prompt, y = rec[f"prompt_ids_{view}"], rec["response_ids"]
        ids = torch.tensor([prompt + y])
        with torch.no_grad():
            q = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].double(), -1)
            q0 = torch.log_softmax(base(ids).logits[0, len(prompt) - 1 : -1].double(), -1)
        total += float((q.exp() * (q - q0)).sum())
        count += len(y)
    return total / count


def test_drift_against_an_independent_forward(models, tmp_path):
    from mechopd.probes.drift import DriftOptions, DriftSummary, run_drift

    lines = run_drift(_setup(models), tmp_path, DriftOptions(models=["opd"], greedy=True))
    got = json.loads((tmp_path / "drift.json").read_text())["summary"]["models"]["opd"]
    items = [json.loads(line) for line in (tmp_path / "drift_items.jsonl").read_text().splitlines()]
    opd, base = load_model(models["opd"]), load_model(models["base"])
    assert got["kl_x"] == pytest.approx(_kl_mean(opd, base, items, "x"), rel=1e-5, abs=1e-9)
    assert got["kl_c"] == pytest.approx(_kl_mean(opd, base, items, "c"), rel=1e-5, abs=1e-9)
    assert got["kl_x"] > 0 and got["kl_c"] > 0 and got["n_tokens"] == sum(len(r["response_ids"]) for r in items)
    assert all("opd_kl_x" in r and "opd_kl_c" in r for r in items)
    assert "Which view moved" in lines[-1] and DriftSummary.load(tmp_path).lines() == lines[1:]


def test_the_base_against_itself_is_zero_and_no_trained_model_is_refused(models, tmp_path):
    from mechopd.probes.drift import DriftOptions, run_drift

    same = {"base": models["base"], "copy": models["base"]}
    run_drift(_setup(same), tmp_path / "a", DriftOptions(models=["copy"], greedy=True))
    got = json.loads((tmp_path / "a" / "drift.json").read_text())["summary"]["models"]["copy"]
    assert got["kl_x"] == pytest.approx(0.0, abs=1e-9) and got["kl_c"] == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ConfigError, match="no trained model"):
        run_drift(_setup(models), tmp_path / "b", DriftOptions(models=["base"], greedy=True))
