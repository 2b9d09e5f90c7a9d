"""The same two-view cosine through TransformerLens and nnsight, on any checkpoint the trainer writes.

* TransformerLens 4.x: `to_transformer_lens` boots a ``TransformerBridge`` from the local checkpoint directory
  (``TransformerBridge.boot_transformers(DIR, tokenizer=...)``; no hub access for a local path) and calls
  ``enable_compatibility_mode(no_processing=True)``: HookedTransformer hook names (``blocks.{i}.hook_resid_post``),
  raw HF weights (no LayerNorm folding, no centring), so activations equal the HF model's. The bridge forces eager
  attention; against HF's default sdpa kernels the activations differ by float rounding only (~1e-7 in float32).
* nnsight 0.8: `to_nnsight` wraps the checkpoint in ``nnsight.TransformersModel(DIR, task="text-generation")``
  (``LanguageModel`` is the same class under a deprecated name in 0.8) and `two_view_cosine_nnsight` saves the
  modules' outputs inside ``.trace()``.

Site mapping (models/ names -> backend addresses):
  ``embed``                 TL ``hook_embed``                    nnsight ``model.embed_tokens.output``
  ``layers.{i}.resid_post`` TL ``blocks.{i}.hook_resid_post``    nnsight ``model.layers[i].output``
  ``final_norm``            TL ``ln_final.hook_out``             nnsight ``model.norm.output``
Both functions feed each view's full ``[batch, seq, d]`` activations (the backends cache whole sequences) through
``TwoViewBatch.response_hidden`` into the accumulator `view_cosine.two_view_cosine` uses, so the tables are identical
in form and, up to float rounding, in value.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from mechopd.core.errors import ModelError
from mechopd.core.sites import site_layer, sites_for
from mechopd.core.views import TwoViewBatch
from mechopd.models import load_tokenizer, quiet_progress
from mechopd.probes.view_cosine import CosineAccumulator, SimilarityResult


def _checkpoint(path: str | os.PathLike) -> str:
    p = str(path)
    if not os.path.isfile(os.path.join(p, "config.json")):
        raise ModelError(
            f"{p} is not a checkpoint directory (no config.json); pass a directory the trainer wrote, "
            "e.g. runs/NAME/final"
        )
    return p


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def tl_hook_name(site: str) -> str:
    """TransformerLens (compatibility names) address of a probe site."""
    if site == "embed":
        return "hook_embed"
    if site == "final_norm":
        return "ln_final.hook_out"
    return f"blocks.{site_layer(site)}.hook_resid_post"


def to_transformer_lens(
    checkpoint_dir: str | os.PathLike, *, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> Any:
    """A TransformerLens ``TransformerBridge`` on a local checkpoint, compatibility names, no weight processing."""
    path = _checkpoint(checkpoint_dir)
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        raise ModelError("transformer-lens is not installed; pip install 'transformer-lens>=4'") from None
    try:
        with quiet_progress():  # no per-load progress bar (as mechopd.models.load_model)
            bridge = TransformerBridge.boot_transformers(
                path, device=device, dtype=dtype, tokenizer=load_tokenizer(path)
            )
    except (ValueError, OSError, KeyError, NotImplementedError) as e:
        raise ModelError(f"TransformerLens cannot load {path}: {_first_line(e)}") from None
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    return bridge.eval()


def to_nnsight(checkpoint_dir: str | os.PathLike, *, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Any:
    """An ``nnsight.TransformersModel`` (text generation) on a local checkpoint, weights loaded (dispatched)."""
    path = _checkpoint(checkpoint_dir)
    try:
        from nnsight import TransformersModel
    except ImportError:
        raise ModelError("nnsight is not installed (or older than 0.8); pip install 'nnsight>=0.8'") from None
    try:
        with quiet_progress():
            lm = TransformersModel(
                path,
                task="text-generation",
                tokenizer=load_tokenizer(path),
                dispatch=True,
                device_map=device,
                dtype=dtype,
            )
    except (ValueError, OSError, KeyError) as e:
        raise ModelError(f"nnsight cannot load {path}: {_first_line(e)}") from None
    lm.eval()
    return lm


def predict_stop(batch: TwoViewBatch, h: torch.Tensor, which: str) -> torch.Tensor:
    """``[B, L, d]`` -> ``[B, R + 1, d]`` at the similarity probe's ``"predict_stop"`` positions (capture.py): the R
    predicting positions, then the last response slot's own state."""
    return torch.cat([batch.response_logits(h, which), batch.response_hidden(h, which)[:, -1:]], dim=1)


def _views(batch: TwoViewBatch):
    for which in ("x", "c"):
        yield which, batch.view(which)


def two_view_cosine_tl(
    bridge: Any,
    batches: Iterable[TwoViewBatch],
    layers: Sequence[int | str] | None = None,
    *,
    label: str = "transformer_lens",
    uids: Sequence[str] | None = None,
) -> SimilarityResult:
    """`view_cosine.two_view_cosine` (no CKA) through ``bridge.run_with_cache`` with the view's attention mask and
    position ids."""
    n = int(bridge.cfg.n_layers)
    sites = sites_for(n, layers)
    names = [tl_hook_name(s) for s in sites]
    missing = [h for h in names if h not in bridge.hook_dict]
    if missing:
        raise ModelError(f"the TransformerLens bridge has no hook {missing[0]!r}; was compatibility mode enabled?")
    acc = CosineAccumulator(sites, n)
    device = bridge.cfg.device
    for batch in batches:
        batch = batch.to(device)
        got = {}
        for which, kw in _views(batch):
            with torch.inference_mode():
                _, cache = bridge.run_with_cache(
                    kw["input_ids"],
                    attention_mask=kw["attention_mask"],
                    position_ids=kw["position_ids"],
                    names_filter=names,
                )
            got[which] = {s: predict_stop(batch, cache[h], which) for s, h in zip(sites, names)}  # [B, R + 1, d]
            del cache
        for s in sites:
            acc.add(s, got["x"][s], got["c"][s], batch.response_mask)
    return SimilarityResult(acc.site_rows(label), acc.example_rows(label, uids))


def _envoy(lm: Any, site: str) -> Any:
    if site == "embed":
        return lm.model.embed_tokens
    if site == "final_norm":
        return lm.model.norm
    return lm.model.layers[site_layer(site)]


def _trace_outputs(lm: Any, inputs: dict, sites: Sequence[str]) -> list:
    """One nnsight trace saving the sites' outputs (in forward order: nnsight requires that order)."""
    saved: list = []  # nnsight runs the body itself: a name bound in a comprehension inside it is lost, so append
    with torch.inference_mode():
        with lm.trace(dict(inputs)):  # and keep the trace a plain, single `with`
            for s in sites:
                saved.append(_envoy(lm, s).output.save())
    return saved


def two_view_cosine_nnsight(
    lm: Any,
    batches: Iterable[TwoViewBatch],
    layers: Sequence[int | str] | None = None,
    *,
    label: str = "nnsight",
    uids: Sequence[str] | None = None,
) -> SimilarityResult:
    """`view_cosine.two_view_cosine` (no CKA) through ``lm.trace(...)``, saving each site's module output."""
    n = len(lm.model.layers)
    sites = sites_for(n, layers)
    acc = CosineAccumulator(sites, n)
    device = next(lm.parameters()).device
    for batch in batches:
        batch = batch.to(device)
        got = {}
        for which, kw in _views(batch):
            saved = _trace_outputs(lm, kw, sites)
            outs = [o if isinstance(o, torch.Tensor) else o[0] for o in saved]  # transformers <5 layers: tuples
            got[which] = {s: predict_stop(batch, o, which) for s, o in zip(sites, outs)}  # [B, R + 1, d]
        for s in sites:
            acc.add(s, got["x"][s], got["c"][s], batch.response_mask)
    return SimilarityResult(acc.site_rows(label), acc.example_rows(label, uids))
