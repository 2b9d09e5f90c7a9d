"""The two-view cosine of the similarity probe, as pure functions of models and batches (`mechopd.probes.similarity`,
whose docstring says which positions are compared and why, and the memory model): per-token cosines, their running
per-site aggregates, and the comparison of one or several models on the same batches.

    cos_t(s) = <h_x(s, t), h_c(s, t)> / (||h_x(s, t)|| ||h_c(s, t)||)         (float32)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from mechopd.core.errors import ModelError
from mechopd.core.sites import site_depth, site_layer
from mechopd.core.views import TwoViewBatch
from mechopd.models import num_layers
from mechopd.probes.capture import resolve_sites, run_views
from mechopd.probes.cka import StreamingCKA

ARCH_FIELDS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
)


def token_cosine(hx: torch.Tensor, hc: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``[..., d]`` x ``[..., d]`` -> ``[...]`` cosine per token, computed in float32.

    Two zero vectors (e.g. the embedding of a pad id that a sampled response contains) count as identical: 1; a zero
    vector against a non-zero one gives 0.
    """
    hx, hc = hx.float(), hc.float()
    nx, nc = hx.norm(dim=-1), hc.norm(dim=-1)
    cos = (hx * hc).sum(-1) / (nx * nc).clamp_min(eps)
    return torch.where((nx == 0) & (nc == 0), torch.ones_like(cos), cos)


class _Buffer:
    """An append-only 1-D CPU tensor that doubles its capacity: O(log n) long-lived allocations.

    (Appending one small tensor per batch instead interleaves long-lived small blocks with a forward's large transient
    ones; the heap fragments and the process's RSS creeps with the number of batches.)
    """

    def __init__(self, dtype: torch.dtype, capacity: int = 4096) -> None:
        self.data, self.n = torch.empty(capacity, dtype=dtype), 0

    def append(self, values: torch.Tensor) -> None:
        k = values.numel()
        if self.n + k > self.data.numel():
            grown = torch.empty(max(2 * self.data.numel(), self.n + k), dtype=self.data.dtype)
            grown[: self.n] = self.data[: self.n]
            self.data = grown
        self.data[self.n : self.n + k] = values.reshape(-1)  # copies off the device
        self.n += k

    def values(self) -> torch.Tensor:
        return self.data[: self.n]


@dataclass
class _SiteStats:
    tokens: _Buffer = field(default_factory=lambda: _Buffer(torch.float32))  # per-token cosines
    example_means: _Buffer = field(default_factory=lambda: _Buffer(torch.float64, 256))  # per example (NaN: empty)
    example_tokens: _Buffer = field(default_factory=lambda: _Buffer(torch.int64, 256))  # response tokens per example
    stop: _Buffer = field(default_factory=lambda: _Buffer(torch.float32, 256))  # the last token's own state, per row
    cka: StreamingCKA | None = None


class CosineAccumulator:
    """Running per-site aggregates of the two-view cosine for one model (see the module docstring's memory model)."""

    def __init__(self, sites: Sequence[str], n_layers: int, cka: bool = False) -> None:
        self.sites, self.n_layers = list(sites), n_layers
        self.stats = {s: _SiteStats(cka=StreamingCKA() if cka else None) for s in sites}

    def add(self, site: str, hx: torch.Tensor, hc: torch.Tensor, mask: torch.Tensor) -> None:
        """hx, hc: ``[batch, R + 1, d]`` states of both views at the ``"predict_stop"`` positions (capture.py: index t
        < n predicts token t, index n is the last token's own state) or ``[batch, R, d]`` (every index averaged);
        mask: ``[batch, R]`` real response tokens."""
        st = self.stats[site]
        mask = mask.to(hx.device)
        cos = token_cosine(hx, hc)  # [B, R (+ 1)]
        if cos.shape[1] == mask.shape[1] + 1:  # predicting positions, then the last token's own state apart
            n = mask.sum(1)  # [B]
            stop = torch.nn.functional.one_hot(n, cos.shape[1]).bool() & (n > 0)[:, None]  # [B, R + 1]
            st.stop.append(cos[stop])
            mask = torch.cat([mask, torch.zeros_like(mask[:, :1])], dim=1)  # [B, R + 1]
        counts = mask.sum(1)  # [B]
        means = (cos * mask).sum(1).double() / counts.clamp_min(1)  # [B]
        st.tokens.append(cos[mask])
        st.example_means.append(torch.where(counts > 0, means, torch.nan))
        st.example_tokens.append(counts)
        if st.cka is not None:
            st.cka.add(hx[mask], hc[mask])  # [n_valid, d] each

    def site_rows(self, label: str) -> list[dict]:
        """One row per site: model, site, depth, layer, n_examples, n_tokens, cos_mean, cos_median, ..."""
        rows = []
        for s in self.sites:
            st = self.stats[s]
            vals = st.tokens.values().double().numpy()
            ex = st.example_means.values().numpy()
            ex = ex[~np.isnan(ex)]
            row = {
                "model": label,
                "site": s,
                "depth": site_depth(s, self.n_layers),
                "layer": site_layer(s),
                "n_examples": int(ex.size),
                "n_tokens": int(vals.size),
                "cos_mean": float(vals.mean()) if vals.size else float("nan"),
                "cos_median": float(np.median(vals)) if vals.size else float("nan"),
                "cos_example_mean": float(ex.mean()) if ex.size else float("nan"),
                "cos_stop": float(st.stop.values().double().mean()) if st.stop.n else float("nan"),
            }
            if st.cka is not None:
                row["cka"] = st.cka.value()
            rows.append(row)
        return rows

    def example_rows(self, label: str, uids: Sequence[str] | None = None) -> list[dict]:
        """One row per (example, site): model, example, uid, site, depth, layer, n_tokens, cos_mean."""
        rows = []
        for s in self.sites:
            st = self.stats[s]
            means, counts = st.example_means.values().tolist(), st.example_tokens.values().tolist()
            for i, (m, c) in enumerate(zip(means, counts)):
                rows.append(
                    {
                        "model": label,
                        "example": i,
                        "uid": uids[i] if uids is not None else str(i),
                        "site": s,
                        "depth": site_depth(s, self.n_layers),
                        "layer": site_layer(s),
                        "n_tokens": int(c),
                        "cos_mean": float(m),
                    }
                )
        return rows


@dataclass
class SimilarityResult:
    """``rows``: one per (model, site); ``example_rows``: one per (model, example, site). Tidy, CSV-ready."""

    rows: list[dict]
    example_rows: list[dict]


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _add_batch(model: nn.Module, acc: CosineAccumulator, batch: TwoViewBatch) -> None:
    """Both views of one batch through the model; cosines per site computed as the context view's hooks fire."""
    batch = batch.to(_device(model))
    run_views(
        model, batch, acc.sites, lambda s, hx, hc: acc.add(s, hx, hc, batch.response_mask), positions="predict_stop"
    )


def two_view_cosine(
    model: nn.Module,
    batches: Iterable[TwoViewBatch],
    layers: Sequence[int | str] | None = None,
    cka: bool = False,
    *,
    label: str = "model",
    uids: Sequence[str] | None = None,
    progress: bool = False,
) -> SimilarityResult:
    """Per-site two-view cosine (and optional CKA) of one model over a stream of batches (module docstring).

    layers: None = every site; else decoder indices and/or site names (`capture.resolve_sites`).
    uids: one per example in iteration order (for the per-example table); default: the example's index.
    """
    model.eval()
    acc = CosineAccumulator(resolve_sites(model, layers), num_layers(model), cka)
    for batch in tqdm(batches, desc=f"similarity {label}", disable=not progress, leave=False):
        _add_batch(model, acc, batch)
    return SimilarityResult(acc.site_rows(label), acc.example_rows(label, uids))


def check_same_architecture(configs: Mapping[str, object]) -> None:
    """Refuse models of different architectures or shapes in one comparison (`ModelError` naming the field)."""
    items = list(configs.items())
    (ref_label, ref), rest = items[0], items[1:]
    for label, cfg in rest:
        for f in ARCH_FIELDS:
            a, b = getattr(ref, f, None), getattr(cfg, f, None)
            if a != b:
                raise ModelError(
                    f"models {ref_label!r} and {label!r} differ in {f} ({a} vs {b}); a similarity "
                    "comparison needs checkpoints of one architecture and shape"
                )


def compare_models(
    models: Mapping[str, nn.Module],
    batches: Iterable[TwoViewBatch],
    layers: Sequence[int | str] | None = None,
    cka: bool = False,
    *,
    uids: Sequence[str] | None = None,
    progress: bool = False,
) -> SimilarityResult:
    """`two_view_cosine` for several models on the same batches (same items, same responses).

    Iterates the batches once (batch-outer, model-inner), so a one-shot generator works; every model is resident.
    To hold one model at a time, call `two_view_cosine` per model on a re-iterable batch source (`ProbeItems`).
    """
    if not models:
        raise ModelError("compare_models got no models; pass e.g. {'base': model_a, 'opd': model_b}")
    check_same_architecture({k: m.config for k, m in models.items()})
    for m in models.values():
        m.eval()
    first = next(iter(models.values()))
    sites, n = resolve_sites(first, layers), num_layers(first)
    accs = {label: CosineAccumulator(sites, n, cka) for label in models}
    for batch in tqdm(batches, desc="similarity", disable=not progress, leave=False):
        for label, model in models.items():
            _add_batch(model, accs[label], batch)
    rows = [r for label, a in accs.items() for r in a.site_rows(label)]
    ex_rows = [r for label, a in accs.items() for r in a.example_rows(label, uids)]
    return SimilarityResult(rows, ex_rows)
