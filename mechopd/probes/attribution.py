"""Attribution patching: a first-order (or integrated-gradient) estimate of every activation patch at once, with its
faithfulness against exact patching (docs/method.md "Interventions and update geometry").

A pair is a recipient (model R, view v_R) and a donor (model D, view v_D) scored on the same token ids: ``c_to_x``
(R = D = the model, the no-context view receives the context view's activations) or ``--cross A,B`` (D = A's context
view into R = B's context view). The metric is the patching probe's: M = Σ_{b,t} KL(p_D ‖ p_R)(b, t) over the scored
positions t (the last prompt token and every response token but the last; logits / T). For an activation a at a site
(``resid``: decoder layer i's output; ``attn`` / ``mlp``: its attention / MLP block output; ``head`` h: head h's slice
of o_proj's INPUT, which holds num_attention_heads heads whatever the number of key/value heads, so GQA models work)
and one scored position t of item b:

    attribution(site, b, t) = (a_D − a_R)(b, t) · ∂M/∂a_R(b, t)                      (gradient × difference, at a_R)
    with ig_steps = K:        (a_D − a_R)(b, t) · (1/K) Σ_j ∂M/∂a(b, t) |_{a = a_R + α_j (a_D − a_R)},  α_j = (j + ½)/K
                              (the site's positions interpolated together; K → ∞: exactly the patch's ΔM, the
                              integrated-gradients completeness; K = 0 is plain attribution patching)
    recovered_attr = −Σ_{b,t} attribution / M_clean   (the patching probe's ``recovered`` = 1 − M_patched / M_clean)

Exact patching (`exact`) replaces a_R by a_D at every scored position of one site at a time (heads: one head's
slice) and measures M_patched; ``faithfulness`` = Pearson and Spearman correlation of recovered_attr with the exact
recovered over the shared sites, per component and over all, with the wall time of each method and their ratio.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from mechopd.core.errors import ConfigError
from mechopd.core.sites import resid_site
from mechopd.core.views import TwoViewBatch
from mechopd.models import module_at, num_layers
from mechopd.probes.capture import component_site

COMPONENTS = ("resid", "attn", "mlp", "head")


@dataclass(frozen=True)
class Site:
    """An attribution site: ``component`` of decoder ``layer`` (``head``: every head of the layer at once)."""

    layer: int
    component: str

    @property
    def name(self) -> str:
        return (
            resid_site(self.layer)
            if self.component == "resid"
            else (
                f"layers.{self.layer}.self_attn.o_proj"
                if self.component == "head"
                else component_site(self.layer, self.component)
            )
        )

    def module(self, model: nn.Module) -> nn.Module:
        return module_at(model, self.name)


def sites_of(model: nn.Module, layers: Sequence[int] | None, components: Sequence[str]) -> list[Site]:

    bad = [c for c in components if c not in COMPONENTS]
    if bad:
        raise ConfigError(f"attribution: component(s) {', '.join(bad)} unknown; choose from {', '.join(COMPONENTS)}")
    n = num_layers(model)
    bad_layers = [i for i in layers or () if isinstance(i, bool) or not isinstance(i, int) or not -n <= i < n]
    if bad_layers or (layers is not None and not layers):
        raise ConfigError(
            f"attribution: --layers {bad_layers[0] if bad_layers else 'names nothing'}"
            f"{' is not a decoder layer' if bad_layers else ''}: the model has {n} decoder layers (0..{n - 1}, or "
            f"-{n}..-1 from the end); pass --layers with indices in that range"
        )
    picked = range(n) if layers is None else dict.fromkeys(i % n for i in layers)  # -1: the last layer, once
    return [Site(i, c) for i in picked for c in components]


@contextmanager
def hooked(
    model: nn.Module,
    sites: Sequence[Site],
    start: int,
    width: int,
    store: dict,
    values: dict | None = None,
    leaves: dict | None = None,
) -> Iterator[None]:
    """Hooks that keep each site's ``[B, width, d]`` activation at columns ``start..start+width`` in ``store``,
    replace it by ``values[site]`` when given, and (``leaves`` not None) make the used value a grad leaf."""

    def swap(site: Site, h: torch.Tensor) -> torch.Tensor | None:
        seg = h[:, start : start + width]
        store[site] = seg.detach().clone()
        new = values.get(site) if values else None
        if leaves is None and new is None:
            return None
        new = seg if new is None else new.detach().to(h.dtype)  # a replaced value cuts the path upstream of it
        if leaves is not None:
            leaves[site] = torch.zeros_like(new, requires_grad=True)
            new = new + leaves[site]  # ∂M/∂leaf = ∂M/∂a; nothing downstream is cut
        return torch.cat([h[:, :start], new, h[:, start + width :]], dim=1)

    def out_hook(site: Site):
        def fn(_m, _i, output):
            h = output if isinstance(output, torch.Tensor) else output[0]
            h2 = swap(site, h)
            return None if h2 is None else (h2 if isinstance(output, torch.Tensor) else (h2, *output[1:]))

        return fn

    def pre_hook(site: Site):
        def fn(_m, args):
            h2 = swap(site, args[0])
            return None if h2 is None else (h2, *args[1:])

        return fn

    handles = [
        s.module(model).register_forward_pre_hook(pre_hook(s))
        if s.component == "head"
        else s.module(model).register_forward_hook(out_hook(s))
        for s in sites
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _logits(model: nn.Module, batch: TwoViewBatch, view: str) -> torch.Tensor:
    """``[B, R, V]`` at the scored positions (left layout: the last R + 1 columns but the last)."""
    R = batch.response_ids.shape[1]
    return model(**batch.view(view), use_cache=False, logits_to_keep=R + 1).logits[:, :R]


def _kl(target: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor, T: float) -> torch.Tensor:
    """Σ over masked positions of KL(target ‖ softmax(logits / T)); target: ``[B, R, V]`` log-probs."""
    lp = torch.log_softmax(logits.double() / T, dim=-1)
    return ((target.exp() * (target - lp)).sum(-1) * mask).sum()


@dataclass
class Pair:
    """recipient (model, view) ← donor (model, view)."""

    recipient: nn.Module
    view_r: str
    donor: nn.Module
    view_d: str

    def start(self, batch: TwoViewBatch) -> int:
        cols = batch.cols_x if self.view_r == "x" else batch.cols_c
        return int(cols[0, 0]) - 1  # the scored ("predict") columns, contiguous in the left layout


def _donor(pair: Pair, batch: TwoViewBatch, sites: Sequence[Site], T: float) -> tuple[dict, torch.Tensor]:
    store: dict = {}
    start_d = int((batch.cols_x if pair.view_d == "x" else batch.cols_c)[0, 0]) - 1
    with torch.inference_mode(), hooked(pair.donor, sites, start_d, batch.response_ids.shape[1], store):
        target = torch.log_softmax(_logits(pair.donor, batch, pair.view_d).double() / T, dim=-1)
    return {s: v.clone() for s, v in store.items()}, target.clone()


def _grads(
    pair: Pair, batch: TwoViewBatch, sites: Sequence[Site], target: torch.Tensor, T: float, values: dict | None = None
) -> tuple[dict[Site, torch.Tensor], float, dict]:
    """∂M/∂a at every site's scored positions in ONE backward (a zero leaf ADDED to each site's value, so no path
    through a later site is cut), M, and the activations used (``values`` replace some sites' activations first)."""
    store: dict[Site, torch.Tensor] = {}
    leaves: dict[Site, torch.Tensor] = {}
    with (
        torch.enable_grad(),
        hooked(pair.recipient, sites, pair.start(batch), batch.response_ids.shape[1], store, values, leaves),
    ):
        m = _kl(target, _logits(pair.recipient, batch, pair.view_r), batch.response_mask.double(), T)
        got = torch.autograd.grad(m, [leaves[s] for s in sites])
    return dict(zip(sites, (g.detach() for g in got))), float(m.detach()), store


def attribute_batch(
    pair: Pair, batch: TwoViewBatch, sites: Sequence[Site], T: float, ig_steps: int
) -> tuple[dict[Site, torch.Tensor], float, dict, dict]:
    """Per site the ``[B, R]`` (heads ``[B, R, H]``) attribution, M_clean, and the donor / recipient activations.
    ig_steps K > 0: per site, K passes with that site at a_R + α_j (a_D − a_R) (heads: all of the layer's together)."""
    a_d, target = _donor(pair, batch, sites, T)
    grads, m_clean, store = _grads(pair, batch, sites, target, T)
    a_r = {s: v.clone() for s, v in store.items()}
    if ig_steps:
        for site in sites:
            acc = torch.zeros_like(grads[site])
            for j in range(ig_steps):
                alpha = (j + 0.5) / ig_steps
                g, _, _ = _grads(pair, batch, [site], target, T, {site: a_r[site] + alpha * (a_d[site] - a_r[site])})
                acc += g[site] / ig_steps
            grads[site] = acc
    return {s: _dot(s, a_d[s] - a_r[s], grads[s], pair.recipient) for s in sites}, m_clean, a_d, a_r


def _dot(site: Site, diff: torch.Tensor, grad: torch.Tensor, model: nn.Module) -> torch.Tensor:
    prod = diff.double() * grad.double()  # [B, R, d]
    if site.component == "head":
        H = _n_heads(model)
        return prod.reshape(*prod.shape[:2], H, -1).sum(-1)  # [B, R, H]
    return prod.sum(-1)  # [B, R]


def _n_heads(model: nn.Module) -> int:
    cfg: Any = model.config  # a transformers config (nn.Module.__getattr__ is typed Tensor | Module)
    return int(cfg.num_attention_heads)


def exact_batch(
    pair: Pair, batch: TwoViewBatch, sites: Sequence[Site], T: float, a_d: dict, a_r: dict
) -> dict[tuple[Site, int | None], float]:
    """M_patched per site (heads: per (site, head)), one patched forward each: a_R := a_D at every scored position."""
    mask = batch.response_mask.double()
    target = _donor(pair, batch, [], T)[1]
    start, R = pair.start(batch), batch.response_ids.shape[1]
    out = {}
    for site in sites:
        patches: list[tuple[int | None, torch.Tensor]] = [(None, a_d[site])]
        if site.component == "head":
            H = _n_heads(pair.recipient)
            patches = []
            for h in range(H):
                v = a_r[site].reshape(*a_r[site].shape[:2], H, -1).clone()
                v[:, :, h] = a_d[site].reshape(*v.shape)[:, :, h]
                patches.append((h, v.reshape(a_r[site].shape)))
        for head, value in patches:
            with torch.inference_mode(), hooked(pair.recipient, [site], start, R, {}, {site: value}):
                out[(site, head)] = float(_kl(target, _logits(pair.recipient, batch, pair.view_r), mask, T))
    return out


def correlations(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """Pearson and Spearman (Pearson of average ranks) of two equal-length sequences; None below 3 points or when
    either is constant."""
    a, b = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return {"pearson": None, "spearman": None, "n": int(len(a))}
    ra, rb = rankdata(a), rankdata(b)
    return {"pearson": float(np.corrcoef(a, b)[0, 1]), "spearman": float(np.corrcoef(ra, rb)[0, 1]), "n": int(len(a))}


def rankdata(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based; ties share their mean rank), as scipy.stats.rankdata."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tie = x == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def timed(fn, *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def accumulate(
    pair: Pair, batches: Iterable[TwoViewBatch], sites: Sequence[Site], T: float, ig_steps: int, exact: bool
) -> dict[str, Any]:
    """Sums over a stream of batches: per (site, head, position) attribution, per (site, head) exact M_patched,
    M_clean, token and item counts, the seconds of each method."""
    attr: dict[tuple, float] = {}
    patched: dict[tuple, float] = {}
    m_clean, n_tok, n_items, t_attr, t_exact = 0.0, 0, 0, 0.0, 0.0
    for batch in batches:
        batch = batch.to(next(pair.recipient.parameters()).device)
        (per, m0, a_d, a_r), dt = timed(attribute_batch, pair, batch, sites, T, ig_steps)
        t_attr += dt
        mask = batch.response_mask
        for site, v in per.items():  # v: [B, R] or [B, R, H]
            v = v * mask.reshape(*mask.shape, *([1] * (v.dim() - 2))).double()
            sums = v.sum(0)  # [R] or [R, H]
            for t in range(sums.shape[0]):
                for h in [None] if sums.dim() == 1 else range(sums.shape[1]):
                    key = (site, h, t)
                    attr[key] = attr.get(key, 0.0) + float(sums[t] if h is None else sums[t, h])
        if exact:
            got, dt = timed(exact_batch, pair, batch, sites, T, a_d, a_r)
            t_exact += dt
            for k, v in got.items():
                patched[k] = patched.get(k, 0.0) + v
        m_clean += m0
        n_tok += int(mask.sum())
        n_items += batch.batch_size
    return {
        "attr": attr,
        "patched": patched,
        "m_clean": m_clean,
        "n_tokens": n_tok,
        "n_items": n_items,
        "seconds_attribution": t_attr,
        "seconds_exact": t_exact,
    }
