"""A lean KV-cache decode step for the papers' families (Llama, Qwen2, Qwen3): the rollout path of `sample`.

Why: on small models a decode step through ``model(...)`` is bound by per-call overhead, not arithmetic (module
calls, mask construction, the cache object's bookkeeping, output dataclasses: several hundred small operator calls
per token). This module runs the SAME arithmetic as the transformers modules, read from the model's own parameters
(no copies, so an optimizer step is seen at once), with the per-step overhead stripped:

  prefill   one ordinary ``model(...)`` forward over the left-padded prompts (use_cache=True, logits of the last
            column only); its keys/values are
            copied into preallocated buffers ``[batch, kv_heads, prompt_len + max_new_tokens, head_dim]``;
  step      per layer, for the one new token per row (h: ``[B, 1, d]``):
                x = RMSNorm(h);  q, k, v = x W_q (+b), x W_k (+b), x W_v (+b)    (Qwen3: RMSNorm on q, k per head)
                q, k = RoPE(q, pos), RoPE(k, pos)        (cos/sin from the model's own rotary module)
                K[:, :, t], V[:, :, t] = k, v
                h = h + softmax(q K[:, :, :t+1]^T / sqrt(head_dim) + mask) V[:, :, :t+1] W_o (+b)
                                               (query head j reads kv head j // (heads / kv_heads), as repeat_kv)
                h = h + W_down(act(W_gate x') * W_up x'),   x' = RMSNorm(h)
            logits = RMSNorm(h) W_lm_head^T.
RMSNorm follows transformers' formula (float32 statistics, cast back, then the weight). Greedy ids equal
``model.generate`` and logits match ``model(...)`` within float tolerance on Llama, Qwen2 and Qwen3 (tests).
Not supported (``engine="auto"``, the default, then decodes through ``model(...)`` and says so once in the log;
an explicit ``engine="lean"`` is refused with `ModelError` naming the keys): sliding-window attention, dynamic and longrope RoPE
scaling, other architectures. RoPE cos/sin are tabulated once per call for every reachable position.
A projection that is not a plain ``nn.Linear`` (a LoRA-adapted one) is called as a module (`_lin`).
Projections: a CPU float32 weight of at least `layout.MIN_ELEMENTS` elements (SmolLM2's, not the organisms') is
multiplied by oneDNN, read from a copy laid out for small-row GEMMs inside `layout.laid_out` (`generate/layout.py`:
1.5-1.7x faster decode steps on SmolLM2-135M; the same bits with or without the copy).
Differences from ``model(...)`` to know about: decode steps bypass module forward hooks (only the prefill runs through
``model(...)``); the KV buffers hold the worst case (prompt + max_new_tokens) from the start; in bf16 the attention
here is plain matmul + softmax, so logits can differ from sdpa's by one bf16 step (fp32: ~1e-7; bf16 eager: exact);
the oneDNN projections sum in another order than MKL's (fp32 logits ~1e-6 relative).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from mechopd.core.errors import ModelError
from mechopd.generate import layout
from mechopd.generate.prefix import cache_kwargs, output_cache

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")  # Mistral: Llama's arithmetic (without a sliding window)
ENGINE_KEYS = "train.rollout_engine (training) / eval.engine (evaluation)"
_told: set[str] = set()  # the fallback reasons already logged in this process


def lean_supported(model: Any) -> str | None:
    """None if the lean decoder can run `model`, else the reason it cannot."""
    cfg = model.config
    if cfg.model_type not in FAMILIES:
        return f"model_type {cfg.model_type!r} (lean decoding supports {', '.join(FAMILIES)})"
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None and any(t == "sliding_attention" for t in layer_types):
        return "sliding-window attention"
    if layer_types is None and getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None) is not None:
        return "sliding-window attention"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    rope = str(getattr(getattr(getattr(model, "model", None), "rotary_emb", None), "rope_type", "default"))
    if "dynamic" in rope or "longrope" in rope:
        return f"rope_type {rope!r} (its frequencies depend on the longest position seen so far)"
    return None


def resolve_engine(model: Any, engine: str) -> str:
    """The built-in decoder that runs: "auto" is "lean" where `lean_supported`, else "hf" (said once per reason in the
    log); "lean" and "hf" as given (an explicit "lean" on a model it cannot run fails in `LeanDecoder`)."""
    if engine != "auto":
        return engine
    reason = lean_supported(model)
    if reason is None:
        return "lean"
    if reason not in _told:
        _told.add(reason)
        logging.getLogger("mechopd").warning(
            "lean decoding cannot run this model (%s): generating through transformers' model(...) instead", reason
        )
    return "hf"


def projections(model: Any) -> list[Any]:
    """The modules the decode step multiplies by (`_lin`), in order: per layer q, k, v, o, gate, up, down; the LM
    head (`layout.laid_out` lays out the large plain ``nn.Linear`` among them)."""
    mods = []
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        mods += [at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    return [*mods, model.lm_head]


def _rms(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = h.dtype
    if dtype == torch.float32 and weight.dtype == torch.float32:  # one fused call, same arithmetic in float32
        return F.rms_norm(h, (h.shape[-1],), weight, eps)
    h = h.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _lin(proj: Any, x: torch.Tensor) -> torch.Tensor:
    """A projection: its weight and bias for a plain ``nn.Linear`` (`layout.linear`: oneDNN for a large CPU float32
    weight, ``F.linear`` otherwise); any other module (a LoRA-adapted projection, `mechopd.models.lora`) is called,
    so that its adapter takes part in every decode step."""
    if type(proj) is torch.nn.Linear:
        return layout.linear(proj, x)
    return proj(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _eps(norm: Any) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


class LeanDecoder:
    """Prefill once (`prefill`), then `step` one token per row; holds the KV buffers of one `sample` call."""

    def __init__(self, model: Any):
        reason = lean_supported(model)
        if reason is not None:
            raise ModelError(
                f"lean decoding cannot run this model: {reason}; set {ENGINE_KEYS} to 'hf' or 'auto' "
                "(auto falls back to HF generation itself)"
            )
        sharded = next(
            (
                n
                for n, p in model.named_parameters()
                if type(p).__name__ == "DTensor" or type(getattr(p, "data", None)).__name__ == "DTensor"
            ),
            None,
        )
        if sharded is not None:
            raise ModelError(
                f"lean decoding got a sharded parameter ({sharded}); sample inside "
                "`sharding.gathered(model)` (the trainer does) so that every weight is whole"
            )
        self.model = model
        inner = model.model
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.head_dim**-0.5
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.norm = (inner.norm.weight, _eps(inner.norm))
        self.lm_head = model.lm_head
        self.layers = []
        for layer in inner.layers:
            at, mlp = layer.self_attn, layer.mlp
            qk_norm = None
            if hasattr(at, "q_norm"):
                qk_norm = (at.q_norm.weight, _eps(at.q_norm), at.k_norm.weight, _eps(at.k_norm))
            self.layers.append(
                (
                    layer.input_layernorm.weight,
                    _eps(layer.input_layernorm),
                    at.q_proj,
                    at.k_proj,
                    at.v_proj,
                    at.o_proj,
                    qk_norm,
                    layer.post_attention_layernorm.weight,
                    _eps(layer.post_attention_layernorm),
                    mlp.gate_proj,
                    mlp.up_proj,
                    mlp.down_proj,
                    mlp.act_fn,
                )
            )
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.bias = torch.empty(0)
        self.t = 0

    def prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, max_new_tokens: int, cache: Any = None
    ) -> torch.Tensor:
        """One ordinary forward over the prompts; returns the last position's logits ``[B, V]``.

        cache: a shared prefix's keys/values (generate/prefix.py); then `ids`/`pos` are the suffixes ``[B, S]`` and
        `mask` covers prefix + suffix ``[B, Lp + S]``."""
        extra = {} if cache is None else cache_kwargs(self.model, cache)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **extra
        )  # the LM head on the last column only: [B, P, V] would be GBs on real models
        cache = output_cache(out)
        B, P = mask.shape
        total = P + max_new_tokens
        self.keys, self.values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values  # [B, kv_heads, P, head_dim]
            kb = k.new_zeros(B, k.shape[1], total, k.shape[3])
            vb = v.new_zeros(B, v.shape[1], total, v.shape[3])
            kb[:, :, :P], vb[:, :, :P] = k, v
            self.keys.append(kb)
            self.values.append(vb)
        keep = torch.zeros(B, total, dtype=torch.bool, device=ids.device)
        keep[:, :P] = mask.bool()  # generated slots open one per step (`step`)
        self.bias = torch.zeros(B, 1, 1, total, dtype=kb.dtype, device=ids.device)  # additive attention mask
        self.bias.masked_fill_(~keep[:, None, None, :], torch.finfo(kb.dtype).min)
        # cos/sin of every position a row can reach, from the model's own rotary module (any rope scaling)
        reach = torch.arange(int(pos.max()) + max_new_tokens + 1, device=ids.device)[None]
        cos, sin = self.rotary(out.logits[:1, :1, :1].to(kb.dtype), reach)  # [1, positions, head_dim]
        self.cos, self.sin = cos[0], sin[0]
        self.t = P
        return out.logits[:, -1]

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Append token `tok` ``[B]`` at positions `pos` ``[B, 1]``; returns the next-token logits ``[B, V]``."""
        B, t = tok.shape[0], self.t
        h = F.embedding(tok[:, None], self.embed)  # [B, 1, d]
        cos = self.cos[pos][:, None]  # [B, 1, 1, head_dim]
        sin = self.sin[pos][:, None]
        self.bias[:, :, :, t] = 0.0
        bias = self.bias[..., : t + 1]  # [B, 1, 1, t + 1]
        groups = self.n_heads // self.n_kv
        for (w1, e1, q_proj, k_proj, v_proj, o_proj, qk_norm, w2, e2, gate, up, down, act), K, V in zip(
            self.layers, self.keys, self.values
        ):
            x = _rms(h, w1, e1)
            q = _lin(q_proj, x).view(B, 1, self.n_heads, self.head_dim)
            k = _lin(k_proj, x).view(B, 1, self.n_kv, self.head_dim)
            v = _lin(v_proj, x).view(B, 1, self.n_kv, self.head_dim)
            if qk_norm is not None:
                q, k = _rms(q, qk_norm[0], qk_norm[1]), _rms(k, qk_norm[2], qk_norm[3])
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, 1, head_dim]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            K[:, :, t : t + 1] = k
            V[:, :, t : t + 1] = v
            # one query per row: plain matmuls beat the fused kernel here; the query heads of a kv group share it
            qg = q.reshape(B, self.n_kv, groups, self.head_dim)
            w = torch.softmax(
                torch.matmul(qg, K[:, :, : t + 1].transpose(-1, -2)) * self.scale + bias, dim=-1, dtype=torch.float32
            ).to(q.dtype)  # [B, kv, groups, t + 1]
            a = torch.matmul(w, V[:, :, : t + 1])  # [B, kv, groups, head_dim] = heads in order
            h = h + _lin(o_proj, a.reshape(B, 1, -1))
            x = _rms(h, w2, e2)
            h = h + _lin(down, act(_lin(gate, x)) * _lin(up, x))
        h = _rms(h[:, 0], *self.norm)
        self.t = t + 1
        return _lin(self.lm_head, h)
