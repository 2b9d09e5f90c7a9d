"""Projection weights laid out once for small-row GEMMs: the lean decoder's large float32 projections on the CPU
(issue 58 item 2).

Why: a decode step multiplies B = 1-16 rows by every weight, so it is bound by reading the weights (538 MB per step
for SmolLM2-135M). MKL's ``sgemm`` (``F.linear``) reads a large row-major weight at 6-10 GB/s on 1-4 rows here
(the 113 MB LM head at 6.5 GB/s) against a ~20 GB/s read rate; oneDNN's inner product, given its weight in its own
blocked layout, reads it at 13-18 GB/s (bench/floors.py measures both in one run).

What it computes: for a CPU float32 ``nn.Linear`` whose weight has at least `MIN_ELEMENTS` elements, the lean decoder
(`lean._lin`) computes ``y = x Wᵀ + b`` with oneDNN (``torch.ops.mkldnn._linear_pointwise``, the op PyTorch's own
CPU compiler emits) instead of MKL: the same float32 products, summed in oneDNN's order (the logits differ from
``model(...)``'s by ~1e-6 relative, as the lean decoder's attention already did; greedy ids equal ``generate`` in the
tests). Smaller weights stay on ``F.linear``: they sit in the cache, where oneDNN's ~12 µs call overhead loses (measured
crossover ~2^17 elements at 4 rows; every model organism's weights are below it, so their arithmetic is unchanged).

The layout is a cache, never a different number: inside a `laid_out` block the oneDNN call reads the re-laid-out copy
of the weight, outside it the weight itself (oneDNN re-lays it out per call); both give the same bits (tested), except
that a one-row call always reads the weight itself (oneDNN's one-row kernel, which the laid-out copy would not use).
A block copies the weights ONCE when it opens (~0.45 s for SmolLM2-135M, ~70 % of it the first touch of fresh
memory) and holds the copies until it closes; the weights must not change inside it (`sampler.sample_rows`, the one
entry point every caller samples through, opens one around its sampling calls, where nothing trains). Nested blocks
share the outer copies."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

MIN_ELEMENTS = 1 << 17  # weights at least this large go through oneDNN (512 KiB float32; measured crossover, above)
LAYOUT_ROWS = 4  # the row count the copies are laid out for (their kernels serve 2-64 rows alike: measured)
MIN_DECODE_STEPS = 16  # a block pays for its copy over about this many batch-4 decode steps (`worth_laying_out`)

_LAID: weakref.WeakKeyDictionary[nn.Linear, torch.Tensor] = weakref.WeakKeyDictionary()  # open blocks' copies


def _onednn() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn(weight: torch.Tensor) -> bool:
    """Whether a projection with this weight goes through oneDNN (CPU, float32, 2-D, ≥ `MIN_ELEMENTS`)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and weight.numel() >= MIN_ELEMENTS
        and type(weight).__name__ not in ("DTensor",)
        and type(getattr(weight, "data", None)).__name__ != "DTensor"
        and _onednn()
    )


def linear(proj: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``x Wᵀ + b`` for a plain ``nn.Linear`` (inference only): oneDNN for a large CPU float32 weight (its laid-out
    copy inside a `laid_out` block, for calls of more than one row), ``F.linear`` otherwise."""
    w = proj.weight
    if not onednn(w):
        return F.linear(x, w, proj.bias)
    rows = x.numel() // x.shape[-1]
    laid = _LAID.get(proj) if rows > 1 else None
    return torch.ops.mkldnn._linear_pointwise(x, w if laid is None else laid, proj.bias, "none", [], "")


def _targets(model: Any) -> list[nn.Linear]:
    return [m for m in model.modules() if type(m) is nn.Linear and onednn(m.weight)]


def worth_laying_out(model: Any, decode_steps: int) -> bool:
    """Whether a block over `decode_steps` decode steps (max_new_tokens x sampling calls) pays for its copy: at least
    `MIN_DECODE_STEPS`, and a weight that goes through oneDNN."""
    return decode_steps >= MIN_DECODE_STEPS and bool(_targets(model))


@contextlib.contextmanager
def laid_out(model: Any) -> Iterator[int]:
    """Within the block, `linear` reads a copy of each of `model`'s oneDNN projections laid out for small-row GEMMs;
    yields how many it laid out (a block nested in one over the same model lays out none: it reads the outer copies).
    The weights must not change inside the block (the copies would be stale)."""
    mine = [m for m in _targets(model) if m not in _LAID]
    with torch.no_grad():
        for m in mine:
            _LAID[m] = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), LAYOUT_ROWS)
    try:
        yield len(mine)
    finally:
        for m in mine:
            _LAID.pop(m, None)
