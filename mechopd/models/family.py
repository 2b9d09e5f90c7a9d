"""A model family checked from its config before any work (`check_family`, called by `models.check_model` for every
local model a command or a study names), beyond `arch.check_supported`'s known keys:

- mixture-of-experts however the config spells it: any key ending in ``experts`` (``num_local_experts``,
  ``n_routed_experts``, ``moe_num_experts``, ...) at any depth (DBRX keeps its experts under ``ffn_config``) with a
  count above 1;
- recurrent / state-space families by structure: the model built on the meta device (no memory) must have, in every
  decoder layer, an attention block and an MLP block (RecurrentGemma's ``temporal_block``, Mamba's ``mixer`` have
  neither);
- attention heads that divide: the query heads a multiple of the key/value heads, the width a multiple of the heads
  when no ``head_dim`` is given;
- an activation name transformers knows (``hidden_act: swishy`` would be a ``KeyError`` while the model is built).
"""

from __future__ import annotations

from typing import Any

import torch

from mechopd.core.errors import ModelError
from mechopd.models.arch import ATTN_BLOCKS, MLP_BLOCKS, layers_path

ACT_KEYS = ("hidden_act", "hidden_activation", "activation_function")


def check_family(config: Any, where: str = "config.json") -> None:
    """Every check of the module docstring on ``config`` (an `AutoConfig`); the first failure is one `ModelError`."""
    cfg = getattr(config, "text_config", None) or config
    _check_experts(config.to_dict() if hasattr(config, "to_dict") else vars(config), where)
    _check_activation(cfg, where)
    _check_heads(cfg, where)
    vocab = getattr(cfg, "vocab_size", None)
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab >= 1:  # else `check_checkpoint` names it
        _check_structure(config, where)


def _check_experts(doc: Any, where: str, path: str = "") -> None:
    if not isinstance(doc, dict):
        return
    for key, value in doc.items():
        name = f"{path}{key}"
        if isinstance(value, dict):
            _check_experts(value, where, f"{name}.")
        elif str(key).endswith("experts") and isinstance(value, int) and not isinstance(value, bool) and value > 1:
            raise ModelError(
                f"{where}: {name}={value}: a mixture-of-experts model; mechopd reads dense decoder-only causal "
                "LMs (per-layer attention + MLP): use a dense model"
            )


def _check_activation(cfg: Any, where: str) -> None:
    from transformers.activations import ACT2FN

    for key in ACT_KEYS:
        value = getattr(cfg, key, None)
        if isinstance(value, str) and value not in ACT2FN:
            known = ", ".join(sorted(k for k in ACT2FN if k in ("gelu", "gelu_new", "relu", "silu", "swish")))
            raise ModelError(
                f"{where}: {key}={value!r} is not an activation transformers knows (e.g. {known}); restore the "
                "model's own config.json"
            )


def _check_heads(cfg: Any, where: str) -> None:
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    width, head_dim = getattr(cfg, "hidden_size", None), getattr(cfg, "head_dim", None)
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        return  # a family without the key (GPT-2's n_head is aliased; others are built and checked by structure)
    if isinstance(kv, int) and not isinstance(kv, bool) and (kv < 1 or heads % kv):
        raise ModelError(
            f"{where}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv} (each key/value "
            "head serves a whole group of query heads); restore the model's own config.json"
        )
    if not head_dim and isinstance(width, int) and width % heads:
        raise ModelError(
            f"{where}: hidden_size={width} is not a multiple of num_attention_heads={heads} and no head_dim is "
            "given; restore the model's own config.json"
        )


def _check_structure(config: Any, where: str) -> None:
    """Every decoder layer of the model built on the meta device holds an attention and an MLP block."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise ModelError(
            f"{where}: model_type {getattr(config, 'model_type', '?')!r} cannot be built as a causal LM "
            f"({type(e).__name__}: {first}); restore the model's own config.json or use a decoder-only causal LM"
        ) from None
    layers = model.get_submodule(layers_path(model))
    for i, layer in enumerate(layers):
        children = {name for name, _ in layer.named_children()}
        missing = [
            f"no {kind} block mechopd's module map knows ({' / '.join(names)})"
            for kind, names in (("attention", ATTN_BLOCKS), ("MLP", MLP_BLOCKS))
            if not children & set(names)
        ]
        if missing:
            raise ModelError(
                f"{where}: model_type {getattr(config, 'model_type', '?')!r}: decoder layer {i} has "
                f"{' and '.join(missing)}; its blocks: {', '.join(sorted(children))}. mechopd reads dense "
                "decoder-only causal LMs whose layers hold those blocks; use such a model"
            )
