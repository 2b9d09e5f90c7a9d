"""Tiny configs of the decoder families mechopd reads beyond Qwen / Llama (transformers' own config classes).

Each is 2 layers, hidden 32, 4 query heads and (where the family has GQA) 2 key/value heads, so that fused
projections have unequal q / k / v parts and per-head interleaving is visible. `tiny_family_model` builds one with
random weights (eval mode, a fixed seed); `mechopd.testing.zoo` adds tokenizers and chat templates for the realpath
tests.
"""

from __future__ import annotations

from typing import Any

EXTRA_FAMILIES = ("mistral", "gemma2", "gemma3", "phi3", "gpt2", "gpt_neox", "olmo2")
FUSED_FAMILIES = ("phi3", "gpt2", "gpt_neox")


def tiny_config(family: str, vocab_size: int = 64, hidden: int = 32, layers: int = 2, **ids: Any) -> Any:
    """A tiny transformers config of `family` (one of `EXTRA_FAMILIES`); ``ids``: bos/eos/pad token ids."""
    import transformers

    for key, default in (("bos_token_id", 1), ("eos_token_id", 2), ("pad_token_id", 0)):
        ids.setdefault(key, default)  # the configs' defaults name ids of a 32k-256k vocabulary
    common = dict(vocab_size=vocab_size, num_hidden_layers=layers, **ids)
    llama_like = dict(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        **common,
    )
    if family == "mistral":
        return transformers.MistralConfig(head_dim=hidden // 4, sliding_window=None, **llama_like)
    if family == "gemma2":
        return transformers.Gemma2Config(
            head_dim=hidden // 4, sliding_window=4, query_pre_attn_scalar=hidden // 4, **llama_like
        )
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            head_dim=hidden // 4,
            sliding_window=4,
            query_pre_attn_scalar=hidden // 4,
            layer_types=["sliding_attention", "full_attention"][:layers],
            **llama_like,
        )
    if family == "phi3":
        return transformers.Phi3Config(tie_word_embeddings=False, **llama_like)
    if family == "olmo2":
        return transformers.Olmo2Config(**llama_like)
    if family == "gpt2":
        return transformers.GPT2Config(
            n_embd=hidden, n_head=4, n_positions=2048, n_layer=layers, **ids, vocab_size=vocab_size
        )
    if family == "gpt_neox":
        return transformers.GPTNeoXConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_attention_heads=4,
            max_position_embeddings=2048,
            **common,
        )
    raise KeyError(f"no tiny config for {family!r}; families: {', '.join(EXTRA_FAMILIES)}")


def tiny_family_model(family: str, seed: int = 0, **kw: Any) -> Any:
    """A randomly initialised tiny causal LM of `family`, eval mode, float32."""
    import torch
    import transformers

    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(tiny_config(family, **kw)).eval()
