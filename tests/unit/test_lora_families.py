"""LoRA on families that name or store their projections their own way: Llama's target names resolve to GPT-2's
Conv1D and Phi-3's fused modules, a partial fused target is refused before any training, and the merged weights of
an adapted Conv1D equal the adapted model's forward."""

from __future__ import annotations

import pytest
import torch

from mechopd.config.sections import LoraOptions
from mechopd.core.errors import ConfigError
from mechopd.models import lora
from mechopd.models.arch import lora_modules
from mechopd.testing.families import tiny_family_model


def test_targets_resolve_to_the_models_own_modules():
    gpt2, phi3 = tiny_family_model("gpt2"), tiny_family_model("phi3")
    assert lora_modules(gpt2, ["q_proj", "k_proj", "v_proj", "o_proj"]) == [
        "transformer.h.0.attn.c_attn",
        "transformer.h.0.attn.c_proj",
        "transformer.h.1.attn.c_attn",
        "transformer.h.1.attn.c_proj",
    ]
    assert lora_modules(gpt2, ["down_proj"]) == ["transformer.h.0.mlp.c_proj", "transformer.h.1.mlp.c_proj"]
    assert len(lora_modules(gpt2, list(lora.DEFAULT_TARGETS), every=False)) == 8  # no gate_proj in GPT-2
    with pytest.raises(ConfigError, match="gate_proj"):
        lora_modules(gpt2, list(lora.DEFAULT_TARGETS))
    assert lora_modules(phi3, ["gate_proj", "up_proj"]) == [f"model.layers.{i}.mlp.gate_up_proj" for i in (0, 1)]
    with pytest.raises(ConfigError, match="q_proj, k_proj, v_proj in one module"):
        lora_modules(phi3, ["q_proj", "v_proj"])
    with pytest.raises(ConfigError, match="q_proj, k_proj, v_proj in one module"):
        lora.add_adapter(tiny_family_model("phi3"), LoraOptions(lora_rank=2, lora_targets=["q_proj"]))


@pytest.mark.parametrize("family", ["gpt2", "phi3", "gpt_neox"])
def test_merged_weights_equal_the_adapted_forward(family):
    model = lora.add_adapter(tiny_family_model(family), LoraOptions(lora_rank=2))
    assert lora.lora_layers(model)
    torch.manual_seed(3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_()
    ids = torch.tensor([[3, 7, 11, 5, 9]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        plain = tiny_family_model(family)
        plain.load_state_dict(lora.merged_state(model))
        got = plain(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())
