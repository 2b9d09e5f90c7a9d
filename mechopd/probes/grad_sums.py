"""The memory-bounded gradient sums of the gradients probe (`mechopd.probes.gradients`): term a's gradient copied
into ONE flat buffer, term b's compared with it slice by slice; per parameter, in float64,

    (<g_a, g_b>, ||g_a||^2, ||g_b||^2)
"""

from __future__ import annotations

import torch
from torch import nn


def _grads(value: torch.Tensor, params: list[nn.Parameter], retain: bool) -> list[torch.Tensor | None]:
    return list(torch.autograd.grad(value, params, retain_graph=retain, allow_unused=True))


def _flatten_into(
    grads: list[torch.Tensor | None], sizes: list[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Copy gradients into one preallocated flat buffer, releasing each autograd tensor as it goes. ``[Σ numel]``."""
    flat = torch.zeros(sum(sizes), dtype=dtype, device=device)
    offset = 0
    for i, size in enumerate(sizes):
        g = grads[i]
        if g is not None:
            flat[offset : offset + size].copy_(g.reshape(-1))
        grads[i] = None  # drop autograd's copy now
        offset += size
    return flat


def _param_sums(flat_a: torch.Tensor, grads_b: list[torch.Tensor | None], sizes: list[int]) -> list[tuple[float, ...]]:
    """Per parameter: ``(<g_a, g_b>, ‖g_a‖², ‖g_b‖²)`` in float64."""
    out: list[tuple[float, ...]] = []
    offset = 0
    for g_b, size in zip(grads_b, sizes):
        a = flat_a[offset : offset + size].double()
        b = torch.zeros_like(a) if g_b is None else g_b.reshape(-1).double()
        out.append((float(a @ b), float(a @ a), float(b @ b)))
        offset += size
    return out


def view_sums(
    flat_a: torch.Tensor, grads_b: list[torch.Tensor | None], params: list[nn.Parameter], views: list[list]
) -> tuple[list[str], list[tuple[float, ...]], list[int]]:
    """`_param_sums` per canonical view (`mechopd.models.arch.ParamView`; ``views[i]``: those of ``params[i]``): a
    fused q/k/v (gate/up) tensor's parts get their own sums. Returns (view names, sums, sizes)."""
    names: list[str] = []
    out: list[tuple[float, ...]] = []
    sizes: list[int] = []
    offset = 0
    for g_b, p, vs in zip(grads_b, params, views):
        a = flat_a[offset : offset + p.numel()].view(p.shape).double()
        b = torch.zeros_like(a) if g_b is None else g_b.double()
        for v in vs:
            va, vb = v.take(a).reshape(-1), v.take(b).reshape(-1)
            names.append(v.name)
            out.append((float(va @ vb), float(va @ va), float(vb @ vb)))
            sizes.append(va.numel())
        offset += p.numel()
    return names, out, sizes
