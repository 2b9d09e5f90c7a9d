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
A block copies the weights ONCE when it opens (0.2-0.45 s for SmolLM2-135M, much of it the first touch of fresh
memory), holds the copies (one more copy of the large weights in memory) until it closes, and refuses a weight that
changed inside it (version counter or storage moved: `StaleLayout`); `sampler.sample_rows`, the one entry point every
caller samples through, opens one around its sampling calls, where nothing trains. Nested blocks share the outer
copies. Under autograd (grad mode and a weight or input that requires grad) `linear` is ``F.linear``: the oneDNN op
has no backward."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

MIN_ELEMENTS = 1 << 17  # weights at least this large go through oneDNN (512 KiB float32; measured crossover, above)
LAYOUT_ROWS = 4  # the row count the copies are laid out for (their kernels serve 2-64 rows alike: measured)
MIN_DECODE_STEPS = 16  # a block pays for its copy over about this many batch-4 decode steps (`worth_laying_out`)

# the open blocks' copies: module -> (copy, the weight's version counter and storage when copied)
_LAID: weakref.WeakKeyDictionary[nn.Linear, tuple[torch.Tensor, int, int]] = weakref.WeakKeyDictionary()


class StaleLayout(RuntimeError):
    """A weight changed inside a `laid_out` block: its laid-out copy no longer holds it."""


def onednn(weight: torch.Tensor) -> bool:
    """Whether a projection with this weight goes through oneDNN (CPU, float32, 2-D, ≥ `MIN_ELEMENTS`, not a
    sharded DTensor; oneDNN built and enabled: ``torch.backends.mkldnn``)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and weight.numel() >= MIN_ELEMENTS
        and type(weight).__name__ != "DTensor"
        and type(getattr(weight, "data", None)).__name__ != "DTensor"
        and torch.backends.mkldnn.is_available()
        and bool(torch.backends.mkldnn.enabled)
    )


def linear(proj: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``x Wᵀ + b`` for a plain ``nn.Linear``: oneDNN for a large CPU float32 weight outside autograd (its laid-out
    copy inside a `laid_out` block, for calls of more than one row), ``F.linear`` otherwise."""
    w = proj.weight
    if not onednn(w) or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)):
        return F.linear(x, w, proj.bias)
    entry = _LAID.get(proj) if x.numel() > x.shape[-1] else None  # one row: the weight itself
    if entry is None:
        return torch.ops.mkldnn._linear_pointwise(x, w, proj.bias, "none", [], "")
    copy, version, storage = entry
    if w._version != version or w.data_ptr() != storage:
        raise StaleLayout(
            "a projection's weight changed inside a layout.laid_out block (its copy is stale); change weights "
            "only outside the block"
        )
    return torch.ops.mkldnn._linear_pointwise(x, copy, proj.bias, "none", [], "")


def targets(modules: Iterable[Any]) -> list[nn.Linear]:
    """The plain ``nn.Linear`` among `modules` whose weight goes through oneDNN."""
    return [m for m in modules if type(m) is nn.Linear and onednn(m.weight)]


def worth_laying_out(modules: Iterable[Any], decode_steps: int) -> bool:
    """Whether a block over `decode_steps` decode steps of 2 or more rows pays for its copy: at least
    `MIN_DECODE_STEPS`, and a weight that goes through oneDNN."""
    return decode_steps >= MIN_DECODE_STEPS and bool(targets(modules))


@contextlib.contextmanager
def laid_out(modules: Iterable[Any]) -> Iterator[int]:
    """Within the block, `linear` reads a copy of each oneDNN projection among `modules` (the lean decoder's:
    `lean.projections`) laid out for small-row GEMMs; yields how many it laid out (a block nested in one over the
    same modules lays out none: it reads the outer copies). A weight changed inside the block is refused at its next
    use (`StaleLayout`); the copies are dropped when the block closes, however it closes."""
    mine: list[nn.Linear] = []
    try:
        with torch.no_grad():
            for m in targets(modules):
                if m in _LAID:
                    continue
                w = m.weight
                _LAID[m] = (torch.ops.mkldnn._reorder_linear_weight(w.detach(), LAYOUT_ROWS), w._version, w.data_ptr())
                mine.append(m)
        yield len(mine)
    finally:
        for m in mine:
            _LAID.pop(m, None)
