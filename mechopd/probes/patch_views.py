"""Activation patching between the two views of one model, as a pure function of the model and a stream of batches
(`mechopd.probes.patching`, whose docstring has the positions, the components and the fixed points): the plan of
patches, the running sums over batches, and ``patching``.

    c_to_x:  recovered = 1 − Σ_t KL(p_c ‖ p_x^{s,k}) / Σ_t KL(p_c ‖ p_x)
    x_to_c:  recovered = 1 − Σ_t KL(p_c^{s,k} ‖ p_x) / Σ_t KL(p_c ‖ p_x)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mechopd.core.errors import ConfigError
from mechopd.core.sites import site_depth, site_layer
from mechopd.core.views import TwoViewBatch
from mechopd.models import num_layers
from mechopd.probes import causal_items as ci
from mechopd.probes.capture import component_site, forward, resolve_sites

COMPONENTS = ("resid", "attn", "mlp")
DIRECTIONS = ("c_to_x", "x_to_c")
COLUMNS = (
    "model",
    "site",
    "component",
    "direction",
    "window",
    "recovered",
    "kl_clean",
    "kl_patched",
    "depth",
    "layer",
    "hook",
    "n_items",
    "n_tokens",
)
DETAIL_ITEMS = 16


@dataclass(frozen=True)
class Patch:
    """One patched forward: residual `site`, `component`, the hooked module `hook`, `direction`, `window`."""

    site: str
    component: str
    hook: str
    direction: str
    window: tuple[int, int] | None = None


def plan(
    model: nn.Module,
    sites: Sequence[int | str] | None,
    components: Sequence[str],
    directions: Sequence[str] = DIRECTIONS,
) -> list[Patch]:
    """Every (site, component, direction) to patch: resid at each requested residual site, attn / mlp at each
    requested decoder layer (their ``layers.{i}.resid_post`` site)."""
    bad = [c for c in components if c not in COMPONENTS] + [d for d in directions if d not in DIRECTIONS]
    if bad:
        raise ConfigError(
            f"patching: {', '.join(bad)} unknown; components are {', '.join(COMPONENTS)}, directions "
            f"{', '.join(DIRECTIONS)}"
        )
    out = []
    for site in resolve_sites(model, sites):
        layer = site_layer(site)
        for comp in components:
            if comp == "resid":
                out += [Patch(site, comp, site, d) for d in directions]
            elif layer is not None:
                out += [Patch(site, comp, component_site(layer, comp), d) for d in directions]
    return out


def windows(patches: Sequence[Patch], width: int | None, length: int) -> list[Patch]:
    """The resid patches again, one per window of `width` scored positions covering ``0..length-1``."""
    if width is None:
        return []
    if width < 1:
        raise ConfigError(f"window {width} is invalid: pass a number of positions >= 1")
    return [
        Patch(p.site, p.component, p.hook, p.direction, (a, min(a + width, length)))
        for p in patches
        if p.component == "resid"
        for a in range(0, length, width)
    ]


@dataclass
class PatchResult:
    """``rows`` (one per patch, `COLUMNS`) and ``tokens`` (per detail item: per-token clean / patched KL)."""

    rows: list[dict[str, Any]]
    tokens: list[dict[str, Any]] = field(default_factory=list)


class PatchAccumulator:
    """Running sums of one model's patching experiment (module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        patches: Sequence[Patch],
        temperature: float,
        *,
        window: int | None = None,
        detail: int = DETAIL_ITEMS,
    ) -> None:
        self.model, self.patches, self.T, self.window, self.detail = model, list(patches), temperature, window, detail
        self.hooks = list(dict.fromkeys(p.hook for p in self.patches))
        self.clean = 0.0
        self.n = self.items = 0
        self.sums: dict[Patch, float] = defaultdict(float)
        self.tokens: list[dict[str, Any]] = []

    def add(self, batch: TwoViewBatch) -> None:
        batch = batch.to(next(self.model.parameters()).device)
        mask = batch.response_mask
        fx = forward(self.model, batch, "x", capture=self.hooks, positions="predict")
        fc = forward(self.model, batch, "c", capture=self.hooks, positions="predict")
        lp = {"x": ci.logp(fx.logits, self.T), "c": ci.logp(fc.logits, self.T)}
        caps = {"x": fx, "c": fc}
        kl0 = ci.kl_rows(lp["c"], lp["x"])  # [B, R]
        clean = float(kl0[mask].double().sum())
        keep = max(0, min(batch.batch_size, self.detail - self.items))
        detail: list[dict[str, Any]] = [
            {"item": self.items + j, "kl": _round(kl0[j][mask[j]]), "kl_patched": {}} for j in range(keep)
        ]
        here = [*self.patches, *windows(self.patches, self.window, mask.shape[1])]
        for p in here:
            if p not in self.sums:  # a window first seen now: in earlier (shorter) batches it patched nothing
                self.sums[p] = self.clean if p.window is not None else 0.0
            kl = self._patched(batch, p, caps, lp)
            self.sums[p] += float(kl[mask].double().sum())
            if p.component == "resid" and p.direction == "c_to_x" and p.window is None:
                for j, d in enumerate(detail):
                    d["kl_patched"][p.site] = _round(kl[j][mask[j]])
        for p in set(self.sums) - set(here):  # a window past this batch's responses patches nothing
            self.sums[p] += clean
        self.clean += clean
        self.tokens += detail
        self.n += int(mask.sum())
        self.items += batch.batch_size

    def _patched(self, batch: TwoViewBatch, p: Patch, caps: dict, lp: dict) -> torch.Tensor:
        """``[B, R]`` KL of the patched view against the other view's clean distribution."""
        recipient, donor = ("x", "c") if p.direction == "c_to_x" else ("c", "x")
        mask = batch.response_mask
        if p.window is not None:
            cols = torch.arange(mask.shape[1], device=mask.device)
            mask = mask & (cols >= p.window[0]) & (cols < p.window[1])
        out = forward(self.model, batch, recipient, edit={p.hook: caps[donor][p.hook]}, positions="predict", mask=mask)
        patched = ci.logp(out.logits, self.T)
        return ci.kl_rows(lp["c"], patched) if recipient == "x" else ci.kl_rows(patched, lp["x"])

    def result(self, label: str, n_layers: int) -> PatchResult:
        rows = []
        for p in self.sums:  # first-seen order: the plan, then its windows
            kl0, kl1 = self.clean / max(self.n, 1), self.sums[p] / max(self.n, 1)
            rows.append(
                {
                    "model": label,
                    "site": p.site,
                    "component": p.component,
                    "direction": p.direction,
                    "window": "all" if p.window is None else f"{p.window[0]}-{p.window[1] - 1}",
                    "recovered": 1.0 - self.sums[p] / self.clean if self.clean > 0 else float("nan"),
                    "kl_clean": kl0,
                    "kl_patched": kl1,
                    "depth": site_depth(p.site, n_layers),
                    "layer": site_layer(p.site),
                    "hook": p.hook,
                    "n_items": self.items,
                    "n_tokens": self.n,
                }
            )
        return PatchResult(rows, [{**d, "model": label} for d in self.tokens])


def _round(t: torch.Tensor) -> list[float]:
    return [float(f"{float(v):.7g}") for v in t]  # 7 significant digits


def patching(
    model: nn.Module,
    batches: Iterable[TwoViewBatch],
    *,
    temperature: float,
    sites: Sequence[int | str] | None = None,
    components: Sequence[str] = COMPONENTS,
    directions: Sequence[str] = DIRECTIONS,
    window: int | None = None,
    label: str = "model",
    detail: int = DETAIL_ITEMS,
) -> PatchResult:
    """Two-view patching of one model over a stream of batches (module docstring): a pure function of both."""
    model.eval()
    acc = PatchAccumulator(model, plan(model, sites, components, directions), temperature, window=window, detail=detail)
    for batch in batches:
        acc.add(batch)
    return acc.result(label, num_layers(model))
