"""The module map of a decoder-only causal LM, read from its structure, and the exact split of fused projections.

Resolved by structure, not by a list of families: the decoder layers are the ``nn.ModuleList`` of the base model
whose length is the config's layer count; the embedding and the head are transformers' own
``get_input_embeddings()`` / ``get_output_embeddings()``; the final norm is the base model's norm child; inside a
layer, the attention and MLP blocks and their projections are found by name, in Llama's words, through the one
naming table (`mechopd.core.sites`: ``LAYER_RENAMES`` for GPT-2's ``attn.c_attn`` / ``ln_1`` and GPT-NeoX's
``attention.query_key_value`` / ``attention.dense``, ``TOP_RENAMES`` for ``wte`` / ``embed_in`` / ``ln_f``).

Fused and Conv1D projections are split into q/k/v (gate/up) views by their exact index ranges along the output
dimension (`ParamView`), the head counts read from the config (GQA / MQA: ``num_key_value_heads``):

    Phi-3 ``qkv_proj``  [(H + 2K)·d, D]   q = rows [0, H·d), k = [H·d, (H + K)·d), v = [(H + K)·d, (H + 2K)·d)
    GPT-2 ``c_attn``    Conv1D [D, 3D]    the same ranges along the columns (K = H); the view is the transpose
    GPT-NeoX ``query_key_value`` [3·H·d, D]   per head h: q = rows [3hd, 3hd + d), k = [3hd + d, 3hd + 2d), v = ...
    Phi-3 ``gate_up_proj`` [2I, D]        gate = rows [0, I), up = [I, 2I)

A view's shape is [out, in] (Conv1D weights transposed), so norms, SVDs and patches of a view are those of the
projection itself. Architectures mechopd cannot read this way (mixture-of-experts routing, encoder-decoders,
state-space layers) are refused by `check_supported` with one line naming the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.model_checks import read_config
from mechopd.core.sites import ATTN_MODULES, LAYER_RENAMES, MLP_MODULES, TOP_SITES, site_layer, site_of

CONV1D = ("c_attn", "c_proj", "c_fc")  # GPT-2's Conv1D modules: weight stored [in, out]
QKV_CONTIGUOUS = ("qkv_proj", "c_attn")  # [q; k; v] along the output dimension
QKV_PER_HEAD = ("query_key_value",)  # GPT-NeoX: [q_h; k_h; v_h] per head h
GATE_UP = ("gate_up_proj",)  # Phi-3: [gate; up]
ATTN_BLOCKS = ("self_attn", "attn", "attention")  # a decoder layer's attention child, by family
MLP_BLOCKS = ("mlp", "feed_forward")
FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm")
# why a family cannot be read as a dense decoder (config key present and truthy -> refused)
UNSUPPORTED_KEYS = {
    "num_experts": "mixture-of-experts routing",
    "num_local_experts": "mixture-of-experts routing",
    "n_routed_experts": "mixture-of-experts routing",
    "moe_num_experts": "mixture-of-experts routing",
    "is_encoder_decoder": "an encoder-decoder",
    "state_size": "state-space layers",
    "ssm_state_size": "state-space layers",
    "mamba_d_state": "state-space layers",
}


def check_supported(config: Any) -> None:
    """Refuse, before any work, a model whose layers are not dense decoder blocks (one line naming why)."""
    mt = getattr(config, "model_type", "?")
    cfg = getattr(config, "text_config", None) or config
    for key, why in UNSUPPORTED_KEYS.items():
        value = getattr(cfg, key, None)
        if value and not isinstance(value, str):
            raise ModelError(
                f"architecture {mt!r} has {why} ({key}={value}); mechopd reads dense decoder-only causal LMs "
                "(per-layer attention + MLP): use a dense model"
            )


@dataclass(frozen=True)
class Heads:
    """Attention shape from a config: H query heads, K key/value heads (GQA: K < H, MQA: K = 1), head size d."""

    n_heads: int
    n_kv: int
    head_dim: int


def heads_of(config: Any) -> Heads:
    cfg = getattr(config, "text_config", None) or config
    h = int(cfg.num_attention_heads)
    kv = getattr(cfg, "num_key_value_heads", None) or (1 if getattr(cfg, "multi_query", False) else h)
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    return Heads(h, int(kv), int(d))


Spans = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ParamView:
    """One projection's slice of a stored parameter: ``name`` in the canonical words
    (``model.layers.0.self_attn.q_proj.weight``), ``raw`` the stored / named parameter, ``spans`` the index ranges
    along the output dimension (None: all of it), ``transposed`` for a Conv1D weight (stored [in, out]), ``shape``
    the view's [out, in] (or [out] for a bias)."""

    name: str
    raw: str
    spans: Spans | None
    transposed: bool
    shape: tuple[int, ...]

    @property
    def whole(self) -> bool:
        return self.spans is None and not self.transposed

    def out_dim(self) -> int:
        """The raw tensor's dimension that the view's rows index (1 for a Conv1D weight)."""
        return 1 if self.transposed else 0

    def indices(self) -> list[int]:
        """The raw output indices of the view's rows, in order."""
        n = self.shape[0] if self.shape else 1
        return list(range(n)) if self.spans is None else [i for a, b in self.spans for i in range(a, b)]

    def window(self, start: int, stop: int) -> Spans:
        """Raw output ranges of view rows [start, stop), in order (contiguous runs merged)."""
        if self.spans is None:
            return ((start, stop),)
        out: list[tuple[int, int]] = []
        pos = 0
        for a, b in self.spans:
            lo, hi = max(a, a + start - pos), min(b, a + stop - pos)
            if lo < hi:
                out.append((lo, hi))
            pos += b - a
        return tuple(out)

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """The view of a tensor of the raw parameter's shape: [out, in] (or [out]); a copy when split."""
        if self.spans is not None:
            idx = torch.tensor(self.indices(), device=t.device)
            t = t.index_select(self.out_dim() if t.dim() > 1 else 0, idx)
        return t.T if self.transposed and t.dim() == 2 else t


def canonical_name(site: str, param: str) -> str:
    """The name a parameter has in Llama's words: ``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``."""
    if site in TOP_SITES:
        return f"{TOP_SITES[site]}.{param}"
    return f"model.{site}.{param}" if param else f"model.{site}"


def _split(module: str, n_out: int, heads: Heads, raw: str) -> dict[str, Spans]:
    h, k, d = heads.n_heads, heads.n_kv, heads.head_dim
    if module in GATE_UP:
        if n_out % 2:
            raise ModelError(f"{raw} has {n_out} output rows, not [gate; up] of equal halves; re-save the checkpoint")
        return {"gate_proj": ((0, n_out // 2),), "up_proj": ((n_out // 2, n_out),)}
    if module in QKV_PER_HEAD:
        if n_out != 3 * h * d:
            raise ModelError(
                f"{raw} has {n_out} output rows but the config says 3 x {h} heads x {d}; restore its config"
            )
        return {
            name: tuple((3 * d * j + i * d, 3 * d * j + (i + 1) * d) for j in range(h))
            for i, name in enumerate(("q_proj", "k_proj", "v_proj"))
        }
    if n_out != (h + 2 * k) * d:
        raise ModelError(
            f"{raw} has {n_out} output rows but the config says ({h} + 2 x {k} heads) x {d}; restore its config"
        )
    return {"q_proj": ((0, h * d),), "k_proj": ((h * d, (h + k) * d),), "v_proj": (((h + k) * d, (h + 2 * k) * d),)}


def views_of(raw: str, shape: tuple[int, ...], heads: Heads) -> list[ParamView]:
    """The canonical views of one stored parameter: one for a plain tensor, q/k/v (gate/up) for a fused one."""
    site = site_of(raw)
    module = raw.split(".")[-2] if raw.count(".") >= 1 else raw
    transposed = module in CONV1D and len(shape) == 2
    out_shape = (shape[1], shape[0]) if transposed else tuple(shape)
    if not (module in QKV_CONTIGUOUS + QKV_PER_HEAD + GATE_UP and site.layer is not None and shape):
        return [ParamView(canonical_name(site.site, site.param), raw, None, transposed, out_shape)]
    parent = site.site.rsplit(".", 1)[0]
    views = []
    for name, spans in _split(module, out_shape[0], heads, raw).items():
        n = sum(b - a for a, b in spans)
        views.append(
            ParamView(canonical_name(f"{parent}.{name}", site.param), raw, spans, transposed, (n, *out_shape[1:]))
        )
    return views


def param_views(shapes: Mapping[str, tuple[int, ...]], config: Any) -> dict[str, ParamView]:
    """Canonical name -> view for every stored parameter (name -> shape), fused ones split."""
    fused = [n for n in shapes if n.split(".")[-2:-1] and n.split(".")[-2] in QKV_CONTIGUOUS + QKV_PER_HEAD]
    heads = heads_of(config) if fused else Heads(1, 1, 1)  # only q/k/v splits read the head counts
    out: dict[str, ParamView] = {}
    for raw, shape in shapes.items():
        for v in views_of(raw, tuple(shape), heads):
            if v.name in out:
                raise ModelError(f"{raw} and {out[v.name].raw} both read as {v.name}; mechopd cannot map this model")
            out[v.name] = v
    return out


def model_views(model: torch.nn.Module) -> dict[str, ParamView]:
    """`param_views` of a loaded model's named parameters (tied ones once, under their first name)."""
    return param_views({n: tuple(p.shape) for n, p in model.named_parameters()}, model.config)


# ----------------------------------------------------------------------------------------------- the loaded model
def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack without the head (``model.model``, ``model.transformer``, ``model.gpt_neox``)."""
    base = getattr(model, "base_model", None)
    if isinstance(base, torch.nn.Module) and base is not model:
        return base
    for name in ("model", "transformer", "gpt_neox"):
        if isinstance(getattr(model, name, None), torch.nn.Module):
            return getattr(model, name)
    raise ModelError(f"{type(model).__name__} has no decoder stack (model.model); pass a causal LM")


def layers_path(model: torch.nn.Module) -> str:
    """Dotted path of the decoder layers: the ModuleList with the config's layer count (``model.layers``,
    ``transformer.h``, ``gpt_neox.layers``, ``model.language_model.layers``)."""
    config = getattr(model, "config", None)
    if config is None:
        raise ModelError(f"{type(model).__name__} has no config; pass a transformers causal LM")
    check_supported(config)
    cfg = getattr(config, "text_config", None) or config
    n = getattr(cfg, "num_hidden_layers", None)
    found = [
        name
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and name.rsplit(".", 1)[-1] in ("layers", "h")
    ]
    if not found:
        raise ModelError(
            f"architecture {getattr(config, 'model_type', '?')!r}: no ModuleList of its {n} decoder layers "
            "(named layers or h); mechopd reads decoder-only causal LMs"
        )
    return min(found, key=len)


def soft_cap(model: torch.nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """The model's final-logit soft-capping (Gemma-2: cap · tanh(logits / cap)), as its own forward applies after
    the head; logits unchanged for a model without one. ``[..., V]`` -> ``[..., V]``."""
    config = getattr(model, "config", None)
    cfg = getattr(config, "text_config", None) or config
    cap = getattr(cfg, "final_logit_softcapping", None)
    return logits if not cap else torch.tanh(logits / cap) * cap


def module_name(model: torch.nn.Module, module: torch.nn.Module) -> str:
    for name, mod in model.named_modules():
        if mod is module:
            return name
    raise ModelError(f"{type(module).__name__} is not a module of this model")


def _child(parent: torch.nn.Module, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if isinstance(getattr(parent, n, None), torch.nn.Module)), None)


def site_path(model: torch.nn.Module, site: str) -> str:
    """The module path of a site on this model (``layers.3.self_attn.o_proj`` -> ``transformer.h.3.attn.c_proj``
    on GPT-2). A q/k/v (gate/up) site of a fused model names no module: `ModelError` (use `model_views`)."""
    lm: Any = model  # a transformers PreTrainedModel
    if site == "embed":
        return module_name(model, lm.get_input_embeddings())
    if site == "lm_head":
        return module_name(model, lm.get_output_embeddings())
    base = base_model(model)
    if site == "final_norm":
        norm = _child(base, FINAL_NORMS)
        if norm is None:
            raise ModelError(f"{type(model).__name__} has no final norm ({', '.join(FINAL_NORMS)})")
        return f"{module_name(model, base)}.{norm}"
    layers = layers_path(model)
    if site_layer(site) is not None:
        return f"{layers}.{site_layer(site)}"
    parts = site.split(".")
    if len(parts) < 3 or parts[0] != "layers" or not parts[1].lstrip("-").isdigit():
        raise ModelError(f"no module at site {site!r}; sites look like 'layers.0.self_attn.q_proj', 'embed'")
    return f"{layers}.{parts[1]}.{_layer_inner(model, layers, parts, site)}"


def _layer_inner(model: torch.nn.Module, layers: str, parts: list[str], site: str) -> str:
    """Raw path inside a layer of the canonical ``parts[2:]`` (``self_attn.o_proj`` -> ``attn.c_proj``)."""
    want = ".".join(parts[2:])
    layer = model.get_submodule(f"{layers}.{parts[1]}")
    raw = {v: k for k, v in LAYER_RENAMES.items() if v == want and _has(layer, k)}
    if raw:
        return raw[want]
    if _has(layer, want):
        return want
    block, _, rest = want.partition(".")
    names = ATTN_BLOCKS if block == "self_attn" else MLP_BLOCKS if block == "mlp" else (block,)
    found = _child(layer, names)
    if found is not None and (not rest or _has(layer, f"{found}.{rest}")):
        return f"{found}.{rest}" if rest else found
    fused = " (fused in one tensor: read its view with mechopd.models.arch.model_views)" if rest else ""
    raise ModelError(f"no module at site {site!r} in this {getattr(model.config, 'model_type', '?')} model{fused}")


def _has(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def lora_modules(model: torch.nn.Module, targets: tuple[str, ...] | list[str], every: bool = True) -> list[str]:
    """Full paths of the linear / Conv1D modules that LoRA `targets` name, in Llama's words (``q_proj``, ...) or the
    model's own (``c_attn``, ``qkv_proj``): GPT-2's ``q_proj`` is ``transformer.h.{i}.attn.c_attn``. A fused module
    is adapted whole, so naming only some of its parts (``q_proj`` without ``k_proj`` / ``v_proj`` on Phi-3) is a
    `ConfigError`, as is a target that names no module (the message lists the names that exist; ``every=False``, the
    default targets: those the model has, e.g. GPT-2 has no gate_proj)."""
    from transformers.pytorch_utils import Conv1D

    wanted, found, names = set(targets), {}, set()
    for path, mod in model.named_modules():
        if not isinstance(mod, (torch.nn.Linear, Conv1D)):
            continue
        own, canon = path.rsplit(".", 1)[-1], site_of(f"{path}.weight").module
        parts = FUSED_PARTS.get(canon, (canon,))
        names.update({own, canon, *parts})
        hit = wanted & {own, canon, *parts}
        if not hit:
            continue
        if len(parts) > 1 and not wanted & {own, canon} and set(parts) - wanted:
            raise ConfigError(
                f"lora_targets name {sorted(hit)} but this model stores {', '.join(parts)} in one module ({own}); "
                f"target all of {', '.join(parts)} (or {canon})"
            )
        found[path] = hit
    missing = sorted(wanted - {t for hit in found.values() for t in hit})
    if missing and (every or not found):
        raise ConfigError(
            f"lora_targets {missing} match no linear module of this model; choose from {', '.join(sorted(names))}"
        )
    return sorted(found)


def check_lora_targets(model: str, targets: tuple[str, ...] | list[str] | None, where: str) -> None:
    """Refuse, before any job, LoRA targets that `lora_modules` would refuse on checkpoint `model` (its module tree
    built on the meta device from config.json: no weights read). None: the default targets (those it has)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(read_config(model))
    try:
        lora_modules(skeleton, list(targets) if targets else list(ATTN_MODULES + MLP_MODULES), every=bool(targets))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
