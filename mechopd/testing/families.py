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


def tiny_config(
    family: str, vocab_size: int = 64, hidden: int = 32, layers: int = 2, tie: bool | None = None, **ids: Any
) -> Any:
    """A tiny transformers config of `family` (one of `EXTRA_FAMILIES`); ``ids``: bos/eos/pad token ids (defaults
    1 / 2 / 0); ``tie``: tie_word_embeddings (None: the family's default)."""
    import transformers

    for key, default in (("bos_token_id", 1), ("eos_token_id", 2), ("pad_token_id", 0)):
        ids.setdefault(key, default)  # the configs' defaults name ids of a 32k-256k vocabulary
    common = dict(vocab_size=vocab_size, num_hidden_layers=layers, **ids)
    if tie is not None:
        common["tie_word_embeddings"] = tie
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
        # caps far below the default 30 / 50, so that a forward that skipped them would show (tiny random logits)
        return transformers.Gemma2Config(
            final_logit_softcapping=0.05,
            attn_logit_softcapping=0.05,
            head_dim=hidden // 4,
            sliding_window=4,
            query_pre_attn_scalar=hidden // 4,
            **llama_like,
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
        return transformers.Phi3Config(**llama_like)
    if family == "olmo2":
        return transformers.Olmo2Config(**llama_like)
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=hidden, n_head=4, n_positions=2048, **common)
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


# ------------------------------------------------------------------------------------- tokenizer specs for the zoo
MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] + '\\n\\n' %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'user' %}{{- '[INST] ' + (system if loop.first else '') + m['content'] + ' [/INST]' }}"
    "{%- else %}{{- m['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}"
)
GEMMA2_TEMPLATE = (  # Gemma-2 refuses a system role, as the real template does
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{{- raise_exception('System role not supported') }}{%- endif %}"
    "{%- for m in messages %}{%- set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
GEMMA3_TEMPLATE = (  # Gemma-3 puts a system message at the top of the first user turn
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set first = messages[0]['content'] + '\\n\\n' %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set first = '' %}{%- endif %}"
    "{%- for m in messages %}{%- set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + m['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
TAGGED_TEMPLATE = (  # Phi-3: <|role|> blocks closed by <|end|>
    "{%- for m in messages %}{{- '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)
OLMO2_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}{{- '<|' + m['role'] + '|>\\n' + m['content'] + '\\n' }}"
    "{%- if m['role'] == 'assistant' %}{{- eos_token }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)
PLAIN_TEMPLATE = (  # GPT-2 / Pythia ship none: role-prefixed lines
    "{%- for m in messages %}{{- m['role'] + ': ' + m['content'] + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
)
GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>")
# name -> (specials, template, bos, eos, pad, tie)
TOKENIZER_SPECS: dict[str, tuple[tuple[str, ...], str, str | None, str, str | None, bool]] = {
    "mistral": (("<s>", "</s>", "[INST]", "[/INST]"), MISTRAL_TEMPLATE, "<s>", "</s>", None, False),
    "gemma2": (GEMMA_SPECIALS, GEMMA2_TEMPLATE, "<bos>", "<end_of_turn>", "<pad>", True),
    "gemma3": (GEMMA_SPECIALS, GEMMA3_TEMPLATE, "<bos>", "<end_of_turn>", "<pad>", True),
    "phi3": (
        ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
        TAGGED_TEMPLATE,
        None,
        "<|end|>",
        "<|endoftext|>",
        False,
    ),
    "gpt2": (("<|endoftext|>",), PLAIN_TEMPLATE, None, "<|endoftext|>", None, True),
    "gpt_neox": (("<|endoftext|>", "<|padding|>"), PLAIN_TEMPLATE, None, "<|endoftext|>", "<|padding|>", False),
    "olmo2": (
        ("<|endoftext|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"),
        OLMO2_TEMPLATE,
        None,
        "<|endoftext|>",
        "<|pad|>",
        False,
    ),
}
