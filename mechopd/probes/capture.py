"""Forward hooks that capture the residual stream at probe sites, at the response positions only.

Sites (named in mechopd.sites, forward order):
  ``embed``                output of ``model.model.embed_tokens``          depth 0
  ``layers.{i}.resid_post``  output of decoder layer i                      depth i + 1
  ``final_norm``           output of ``model.model.norm``                 depth n_layers + 1
``depth`` is the site's position in that order (a numeric axis for tables and plots); ``layer`` is the decoder index i
(None for ``embed`` / ``final_norm``). HF's ``output_hidden_states`` has no entry for the LAST decoder layer's output
(its last entry is the final norm's output); these hooks capture it.

What is non-standard here:
  * The hook gathers the response columns of the view (``TwoViewBatch.response_hidden``) and copies them, so nothing
    ``[batch, seq, d]`` outlives the module call: a capture holds ``[batch, R, d]`` per requested site.
  * The forward runs through the decoder stack (``model.model``), never ``lm_head`` (logits are ``[batch, seq, V]``,
    the largest tensor of a forward), with ``use_cache=False``, under ``torch.inference_mode()``.
  * It stops after the last requested site: that site's hook raises a private exception which `run_view` catches
    (transformers' output recorders reset in ``finally``, so an interrupted forward leaves no state behind).
  * transformers 5 decoder layers return a tensor, older ones a tuple whose first element is the hidden state; both
    are handled (``_hidden``), and `patch_response` writes back in the same form.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from mechopd.errors import ConfigError, ModelError
from mechopd.generate.groups import take_rows, ungroup, view_groups
from mechopd.generate.prefix import view_inputs
from mechopd.models import decoder_layers, module_at
from mechopd.sites import site_depth, site_layer, sites_for  # noqa: F401  (the naming table; re-exported here)
from mechopd.views import TwoViewBatch

OnCapture = Callable[[str, torch.Tensor], None]  # (site, hidden [batch, R, d]) -> None


class _StopForward(Exception):
    """Raised by the last needed hook: nothing after that site is computed."""


def all_sites(model: nn.Module) -> list[str]:
    """Every probe site of the model in forward order: embed, layers.0.resid_post, ..., final_norm."""
    return sites_for(len(decoder_layers(model)))


def resolve_sites(model: nn.Module, layers: Sequence[int | str] | None = None) -> list[str]:
    """Requested sites in forward order, deduplicated.

    layers: None (every site), or items that are decoder layer indices (``3``, ``-1``: negative counts from the end)
    or site names (``"embed"``, ``"layers.3.resid_post"``, ``"final_norm"``). Out of range -> `ConfigError`.
    """
    return sites_for(len(decoder_layers(model)), layers)


def site_module(model: nn.Module, site: str) -> nn.Module:
    """The module whose output is the site's residual stream."""
    if site in ("embed", "final_norm"):
        return module_at(model, site)
    layer = site_layer(site)
    if layer is None:
        raise ConfigError(f"{site!r} is not a residual-stream site (embed, layers.{{i}}.resid_post, final_norm)")
    return decoder_layers(model)[layer]


def _hidden(output: torch.Tensor | tuple) -> torch.Tensor:
    """A module's hidden-state output: the tensor itself (transformers 5) or the first tuple element (older)."""
    return output if isinstance(output, torch.Tensor) else output[0]


@contextmanager
def capture_hooks(model: nn.Module, batch: TwoViewBatch, which: str, sites: Sequence[str],
                  on_capture: OnCapture, *, stop_after_last: bool = True, copy: bool = True) -> Iterator[None]:
    """Install hooks that pass ``[batch, R, d]`` response-position hidden states of each site to `on_capture`.

    ``which`` is the view ("x" or "c"): its response columns are gathered. With `copy` the tensor handed over is a
    fresh copy (it does not keep the ``[batch, seq, d]`` output alive); without, it may be a view of the output, for a
    consumer that is done with it when `on_capture` returns. With `stop_after_last`, the last site raises
    `_StopForward` (run the forward through `run_view`, which catches it).
    """
    last = sites[-1] if sites else None
    handles = []

    def make_hook(site: str):
        def hook(_module: nn.Module, _inputs: tuple, output) -> None:
            h = batch.response_hidden(_hidden(output), which)  # [B, R, d], a view for the left layout
            on_capture(site, h.clone() if copy else h)
            if stop_after_last and site == last:
                raise _StopForward

        return hook

    try:
        for s in sites:
            handles.append(site_module(model, s).register_forward_hook(make_hook(s)))
        yield
    finally:
        for h in handles:
            h.remove()


def run_view(model: nn.Module, batch: TwoViewBatch, which: str, sites: Sequence[str], on_capture: OnCapture, *,
             copy: bool = True, shared_prefix: str = "auto") -> None:
    """One view through the decoder stack (no lm_head), stopping after the last requested site.

    copy=False hands `on_capture` views of the module outputs (valid only during the call: consume, don't keep).
    shared_prefix "auto": a token prefix common to every row runs once at batch 1 BEFORE the hooks are installed
    (generate/prefix.py, exact); the hooks then see the suffix forward, whose response columns they gather. Rows of
    different contexts: one such pass per prefix group (generate/groups.py), the captures reassembled in row order
    (then every site's ``[batch, R, d]`` is held until the last group has run)."""
    if not sites:
        return
    groups = view_groups(batch, which, shared_prefix)  # mixed contexts: each group's prefix once (generate/groups.py)
    if groups is not None:
        got: dict[str, list[torch.Tensor]] = {s: [] for s in sites}
        for g in groups:
            _run_view(model, take_rows(batch, g.rows), which, sites, lambda s, h: got[s].append(h), True,
                      shared_prefix, g.length)
        for s in sites:
            on_capture(s, ungroup(got.pop(s), groups))
        return
    _run_view(model, batch, which, sites, on_capture, copy, shared_prefix, None)


def _run_view(model: nn.Module, batch: TwoViewBatch, which: str, sites: Sequence[str], on_capture: OnCapture,
              copy: bool, shared_prefix: str, length: int | None) -> None:
    with torch.inference_mode():
        view_batch, extra, _ = view_inputs(model, batch, which, mode=shared_prefix, length=length,
                                           stop_at=site_module(model, sites[-1]))
        with capture_hooks(model, view_batch, which, sites, on_capture, copy=copy):
            try:
                model.model(**{**view_batch.view(which), "use_cache": False, **extra})
            except _StopForward:
                pass


PairCapture = Callable[[str, torch.Tensor, torch.Tensor], None]  # (site, h_x [B, R, d], h_c [B, R, d]) -> None


def run_views(model: nn.Module, batch: TwoViewBatch, sites: Sequence[str], on_pair: PairCapture) -> None:
    """Both views through the decoder stack, one forward each; `on_pair(site, h_x, h_c)` gets each site's response
    states. The no-context captures are copied and held until the context view's hook of the same site consumes them;
    `h_c` is a view of the module output, valid during the call only. (Two forwards, not one over both views stacked:
    stacking pads the shorter view, and on a CPU that padding costs more than the per-call overhead it saves; see
    docs/results.md.)"""
    xs: dict[str, torch.Tensor] = {}
    run_view(model, batch, "x", sites, xs.__setitem__)
    run_view(model, batch, "c", sites, lambda s, hc: on_pair(s, xs.pop(s), hc), copy=False)


def capture_views(model: nn.Module, batch: TwoViewBatch, layers: Sequence[int | str] | None = None,
                  *, device: str | torch.device | None = "cpu",
                  shared_prefix: str = "auto") -> dict[str, dict[str, torch.Tensor]]:
    """Both views' residual streams at the response positions, for interactive work (shared_prefix: `run_view`).

    Returns ``{"x": {site: [batch, R, d]}, "c": {site: [batch, R, d]}}`` (moved to `device`; None keeps them where
    the model is). Index t of both views is the same response token; ``batch.response_mask`` marks the real ones.
    """
    sites = resolve_sites(model, layers)
    batch = batch.to(next(model.parameters()).device)
    out: dict[str, dict[str, torch.Tensor]] = {"x": {}, "c": {}}
    for which in ("x", "c"):
        store = out[which]

        def keep(site: str, h: torch.Tensor, store: dict = store) -> None:
            store[site] = h if device is None else h.to(device)

        run_view(model, batch, which, sites, keep, shared_prefix=shared_prefix)
    return out


@contextmanager
def patch_response(model: nn.Module, batch: TwoViewBatch, which: str, site: str,
                   values: torch.Tensor) -> Iterator[None]:
    """Replace the site's output at the view's response positions with `values` while the context is open.

    values: ``[batch, R, d]`` (e.g. the OTHER view's capture at the same site: response index t is the same token in
    both views). Only real response tokens (``batch.response_mask``) are overwritten; everything else is untouched.
    """
    if site not in all_sites(model):
        raise ConfigError(f"cannot patch {site!r}; sites are {', '.join(all_sites(model))}")
    cols = batch.cols_x if which == "x" else batch.cols_c  # [B, R]
    width = batch.view(which)["input_ids"].shape[1]

    def hook(_module: nn.Module, _inputs: tuple, output):
        h = _hidden(output)  # [B, L, d]
        if h.shape[0] == 1 < cols.shape[0]:  # a shared prefix's batch-1 forward (generate/prefix.py): no response in it
            return None
        cols_here = cols - (width - h.shape[1])  # the suffix forward of the shared layout starts Lp columns later
        if values.shape != (h.shape[0], cols.shape[1], h.shape[-1]):
            raise ModelError(f"patch values have shape {tuple(values.shape)}; expected "
                             f"{(h.shape[0], cols.shape[1], h.shape[-1])} (batch, response length, hidden)")
        rows = torch.arange(h.shape[0], device=h.device)[:, None].expand_as(cols)  # [B, R]
        keep = batch.response_mask.to(h.device)  # [B, R]
        patched = h.clone()
        patched[rows[keep], cols_here.to(h.device)[keep]] = values.to(h.device, h.dtype)[keep]
        return patched if isinstance(output, torch.Tensor) else (patched, *output[1:])

    handle = site_module(model, site).register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
