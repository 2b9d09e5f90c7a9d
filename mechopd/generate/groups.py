"""Prefix groups: when a batch mixes contexts, rows are grouped by their leading block and each group's prefix is
computed once (generate/prefix.py's shared path, per group); rows whose block no other row shares run unshared.

Why: one prefix common to EVERY row (`prefix.decide`) is only the chat header as soon as one row carries its own
context (mechopd's sample data: 2 of 40 items do), and the ~365-token shared context is then recomputed per row.

The plan is built from the token ids alone (never from the context strings), so it can never share what differs:
  1. sort the rows' prompts lexicographically; ``lcp_k`` = the common prefix length of sorted neighbours k, k + 1;
  2. for each threshold ``T`` among the ``lcp_k``: groups = maximal runs of neighbours with ``lcp_k >= T``; a group's
     shared length = its smallest ``lcp`` capped one token short of its shortest prompt (every row keeps a prompt
     token), 0 when below `prefix.MIN_PREFIX_TOKENS` or for a single row; rows of unshared groups run together, once;
  3. keep the plan that saves the most token positions,
     ``Σ_g (rows_g − 1) · length_g − GROUP_COST · (1 + decode_steps) · (groups − 1)`` (ties: the fewer groups).
     ``GROUP_COST`` (a choice, docs/method.md) charges each extra forward call; a sampling call (`sampler.sample_rows`
     with ``charge_decode``: the evaluation) decodes each group on its own, so each extra group also costs its
     ``decode_steps`` (= max_new_tokens) decode calls. Measured (issue 58): `mechopd eval` of the smollm2 study split
     its 54 no-context rows into 9 groups sharing 25-30 header tokens (12 decode calls in all) when only the prefill
     call was charged; charged its decode steps, 3 calls.
A batch with one context gives one group, the same decision and the same arithmetic as `prefix.decide`. Exact like
the shared prefix itself: each row sees its own keys/values at its own positions; only float summation order differs.
Several processes (`agree` given) keep the one common prefix of the global batch (`prefix.decide`): every process
must run the same forwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from mechopd.core.views import TwoViewBatch
from mechopd.generate.prefix import MIN_PREFIX_TOKENS

GROUP_COST = 32  # token positions one extra forward call is charged (per-call overhead; a choice)


@dataclasses.dataclass(frozen=True)
class Group:
    """Rows (indices into the batch, ascending) and the prefix length they share (0: unshared)."""

    rows: tuple[int, ...]
    length: int


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n, m = 0, min(len(a), len(b))
    while n < m and a[n] == b[n]:
        n += 1
    return n


def _plan(
    prompts: Sequence[Sequence[int]], order: list[int], lcp: list[int], T: int, decode_steps: int = 0
) -> tuple[int, list[Group]]:
    """(saved positions, groups) when neighbours with ``lcp >= T`` share (module docstring, step 2)."""
    runs, start = [], 0
    for k in range(len(order)):
        if k == len(order) - 1 or lcp[k] < T:
            runs.append(range(start, k + 1))
            start = k + 1
    shared, alone, saved = [], [], 0
    for run in runs:
        rows = [order[k] for k in run]
        n = 0
        if len(rows) > 1:
            n = min(min(lcp[k] for k in run[:-1]), min(len(prompts[r]) for r in rows) - 1)
        if n >= MIN_PREFIX_TOKENS:
            shared.append(Group(tuple(sorted(rows)), n))
            saved += (len(rows) - 1) * n
        else:
            alone += rows
    groups = shared + ([Group(tuple(sorted(alone)), 0)] if alone else [])
    return saved - GROUP_COST * (1 + decode_steps) * (len(groups) - 1), sorted(groups, key=lambda g: g.rows[0])


def group_prompts(prompts: Sequence[Sequence[int]], decode_steps: int = 0) -> list[Group]:
    """The prefix groups of these prompts (token ids, no padding): a partition of ``range(len(prompts))``.
    decode_steps: the decode calls each group makes after its prefill (0: a forward only; step 3 above)."""
    B = len(prompts)
    if B < 2:
        return [Group(tuple(range(B)), 0)]
    order = sorted(range(B), key=lambda i: list(prompts[i]))
    lcp = [_lcp(prompts[order[k]], prompts[order[k + 1]]) for k in range(B - 1)]
    best = (0, [Group(tuple(range(B)), 0)])
    for T in sorted(set(lcp)):
        plan = _plan(prompts, order, lcp, T, decode_steps)
        if plan[0] > best[0] or (plan[0] == best[0] and len(plan[1]) < len(best[1])):
            best = plan
    return best[1]


def view_prompts(batch: TwoViewBatch, which: str) -> list[list[int]]:
    """Each row's prompt ids in view `which` (left layout: the real columns before the response)."""
    kw = batch.view(which)
    P = int((batch.cols_x if which == "x" else batch.cols_c)[0, 0])
    ids, mask = kw["input_ids"][:, :P].tolist(), kw["attention_mask"][:, :P].tolist()
    return [[t for t, m in zip(r, mr) if m] for r, mr in zip(ids, mask)]


def view_groups(batch: TwoViewBatch, which: str, mode: str, agree: object = None) -> list[Group] | None:
    """The groups of view `which`, or None when one decision covers the batch (`prefix.decide`: mode off, the right
    layout, several processes, or a plan that is one group anyway)."""
    if mode != "auto" or batch.layout != "left" or agree is not None or batch.batch_size < 2:
        return None
    groups = group_prompts(view_prompts(batch, which))
    return groups if len(groups) > 1 else None


def take_rows(batch: TwoViewBatch, rows: Sequence[int]) -> TwoViewBatch:
    """The sub-batch of `rows`, with the leading columns that are padding in every one of them dropped (each view;
    positions are explicit, so the real tokens keep theirs). Response ids and columns keep their width R."""
    idx = torch.tensor(list(rows), dtype=torch.long, device=batch.response_ids.device)
    fields: dict[str, Any] = {
        k: (v.index_select(0, idx) if isinstance(v, torch.Tensor) else v) for k, v in batch.__dict__.items()
    }
    if batch.layout == "left":
        for w in ("x", "c"):
            k = int(fields[f"attention_mask_{w}"].argmax(1).min())  # first column real in some row
            for name in (f"input_ids_{w}", f"attention_mask_{w}", f"position_ids_{w}"):
                fields[name] = fields[name][:, k:]
            fields[f"cols_{w}"] = fields[f"cols_{w}"] - k
    return TwoViewBatch(**fields)


def ungroup(parts: Sequence[torch.Tensor], groups: Sequence[Group]) -> torch.Tensor:
    """Per-group outputs ``[rows_g, ...]`` (in `groups` order) back to one ``[batch, ...]`` in row order."""
    order = torch.tensor([r for g in groups for r in g.rows], dtype=torch.long, device=parts[0].device)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return torch.cat(list(parts)).index_select(0, inverse)
