"""ONE capture/edit primitive over site names (baukit ``TraceDict``-like), used by every probe that hooks a model.

Sites (named in mechopd.core.sites; `mechopd.models.module_at` resolves any of them):
  residual stream, forward order (``depth`` = position in that order, ``layer`` = decoder index i or None)
    ``embed``                  output of ``model.model.embed_tokens``          depth 0
    ``layers.{i}.resid_post``  output of decoder layer i                      depth i + 1
    ``final_norm``             output of ``model.model.norm``                 depth n_layers + 1
  components (what a layer adds to the residual stream): ``layers.{i}.self_attn`` (the attention block's output, after
  o_proj; with eager attention its second output is the ``[B, H, L, L]`` weight tensor) and ``layers.{i}.mlp``.
HF's ``output_hidden_states`` has no entry for the LAST decoder layer's output (its last entry is the final norm's
output); these hooks capture it.

`Trace(model, batch, which, capture=..., edit=..., positions=...)` installs one forward hook per named site while the
``with`` block is open. At each site it gathers the module's output at the view's POSITIONS (``[B, R, d]``), hands it
to ``on_capture`` or keeps it in ``trace[site]``, and, for a site in ``edit``, REPLACES the output there by the given
``[B, R, d]`` values (only where ``mask``, default ``response_mask``, is true; every other column untouched). As in
baukit, what is captured at an edited site is the edited value. ``positions``:
  ``"response"``  the hidden state OF response token t (column ``P + t``): the two-view cosine compares these;
  ``"predict"``   the position whose logits PREDICT response token t (column ``P + t - 1``: the last prompt token and
                  every response token but the last), as the scorer (generate/scorer.py) scores; lens, patching and
                  attention work here.
  ``"predict_stop"`` the R ``"predict"`` columns, then one more: the column of the last response slot (``P + R - 1``).
                  A row with n real response tokens has its n predicting states at indices 0..n-1 and the state OF
                  its last token (the stop token when it stopped) at index n: the two-view cosine averages the
                  former and reports the latter apart (no loss trains what the stop token's state predicts).
Index t means the same token in both views (left padding; core/views.py), so one view's capture is the other's edit.

What is non-standard here:
  * Captures are gathered (and by default copied) at the positions, so nothing ``[batch, seq, d]`` outlives the call.
  * ``stop_after_last``: the last site's hook raises a private exception that `forward` / `run_view` catch (the
    forward through ``model.model`` stops there; transformers' output recorders reset in ``finally``).
  * A shared-prefix forward (generate/prefix.py): the batch-1 prefix forward has no response column and is skipped;
    the suffix forward's columns start ``width - h.shape[1]`` columns later, which the hook subtracts.
  * transformers 5 decoder layers return a tensor, older ones (and attention blocks) a tuple whose first element is
    the hidden state; both are handled (``_hidden``) and an edit is written back in the same form.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.sites import site_layer, sites_for
from mechopd.core.views import TwoViewBatch
from mechopd.evaluation.config import EvalConfig
from mechopd.generate.groups import take_rows, ungroup, view_groups
from mechopd.generate.prefix import view_inputs
from mechopd.models import decoder_layers, module_at
from mechopd.models.arch import base_model

OnCapture = Callable[[str, torch.Tensor], None]  # (site, hidden [batch, R, d]) -> None
OnOutput = Callable[[str, Any, torch.Tensor], None]  # (site, raw module output, cols [B, R] of this forward) -> None
POSITIONS = {"response": 0, "predict": -1, "predict_stop": -1}  # column shift from the response token's own column
COMPONENTS = {"attn": "self_attn", "mlp": "mlp"}  # component -> the module (under layers.{i}) whose output it is


class _StopForward(Exception):
    """Raised by the last needed hook: nothing after that site is computed."""


def all_sites(model: nn.Module) -> list[str]:
    """Every residual-stream site of the model in forward order: embed, layers.0.resid_post, ..., final_norm."""
    return sites_for(len(decoder_layers(model)))


def resolve_sites(model: nn.Module, layers: Sequence[int | str] | None = None) -> list[str]:
    """Requested residual sites in forward order, deduplicated (`mechopd.core.sites.sites_for`)."""
    return sites_for(len(decoder_layers(model)), layers)


def component_site(layer: int, component: str) -> str:
    """``layers.{i}.self_attn`` / ``layers.{i}.mlp``: where a layer's attention / MLP output is hooked."""
    if component not in COMPONENTS:
        raise ConfigError(f"component {component!r} is unknown; use one of {', '.join(COMPONENTS)} (or resid)")
    return f"layers.{layer}.{COMPONENTS[component]}"


def site_module(model: nn.Module, site: str) -> nn.Module:
    """The module whose output is the site's activation (residual sites: the layer / embedding / final norm)."""
    if site in ("embed", "final_norm") or site_layer(site) is not None:
        return module_at(model, site)
    if site.startswith("layers.") and site.rsplit(".", 1)[-1] in COMPONENTS.values():
        return module_at(model, site)
    raise ConfigError(
        f"{site!r} is not a site to hook: use embed, layers.{{i}}.resid_post, final_norm, "
        "layers.{i}.self_attn or layers.{i}.mlp"
    )


def decoder_stack(model: nn.Module) -> nn.Module:
    """The decoder stack of a causal LM without the lm_head (``model.model``, ``model.transformer``,
    ``model.gpt_neox``: `mechopd.models.arch.base_model`)."""
    return base_model(model)


def _hidden(output: torch.Tensor | tuple) -> torch.Tensor:
    """A module's hidden-state output: the tensor itself (transformers 5) or the first tuple element (older)."""
    return output if isinstance(output, torch.Tensor) else output[0]


def _gather(h: torch.Tensor, cols: torch.Tensor, layout: str) -> torch.Tensor:
    """``[B, L, d]`` at ``cols [B, R]`` -> ``[B, R, d]`` (a view for the left layout, whose columns are contiguous)."""
    if layout == "left":
        start = int(cols[0, 0])
        return h[:, start : start + cols.shape[1]]
    idx = cols.clamp(min=0, max=h.shape[1] - 1).to(h.device)
    return h[torch.arange(h.shape[0], device=h.device)[:, None], idx]


class Trace(dict):
    """Hooks on named sites of one view's forward: capture and/or edit their outputs at the scored positions.

    capture: sites whose ``[B, R, d]`` output is kept in ``self[site]`` (or passed to ``on_capture`` instead);
    edit: ``{site: [B, R, d] values}`` written over the output at ``positions`` where ``mask`` ``[B, R]`` is true;
    on_output: called with every hooked site's raw output (e.g. attention weights) and the forward's columns.
    copy: captures are fresh copies (False: views valid during the hook call only, for a consumer that is done then).
    """

    def __init__(
        self,
        model: nn.Module,
        batch: TwoViewBatch,
        which: str,
        *,
        capture: Sequence[str] = (),
        edit: Mapping[str, torch.Tensor] | None = None,
        positions: str = "response",
        mask: torch.Tensor | None = None,
        on_capture: OnCapture | None = None,
        on_output: OnOutput | None = None,
        extra: Sequence[str] = (),
        copy: bool = True,
        stop_after_last: bool = False,
    ) -> None:
        super().__init__()
        if which not in ("x", "c"):
            raise ValueError(f"view must be 'x' or 'c', got {which!r}")
        if positions not in POSITIONS:
            raise ConfigError(f"positions {positions!r} is unknown; use one of {', '.join(POSITIONS)}")
        self.model, self.batch, self.which, self.copy_captures = model, batch, which, copy
        self._logits: torch.Tensor | None = None  # set by `forward` (head=True)
        self.capture, self.edit = list(capture), dict(edit or {})
        cols = batch.cols_x if which == "x" else batch.cols_c
        self.cols = cols + POSITIONS[positions]  # [B, R]
        if positions == "predict_stop":  # [B, R + 1]: one more column, the last response slot's own
            self.cols = torch.cat([self.cols, cols[:, -1:]], dim=1)
        self.width = batch.view(which)["input_ids"].shape[1]
        self.mask = batch.response_mask if mask is None else mask
        self.on_capture, self.on_output = on_capture, on_output
        self.sites = list(dict.fromkeys([*self.capture, *self.edit, *extra]))
        self.last = self.sites[-1] if stop_after_last and self.sites else None
        self._handles: list = []

    def _hook(self, site: str):
        def hook(_module: nn.Module, _inputs: tuple, output):
            h = _hidden(output)  # [B, L, d]
            if h.shape[0] == 1 < self.cols.shape[0]:  # a shared prefix's batch-1 forward: no response column in it
                return None
            cols = self.cols - (self.width - h.shape[1])  # the suffix forward of a shared layout starts later
            if self.on_output is not None:
                self.on_output(site, output, cols)
            if site in self.edit:
                h = self._write(h, cols, self.edit[site])
                output = h if isinstance(output, torch.Tensor) else (h, *output[1:])
            if site in self.capture:
                got = _gather(h, cols, self.batch.layout)
                got = got.clone() if self.copy_captures else got
                self.on_capture(site, got) if self.on_capture is not None else self.__setitem__(site, got)
            if site == self.last:
                raise _StopForward
            return output if site in self.edit else None

        return hook

    @property
    def logits(self) -> torch.Tensor:
        """``[B, R, V]`` logits of a `forward` with ``head=True``."""
        if self._logits is None:
            raise ModelError("this trace ran without the lm_head (forward(head=False)): it has no logits")
        return self._logits

    def _write(self, h: torch.Tensor, cols: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        if values.shape != (h.shape[0], cols.shape[1], h.shape[-1]):
            raise ModelError(
                f"edit values have shape {tuple(values.shape)}; expected "
                f"{(h.shape[0], cols.shape[1], h.shape[-1])} (batch, response length, hidden)"
            )
        rows = torch.arange(h.shape[0], device=h.device)[:, None].expand_as(cols)  # [B, R]
        keep = self.mask.to(h.device)
        out = h.clone()
        out[rows[keep], cols.to(h.device)[keep]] = values.to(h.device, h.dtype)[keep]
        return out

    def __enter__(self) -> Trace:
        try:
            for s in self.sites:
                self._handles.append(site_module(self.model, s).register_forward_hook(self._hook(s)))
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return exc[0] is _StopForward  # a stopped forward is the normal end of a traced run


def forward(model: nn.Module, batch: TwoViewBatch, which: str, *, head: bool = True, **trace: Any) -> Trace:
    """One view's forward (no grad, no cache, unshared) under a `Trace` (keyword arguments: `Trace`'s).

    head=True: the whole model runs and ``trace.logits`` is ``[B, R, V]`` at the predicting positions (the scorer's
    ``logits_to_keep`` slice; left layout) or at ``response_logits`` (right layout). head=False: the decoder stack only,
    stopping after the last hooked site; reading ``trace.logits`` raises.
    """
    tr = Trace(model, batch, which, stop_after_last=not head, **trace)
    kw = {**batch.view(which), "use_cache": False}
    with torch.inference_mode(), tr:
        if not head:
            decoder_stack(model)(**kw)
        elif batch.layout == "left":
            R = batch.response_ids.shape[1]
            tr._logits = model(**kw, logits_to_keep=R + 1).logits[:, :R]
        else:
            tr._logits = batch.response_logits(model(**kw).logits, which)
    return tr


@contextmanager
def capture_hooks(
    model: nn.Module,
    batch: TwoViewBatch,
    which: str,
    sites: Sequence[str],
    on_capture: OnCapture,
    *,
    stop_after_last: bool = True,
    copy: bool = True,
    positions: str = "response",
) -> Iterator[None]:
    """`Trace` capturing ``[batch, R, d]`` states of each site at ``positions`` into `on_capture` (see `Trace`)."""
    tr = Trace(
        model,
        batch,
        which,
        capture=sites,
        on_capture=on_capture,
        copy=copy,
        stop_after_last=stop_after_last,
        positions=positions,
    )
    with tr:
        yield


def run_view(
    model: nn.Module,
    batch: TwoViewBatch,
    which: str,
    sites: Sequence[str],
    on_capture: OnCapture,
    *,
    copy: bool = True,
    shared_prefix: str = EvalConfig.shared_prefix,
    positions: str = "response",
) -> None:
    """One view through the decoder stack (no lm_head), stopping after the last requested site; captures at
    ``positions`` (`Trace`).

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
            _run_view(
                model,
                take_rows(batch, g.rows),
                which,
                sites,
                lambda s, h: got[s].append(h),
                True,
                shared_prefix,
                g.length,
                positions,
            )
        for s in sites:
            on_capture(s, ungroup(got.pop(s), groups))
        return
    _run_view(model, batch, which, sites, on_capture, copy, shared_prefix, None, positions)


def _run_view(
    model: nn.Module,
    batch: TwoViewBatch,
    which: str,
    sites: Sequence[str],
    on_capture: OnCapture,
    copy: bool,
    shared_prefix: str,
    length: int | None,
    positions: str = "response",
) -> None:
    with torch.inference_mode():
        view_batch, extra, _ = view_inputs(
            model, batch, which, mode=shared_prefix, length=length, stop_at=site_module(model, sites[-1])
        )
        with capture_hooks(model, view_batch, which, sites, on_capture, copy=copy, positions=positions):
            decoder_stack(model)(**{**view_batch.view(which), "use_cache": False, **extra})


PairCapture = Callable[[str, torch.Tensor, torch.Tensor], None]  # (site, h_x [B, R, d], h_c [B, R, d]) -> None


def run_views(
    model: nn.Module, batch: TwoViewBatch, sites: Sequence[str], on_pair: PairCapture, positions: str = "response"
) -> None:
    """Both views through the decoder stack, one forward each; `on_pair(site, h_x, h_c)` gets each site's response
    states. The no-context captures are copied and held until the context view's hook of the same site consumes them;
    `h_c` is a view of the module output, valid during the call only. (Two forwards, not one over both views stacked:
    stacking pads the shorter view, and on a CPU that padding costs more than the per-call overhead it saves; see
    docs/results.md.)"""
    xs: dict[str, torch.Tensor] = {}
    run_view(model, batch, "x", sites, xs.__setitem__, positions=positions)
    run_view(model, batch, "c", sites, lambda s, hc: on_pair(s, xs.pop(s), hc), copy=False, positions=positions)


def capture_views(
    model: nn.Module,
    batch: TwoViewBatch,
    layers: Sequence[int | str] | None = None,
    *,
    device: str | torch.device | None = "cpu",
    shared_prefix: str = EvalConfig.shared_prefix,
) -> dict[str, dict[str, torch.Tensor]]:
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
def patch_response(
    model: nn.Module, batch: TwoViewBatch, which: str, site: str, values: torch.Tensor, *, positions: str = "response"
) -> Iterator[None]:
    """Replace the site's output at the view's positions with `values` while the context is open (a `Trace` edit).

    values: ``[batch, R, d]`` (e.g. the OTHER view's capture at the same site: index t is the same token in both
    views). Only real response tokens (``batch.response_mask``) are overwritten; everything else is untouched.
    """
    site_module(model, site)
    with Trace(model, batch, which, edit={site: values}, positions=positions):
        yield
