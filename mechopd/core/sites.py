"""Probe sites: the ONE naming table, used by configs, result tables, plot labels, hooks and parameter deltas.

TransformerLens-style stable string addresses, read off the HF module tree of a Llama / Qwen2 / Qwen3 causal LM without
the leading ``model.``:

  residual-stream sites (activations; forward order, `depth` = position in that order)
    ``embed``                  output of ``model.embed_tokens``      depth 0
    ``layers.{i}.resid_post``  output of decoder layer i             depth i + 1
    ``final_norm``             output of ``model.norm``              depth n_layers + 1
  parameter sites (where a weight lives)
    ``layers.{i}.self_attn.q_proj`` ... ``layers.{i}.mlp.down_proj``, ``layers.{i}.input_layernorm`` (layer i, module
    the last path part), ``embed`` / ``final_norm`` / ``lm_head`` (layer None; modules ``embed_tokens`` / ``norm`` /
    ``lm_head``).

Pure string functions: no torch, no model (plots import this file). `module_path` turns any site into the dotted
module path that ``model.get_submodule`` resolves (`mechopd.models.module_at`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from mechopd.core.errors import ConfigError

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
NORM_MODULES = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",  # Gemma-2/3
    "post_feedforward_layernorm",  # Gemma-2/3, OLMo-2
)
QK_NORMS = ("q_norm", "k_norm")  # Qwen3, Gemma-3, OLMo-2
FUSED_MODULES = ("qkv_proj", "gate_up_proj")  # one stored tensor for q/k/v (gate/up): split by mechopd.models.arch
MODULE_ORDER = (
    "input_layernorm",
    "qkv_proj",
    "q_proj",
    "k_proj",
    "v_proj",
    "q_norm",
    "k_norm",
    "o_proj",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "gate_up_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "post_feedforward_layernorm",
)  # forward order, for tables/plots
# site <-> HF module path, for the sites outside the decoder layers
TOP_SITES = {"embed": "model.embed_tokens", "final_norm": "model.norm", "lm_head": "lm_head"}
TOP_MODULES = {"embed_tokens": "embed", "norm": "final_norm", "lm_head": "lm_head"}  # last path part -> site
WRAPPERS = ("model", "language_model", "base_model", "transformer", "gpt_neox")  # leading parts dropped from names
LAYER_LISTS = ("layers", "h")  # the decoder layers' ModuleList, once the wrappers are dropped (GPT-2: ``h``)
# The families that name things their own way, in Llama's words (path inside a decoder layer -> canonical path).
# GPT-2's c_attn / c_proj / c_fc are Conv1D (stored [in, out]); c_attn and GPT-NeoX's query_key_value hold q, k, v
# in one tensor (`mechopd.models.arch` splits them, as Phi-3's qkv_proj and gate_up_proj).
LAYER_RENAMES = {
    "attn.c_attn": "self_attn.qkv_proj",
    "attn.c_proj": "self_attn.o_proj",
    "mlp.c_fc": "mlp.up_proj",
    "mlp.c_proj": "mlp.down_proj",
    "ln_1": "input_layernorm",
    "ln_2": "post_attention_layernorm",
    "attention.query_key_value": "self_attn.qkv_proj",
    "attention.dense": "self_attn.o_proj",
    "mlp.dense_h_to_4h": "mlp.up_proj",
    "mlp.dense_4h_to_h": "mlp.down_proj",
}
TOP_RENAMES = {"wte": "embed_tokens", "embed_in": "embed_tokens", "ln_f": "norm", "final_layer_norm": "norm"}
TOP_RENAMES["embed_out"] = "lm_head"  # GPT-NeoX's head as stored (transformers renames it lm_head on load)
RESID_RE = re.compile(r"^layers\.(-?\d+)\.resid_post$")


def resid_site(i: int) -> str:
    """The residual-stream site after decoder layer `i`: ``layers.{i}.resid_post``."""
    return f"layers.{i}.resid_post"


def residual_sites(n_layers: int) -> list[str]:
    """Every residual-stream site in forward order: embed, layers.0.resid_post, ..., final_norm."""
    return ["embed"] + [resid_site(i) for i in range(n_layers)] + ["final_norm"]


def site_layer(site: str) -> int | None:
    """Decoder layer index of a residual-stream site (None for embed / final_norm / anything else)."""
    m = RESID_RE.match(site)
    return int(m.group(1)) if m else None


def site_depth(site: str, n_layers: int) -> int:
    """0 for embed, i + 1 for layers.{i}.resid_post, n_layers + 1 for final_norm."""
    if site == "embed":
        return 0
    if site == "final_norm":
        return n_layers + 1
    layer = site_layer(site)
    if layer is None:
        raise ConfigError(f"{site!r} is not a residual-stream site (embed, layers.{{i}}.resid_post, final_norm)")
    return layer + 1


def sites_for(n_layers: int, layers: Sequence[int | str] | int | str | None = None) -> list[str]:
    """Requested residual-stream sites in forward order, deduplicated, from the number of decoder layers.

    layers: None (every site), or items that are decoder layer indices (``3``, ``-1``: negative counts from the end)
    or site names (``"embed"``, ``"layers.3.resid_post"``, ``"final_norm"``). Out of range -> `ConfigError`.
    """
    every = residual_sites(n_layers)
    if layers is None:
        return every
    if isinstance(layers, (int, str)):
        layers = [layers]
    wanted = {_one_site(item, n_layers) for item in layers}
    if not wanted:
        raise ConfigError("layers is empty; pass None for every site or e.g. [0, -1, 'final_norm']")
    return [s for s in every if s in wanted]


def _one_site(item: int | str, n: int) -> str:
    if isinstance(item, str) and item in ("embed", "final_norm"):
        return item
    idx: int | None = None
    if isinstance(item, int) and not isinstance(item, bool):
        idx = item
    elif isinstance(item, str):
        idx = site_layer(item)
        if idx is None and item.lstrip("-").isdigit():
            idx = int(item)
    if idx is None:
        raise ConfigError(
            f"layers: {item!r} is not a site; use a decoder layer index, 'embed', "
            "'layers.{i}.resid_post' or 'final_norm'"
        )
    if not -n <= idx < n:
        raise ConfigError(
            f"layers: layer {idx} is out of range; the model has {n} decoder layers "
            f"(0..{n - 1}, or -{n}..-1 from the end)"
        )
    return resid_site(idx % n)


def module_path(site: str) -> str:
    """The HF module path of a site: ``layers.3.resid_post`` -> ``model.layers.3`` (the layer whose output it is),
    ``layers.3.self_attn.q_proj`` -> ``model.layers.3.self_attn.q_proj``, ``embed`` -> ``model.embed_tokens``."""
    if site in TOP_SITES:
        return TOP_SITES[site]
    layer = site_layer(site)
    return f"model.layers.{layer}" if layer is not None else f"model.{site}"


class Site(NamedTuple):
    """Where a parameter lives: ``site`` (probe address), ``layer`` (None outside layers), ``module``, ``param``."""

    site: str
    layer: int | None
    module: str
    param: str


def site_of(param_name: str) -> Site:
    """``model.layers.3.self_attn.q_proj.bias`` -> Site("layers.3.self_attn.q_proj", 3, "q_proj", "bias").

    Leading wrappers (``model.``, ``language_model.``, ``base_model.``, ``transformer.``, ``gpt_neox.``) are dropped; the last part is
    the parameter (``weight`` / ``bias``); ``embed_tokens`` / final ``norm`` / ``lm_head`` map to the sites ``embed`` /
    ``final_norm`` / ``lm_head``. Other names keep their path as site, with layer None. Families that name things
    their own way are read in Llama's words (`LAYER_RENAMES`, `TOP_RENAMES`): ``transformer.h.0.attn.c_proj.weight``
    -> Site("layers.0.self_attn.o_proj", 0, "o_proj", "weight"); a fused tensor keeps its fused name (``qkv_proj``).
    """
    parts = param_name.split(".")
    param = parts.pop() if len(parts) > 1 else ""
    while len(parts) > 1 and parts[0] in WRAPPERS:
        parts.pop(0)
    if len(parts) >= 3 and parts[0] in LAYER_LISTS and parts[1].isdigit():
        inner = ".".join(parts[2:])
        path = f"layers.{parts[1]}.{LAYER_RENAMES.get(inner, inner)}"
        return Site(path, int(parts[1]), path.rsplit(".", 1)[-1], param)
    path = TOP_RENAMES.get(".".join(parts), ".".join(parts))
    if path in TOP_MODULES:
        return Site(TOP_MODULES[path], None, path, param)
    return Site(path, None, parts[-1], param)


def param_layer(param_name: str) -> int | None:
    """Layer index of a parameter name, None for embeddings / final norm / lm_head (`site_of(...).layer`)."""
    return site_of(param_name).layer


def module_kind(param_name: str) -> str:
    """Module type of a parameter name (q_proj, ..., embed_tokens, norm, lm_head) for per-type aggregation."""
    return site_of(param_name).module


def natural_key(site: Site) -> tuple:
    """Sort key: embedding, decoder layers in forward order (modules in `MODULE_ORDER`), other tensors, final norm,
    lm_head."""
    group = {"embed": 0, "final_norm": 3, "lm_head": 4}.get(site.site, 1 if site.layer is not None else 2)
    rank = MODULE_ORDER.index(site.module) if site.module in MODULE_ORDER else len(MODULE_ORDER)
    return (group, site.layer if site.layer is not None else -1, rank, site.site, site.param)
