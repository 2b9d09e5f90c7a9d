"""Shared context prefix: compute the token block every row's context view starts with ONCE, at batch size 1.

When every row of a batch renders its context view as ``prefix + s_i`` (the same system block with the context
``c``, then a per-row question ``s_i``), the prefix is run once through the model and every row attends to its keys
and values. Exact, not approximate: each row sees the same keys/values at the same positions as in the unshared
forward; only the floating-point summation order of attention differs (float32: ~1e-7).

Layouts (B rows, prefix length Lp; the unshared one is `core/views.py`'s left-padded view):

    unshared   row i: [ left pad_i | prefix (pos 0..Lp-1) | s_i | y_i | right pad ]        one forward, [B, L]
    shared     prefix:  [ prefix (pos 0..Lp-1) ]                                             batch 1, [1, Lp]
               suffix row i: [ left pad_i | s_i | y_i | right pad ]                          batch B, [B, L - Lp]
               attention mask of the suffix forward: [ 1 x Lp | the row's own mask over the suffix columns ]

i.e. the left padding sits AFTER the shared prefix. Position ids of the suffix columns are copied from the unshared
layout (``cumsum(mask) - 1``), so every real token keeps its position (Lp + k for the k-th token after the prefix)
and RoPE sees exactly the unshared positions. The prefix's keys/values enter the suffix forward as a transformers
``DynamicCache`` whose layers hold the batch-1 tensors EXPANDED to B rows (``expand``, no per-row recompute): the
causal mask transformers builds from a 2D mask plus a cache lets query column q of the suffix attend to all Lp cached
columns and to suffix columns <= q, minus the row's padding, which is the unshared attention pattern. Left-pad query
columns of the suffix still see the prefix, so no attention row is fully masked (no NaN reaches a gradient).

Gradients: for the student's context view the prefix forward runs WITH grad; the cache holds ``k.expand(B, ...)`` of
the batch-1 keys, so autograd sums the B rows' gradients into the one prefix graph (what B copies would give).
Teacher: the batch-1 keys/values are computed under ``torch.inference_mode()`` and can be reused across calls through
a `PrefixStore` (keyed by the prefix ids and the parameters' version counters: an in-place weight change recomputes).

When it applies (``shared_prefix: auto``): a model without sliding-window layers (`sliding_window`), the left
layout, B >= 2, and a common token prefix of at least
`MIN_PREFIX_TOKENS` ids; the prefix is capped one token short of the shortest prompt so that every row keeps at least
one prompt token (its logits predict the first response token). Otherwise the unshared forward runs (never a wrong
answer: the plan is built from the token ids themselves). ``off`` always runs the unshared forward.
transformers 5.24 names the cache argument ``cache`` (``past_key_values`` is its deprecated alias until 5.40).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mechopd.config.sections import PREFIX_MODES
from mechopd.core.views import TwoViewBatch

MIN_PREFIX_TOKENS = 8

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv_heads, Lp, head_dim]
Agree = Callable[[list[int]], int]  # this process's candidate prefix ids -> the length every process shares


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` under the name this transformers version's ``forward`` takes: ``cache`` (5.24 on) or
    ``past_key_values`` (before). The other name would land in ``**kwargs`` and be ignored SILENTLY (a prefill
    without its prefix), so the name is read from the signature, never assumed (once per model class)."""
    model_cls: type = type(model)  # a plain `type` is Hashable to functools.cache's wrapper (type[Any] is not)
    return {_cache_arg(model_cls): cache}


@functools.cache
def _cache_arg(cls: type[Any]) -> str:
    params = inspect.signature(cls.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise TypeError(
        f"{cls.__name__}.forward takes neither `cache` nor `past_key_values`; it cannot reuse a "
        "shared prefix (set shared_prefix: off)"
    )


def output_cache(out: Any) -> Any:
    """The cache a forward returned (``out.cache`` from transformers 5.24 on, ``out.past_key_values`` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def check_mode(mode: str) -> str:
    if mode not in PREFIX_MODES:
        raise ValueError(f"shared_prefix must be one of {PREFIX_MODES}, got {mode!r}")
    return mode


def common_prefix_len(rows: Sequence[Sequence[int]]) -> int:
    """Longest common leading run of token ids, capped one short of the shortest row (each row keeps a token)."""
    if not rows:
        return 0
    cap = min(len(r) for r in rows) - 1
    first = rows[0]
    n = 0
    while n < cap and all(r[n] == first[n] for r in rows):
        n += 1
    return max(n, 0)


def sliding_window(model: Any) -> bool:
    """Whether some layer attends through a sliding window (Gemma-2/3, Mistral with ``sliding_window``, Qwen2 with
    ``use_sliding_window``). Such a model never shares a prefix: its window is counted in cache columns, and the
    shared layout puts the rows' padding after the prefix, so the window would cover other tokens than unshared."""
    config = getattr(model, "config", None)
    cfg: Any = getattr(config, "text_config", None) or config
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        return any("sliding" in str(t) or "chunked" in str(t) for t in types)
    if hasattr(cfg, "use_sliding_window"):
        return bool(cfg.use_sliding_window)
    return getattr(cfg, "sliding_window", None) is not None


def decide(n_rows: int, prefix: Sequence[int], mode: str, agree: Agree | None = None) -> int:
    """The prefix length to share (0 = run the unshared forward), from the candidate `prefix` ids of this batch.

    agree: several processes -> the common prefix of every process's candidate (``[]`` when a process does not
    share), so that all processes run the same forwards (FSDP) and the same arithmetic as one process would."""
    check_mode(mode)
    n = len(prefix) if (mode == "auto" and n_rows >= 2 and len(prefix) >= MIN_PREFIX_TOKENS) else 0
    if agree is not None:
        n = agree(list(prefix[:n]))
    return n if n >= MIN_PREFIX_TOKENS else 0


class _Stop(Exception):
    """Raised by the `stop_at` module's hook: the prefix forward needs no layer above it."""


def _raise_stop(*_args: Any) -> None:
    raise _Stop


def prefix_kv(model: Any, prefix_ids: torch.Tensor, stop_at: Any = None) -> KV:
    """Keys/values of the prefix ``[1, Lp]`` at positions 0..Lp-1 (one ordinary forward; grad as the caller's mode).

    stop_at: a module after which nothing is needed (a probe's last site): the forward stops there and only the
    layers below it hold keys/values (the suffix forward stops at the same module)."""
    from transformers import DynamicCache
    from transformers.cache_utils import CacheLayerMixin

    L = prefix_ids.shape[1]
    cache = DynamicCache(config=model.config)
    handle = stop_at.register_forward_hook(_raise_stop) if stop_at is not None else None
    try:
        model(
            input_ids=prefix_ids,
            attention_mask=torch.ones_like(prefix_ids),
            use_cache=True,
            position_ids=torch.arange(L, device=prefix_ids.device)[None],
            logits_to_keep=1,
            **cache_kwargs(model, cache),
        )
    except _Stop:
        pass
    finally:
        if handle is not None:
            handle.remove()
    kv: KV = []
    for layer in cache.layers:
        if not isinstance(layer, CacheLayerMixin):
            raise TypeError(
                f"prefix_kv: cache layer {type(layer).__name__} holds no keys/values (linear-attention or cache-less "
                "layer); a shared prefix needs attention layers, set shared_prefix: off"
            )
        if layer.is_initialized:
            assert layer.keys is not None and layer.values is not None  # set together by lazy_initialization
            kv.append((layer.keys, layer.values))
    return kv


def expanded_cache(model: Any, kv: KV, batch_size: int) -> Any:
    """A fresh ``DynamicCache`` whose layers hold the batch-1 prefix keys/values expanded to `batch_size` rows."""
    from transformers import DynamicCache

    data = [(k.expand(batch_size, -1, -1, -1), v.expand(batch_size, -1, -1, -1)) for k, v in kv]
    return DynamicCache(ddp_cache_data=data, config=model.config)


def _versions(model: Any) -> tuple:
    return tuple((id(p), p._version) for p in model.parameters())


class PrefixStore:
    """Reuse a frozen model's prefix keys/values across calls (the teacher's context block, step after step).

    Keyed by (model, prefix ids, every parameter's identity and in-place version counter); holds `size` entries.
    """

    def __init__(self, size: int = 8):  # prefix groups: one entry per distinct context block of a batch
        self.size = size
        self._items: dict[tuple, KV] = {}
        self.hits = 0

    def get(self, model: Any, prefix_ids: torch.Tensor) -> KV:
        key = (id(model), tuple(prefix_ids[0].tolist()), _versions(model))
        if key in self._items:
            self.hits += 1
            return self._items[key]
        with torch.inference_mode():
            kv = prefix_kv(model, prefix_ids)
        if len(self._items) >= self.size:
            self._items.pop(next(iter(self._items)))
        self._items[key] = kv
        return kv


@dataclasses.dataclass
class ViewPlan:
    """A view split into the shared prefix ``[1, Lp]`` and the suffix batch (`batch`'s view = the suffix forward's
    kwargs: ids/positions ``[B, L - Lp]``, attention mask ``[B, L]``; its columns shifted by -Lp, so
    ``batch.response_logits`` / ``response_hidden`` index the suffix forward's outputs)."""

    length: int
    prefix_ids: torch.Tensor
    batch: TwoViewBatch


def view_prefix_len(batch: TwoViewBatch, which: str) -> int:
    """The common prefix length of view `which`'s prompts (capped as `common_prefix_len`); 0 for the right layout."""
    if batch.layout != "left":
        return 0
    ids, mask = batch.view(which)["input_ids"], batch.view(which)["attention_mask"]
    P = int((batch.cols_x if which == "x" else batch.cols_c)[0, 0])  # prompt width of the view
    lens = mask[:, :P].sum(1)
    lmin = int(lens.min())
    if lmin < 2:
        return 0
    start = (P - lens)[:, None]  # [B, 1] first prompt column of each row
    aligned = ids.gather(1, start + torch.arange(lmin - 1, device=ids.device)[None])  # [B, lmin - 1]
    same = (aligned == aligned[:1]).all(0)
    return int(same.long().cumprod(0).sum())


def plan_view(batch: TwoViewBatch, which: str, length: int) -> ViewPlan:
    """Split view `which` at `length` (<= `view_prefix_len`) into prefix and suffix batch (the layout above)."""
    kw = batch.view(which)
    ids, mask, pos = kw["input_ids"], kw["attention_mask"], kw["position_ids"]
    B, L = ids.shape
    P = int((batch.cols_x if which == "x" else batch.cols_c)[0, 0])
    start = (P - mask[:, :P].sum(1))[:, None]  # [B, 1]
    j = torch.arange(L - length, device=ids.device)[None]  # suffix columns
    idx = j + length * (j >= start)  # left pad kept in place, the prefix columns skipped
    prefix_ids = ids[:1, int(start[0]) : int(start[0]) + length]
    full_mask = torch.cat([mask.new_ones(B, length), mask.gather(1, idx)], 1)
    suffix: dict[str, Any] = {
        f"input_ids_{which}": ids.gather(1, idx),
        f"attention_mask_{which}": full_mask,
        f"position_ids_{which}": pos.gather(1, idx),
        f"cols_{which}": (batch.cols_x if which == "x" else batch.cols_c) - length,
    }
    return ViewPlan(length, prefix_ids, dataclasses.replace(batch, **suffix))


def view_inputs(
    model: Any,
    batch: TwoViewBatch,
    which: str,
    *,
    mode: str = "auto",
    agree: Agree | None = None,
    store: PrefixStore | None = None,
    stop_at: Any = None,
    length: int | None = None,
) -> tuple[TwoViewBatch, dict[str, Any], int]:
    """What to run for view `which`: ``(batch', extra kwargs, shared length)``; then
    ``model(**batch'.view(which), **extra)`` gives outputs that ``batch'.response_logits/response_hidden(..., which)``
    index exactly as the unshared forward's (hook-friendly: the prefix forward, if any, has already run here).
    stop_at: see `prefix_kv` (not with a `store`: stored keys/values must cover every layer).
    length: the shared length decided by the caller (`view_groups`), instead of deciding it here."""
    kw = batch.view(which)
    if sliding_window(model):
        return batch, {}, 0
    if length is None:
        first = int(kw["attention_mask"][0].argmax())  # row 0's first real column
        n = view_prefix_len(batch, which) if mode == "auto" else 0
        n = decide(batch.batch_size, kw["input_ids"][0, first : first + n].tolist(), mode, agree)
    else:
        n = length
    if n == 0:
        return batch, {}, 0
    plan = plan_view(batch, which, n)
    kv = store.get(model, plan.prefix_ids) if store is not None else prefix_kv(model, plan.prefix_ids, stop_at)
    return plan.batch, {**cache_kwargs(model, expanded_cache(model, kv, batch.batch_size)), "use_cache": True}, n
