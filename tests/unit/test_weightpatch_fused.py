"""Weight patching on fused / Conv1D families (Phi-3 qkv_proj, GPT-2 c_attn, GPT-NeoX query_key_value): reverting
q_proj replaces exactly the hand slice of the fused weight (k and v untouched), the q+k group and its matched
control count the right parameters, and the patch is undone bitwise."""

from __future__ import annotations

import pytest
import torch

from mechopd.probes.weightpatch_plan import Donor, patched, plan_rows
from mechopd.testing.families import tiny_family_model

H, K, HD, D = 4, 2, 8, 32
FUSED = {  # family -> (fused weight of layer 0, hand slice of q as a boolean mask over the stored tensor, kv heads)
    "phi3": ("model.layers.0.self_attn.qkv_proj.weight", lambda m: _rows(m, range(0, H * HD)), K),
    "gpt2": ("transformer.h.0.attn.c_attn.weight", lambda m: _cols(m, range(0, D)), H),
    "gpt_neox": (
        "gpt_neox.layers.0.attention.query_key_value.weight",
        lambda m: _rows(m, [3 * HD * h + i for h in range(H) for i in range(HD)]),
        H,
    ),
}


def _rows(mask: torch.Tensor, rows) -> torch.Tensor:
    mask[list(rows)] = True
    return mask


def _cols(mask: torch.Tensor, cols) -> torch.Tensor:
    mask[:, list(cols)] = True
    return mask


@pytest.mark.parametrize("family", list(FUSED))
def test_reverting_q_proj_replaces_the_hand_slice_only(family, tmp_path):
    donor_model = tiny_family_model(family, seed=1)
    donor_model.save_pretrained(tmp_path / "donor")
    model = tiny_family_model(family, seed=0)
    raw, q_mask, kv = FUSED[family]
    params = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    rows = plan_rows(model, ["0"], ["q_proj", "qk", "ctrl_qk"], draws=2, seed=0)
    by_module = {r.module: r for r in rows if r.draw is None}
    shapes = {n: p.shape for n, p in params.items()}
    n_q, n_k = H * HD * D, kv * HD * D
    bias = {"phi3": 0, "gpt2": 1, "gpt_neox": 1}[family]  # q / k biases count too
    assert by_module["q_proj"].n_params(shapes) == n_q + bias * H * HD
    assert by_module["qk"].n_params(shapes) == n_q + n_k + bias * (H + kv) * HD
    for ctrl in (r for r in rows if r.module == "ctrl_qk"):
        assert 0 <= ctrl.n_params(shapes) - by_module["qk"].n_params(shapes) < 4 * D  # at most one row over
        assert all(t.name != raw or t.rows is not None for t in ctrl.targets)
    mask = q_mask(torch.zeros_like(params[raw], dtype=torch.bool))
    donor_w = dict(donor_model.named_parameters())[raw].detach()
    with patched(model, Donor(tmp_path / "donor"), by_module["q_proj"]):
        now = params[raw].detach()
        assert torch.equal(now[mask], donor_w[mask])  # q: the donor's values
        assert torch.equal(now[~mask], before[raw][~mask])  # k, v: untouched
        others = [n for n in params if n != raw and not n.endswith("c_attn.bias") and "query_key_value.bias" not in n]
        assert all(torch.equal(params[n], before[n]) for n in others)
    assert all(torch.equal(p, before[n]) for n, p in params.items())  # restored bitwise
