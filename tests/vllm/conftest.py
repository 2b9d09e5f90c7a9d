"""Fixtures of the vLLM tests: head_dim-32 tiny models (vLLM's CPU attention refuses the default organisms' 24).

vLLM's CPU backend repacks float32 linear weights into oneDNN handles and drops the parameters, so nothing could read
back the weights it samples from. `readable_weights` turns oneDNN off for the test process: vLLM then multiplies with
``torch.nn.functional.linear`` on its own parameters (its documented fallback), which the tests compare bit for bit.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

HD32_ORGANISM = dict(
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    steps=60,
    batch_size=32,
    corpus_size=2000,
    lr=3e-3,
)  # head_dim 32


@pytest.fixture(scope="module")
def readable_weights():
    import vllm._custom_ops as ops

    saved, ops._supports_onednn = ops._supports_onednn, False
    yield
    ops._supports_onednn = saved


@pytest.fixture(scope="session")
def hd32_model_dir(tmp_path_factory, organism_tokenizer):
    """A random Qwen3 (2 layers, hidden 64, 2 heads of 32) saved with the organism tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    tok = organism_tokenizer
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        initializer_range=0.1,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    out = tmp_path_factory.mktemp("hd32")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def hd32_rules_organism(tmp_path_factory):
    from mechopd.organisms.pretrain import OrganismConfig, pretrain

    out = tmp_path_factory.mktemp("organism-hd32") / "rules"
    return pretrain(OrganismConfig(task="rules", **HD32_ORGANISM), out, progress=False)


def fused_reference(model: torch.nn.Module, name: str) -> torch.Tensor:
    """The HF tensor(s) behind vLLM parameter `name` (q/k/v and gate/up are concatenated there)."""
    hf = dict(model.named_parameters())
    for fused, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj"))):
        if fused in name:
            return torch.cat([hf[name.replace(fused, p)] for p in parts]).detach()
    return hf[name].detach()


def max_weight_diff(engine, model: torch.nn.Module) -> float:
    """max |vLLM parameter - trainer parameter| over every parameter vLLM holds (vocab padding rows excluded)."""
    worst = 0.0
    state = engine.state_dict()
    assert state, "vLLM returned no parameters"
    for name, value in state.items():
        assert value.numel() > 0, f"{name} was repacked: the readable_weights fixture is not in effect"
        ref = fused_reference(model, name).float()
        worst = max(worst, float((value[: ref.shape[0]] - ref).abs().max()))
    return worst
