"""The PMI probe on a tiny rules organism: an independent forward reproduces pmi, the student-is-teacher fixed point
(the OPD loss is all context part: pmi_share = 1), flip tokens only on items right without c, the figure."""

from __future__ import annotations

import json

import pytest
import torch

from mechopd.core.artifacts import read_csv
from mechopd.models import load_model
from mechopd.probes.setup import ProbeSetup

from .test_weightpatch import _perturb_attention


@pytest.fixture(scope="module")
def models(tiny_rules_organism, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pmi")
    return {"base": str(tiny_rules_organism), "opd": _perturb_attention(tiny_rules_organism, root / "opd", scale=0.2)}


def _setup(models):
    return ProbeSetup(task="rules", n=6, batch_size=4, max_new_tokens=6, seed=1, models=models)


def test_pmi_against_an_independent_forward(models, tmp_path):
    from mechopd.probes.pmi import PmiOptions, run_pmi

    run_pmi(_setup(models), tmp_path, PmiOptions(student="opd", teacher="base"))
    rows = read_csv(tmp_path / "pmi_tokens.csv")
    items = [json.loads(line) for line in (tmp_path / "pmi_items.jsonl").read_text().splitlines()]
    teacher = load_model(models["base"])
    rec = items[0]
    y = rec["response_ids"]

    def logp(prompt):
        ids = torch.tensor([prompt + y])
        with torch.no_grad():
            lp = torch.log_softmax(teacher(ids).logits[0, len(prompt) - 1 : -1].double(), -1)
        return lp[torch.arange(len(y)), torch.tensor(y)]

    ref = logp(rec["prompt_ids_c"]) - logp(rec["prompt_ids_x"])
    got = [float(r["pmi"]) for r in rows if r["uid"] == rec["uid"]]
    assert got == pytest.approx(ref.tolist(), abs=1e-6)
    flips = [r for r in rows if r["flip"] == "True"]
    assert all(r["right_x"] == "True" for r in flips)
    assert len({r["uid"] for r in flips}) == len(flips)  # one flip token per item at most


def test_student_equal_to_teacher_gives_share_one(models, tmp_path):
    from mechopd.plots.interventions import plot_pmi
    from mechopd.probes.pmi import PmiOptions, run_pmi

    out = tmp_path / "run" / "probes"
    run_pmi(_setup(models), out, PmiOptions(student="base", teacher="base"))
    s = json.loads((out / "pmi.json").read_text())["summary"]
    rows = read_csv(out / "pmi_tokens.csv")
    assert all(abs(float(r["kl_x"])) < 1e-9 for r in rows)  # q_x = f_x
    for r in rows:  # the exact decomposition opd = KL(q_x ‖ f_x) + ctx: here the whole loss is the context's part
        assert float(r["ctx"]) == pytest.approx(float(r["opd"]), abs=1e-9)
    assert s["pmi_share"] is None or s["pmi_share"] == pytest.approx(1.0, abs=1e-9)
    assert plot_pmi(tmp_path / "run", tmp_path / "run" / "figures")
