"""Batched generation with the KV cache, and game rollouts (one prompt per move), under one `SamplingSettings`.

`sample` is a lean decode loop (prefill once, then one token per step through the model with the cache) rather than
``model.generate``: on small models generate's per-step bookkeeping (logits processors, stopping criteria, cache
wrapping) is a large share of a step. It is pinned against ``generate`` in the tests (greedy: identical ids).
Generation runs under ``torch.inference_mode()``: no gradient can come from it (gradients are taken later, on a
fresh forward over the `TwoViewBatch`). An engine object in the settings (`engines.RolloutEngine`: vLLM) samples
instead of the loop here; the sampler knows it only through that protocol.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mechopd.core.threads import passive
from mechopd.core.views import left_pad
from mechopd.generate import layout
from mechopd.generate.engines import Generation, cut_at_stop
from mechopd.generate.groups import Group, group_prompts
from mechopd.generate.lean import LeanDecoder, projections, resolve_engine
from mechopd.generate.prefix import (
    cache_kwargs,
    common_prefix_len,
    decide,
    expanded_cache,
    output_cache,
    prefix_kv,
    sliding_window,
)
from mechopd.generate.settings import SamplingSettings

__all__ = ["Turn", "item_seed", "play_games", "sample", "sample_rows", "stable_seed", "strip_stop"]


def stable_seed(*parts: object) -> int:
    """A seed from `parts` that is the same in every process and Python run (sha1, not ``hash()``)."""
    return int(hashlib.sha1("|".join(map(str, parts)).encode()).hexdigest()[:12], 16)


def item_seed(seed: int, uid: object) -> int:
    """The row seed of one item: a function of (seed, item identity) only, never of its batch or process."""
    return stable_seed(seed, uid)


@torch.inference_mode()
def sample(
    model: Any, prompt_ids: Sequence[Sequence[int]], settings: SamplingSettings, row_seeds: Sequence[int] | None = None
) -> Generation:
    """Sample one response per prompt (left-padded batch, KV cache) under `settings`.

    prompt_ids: ``[batch]`` lists of ids. Returns ids per row, cut after the first stop token.
    row_seeds: one per row (required unless greedy): inverse-CDF sampling with per-row uniforms ``u[row, step]``, so
    a row's response does not depend on the rows sharing its batch or process (no shared-generator path exists).
    Ids ``>= settings.vocab`` are never drawn. An engine object (``settings.engine``, e.g. vLLM) samples itself.
    """
    if not isinstance(settings.engine, str):
        return settings.engine.sample(prompt_ids, settings, row_seeds)
    st, greedy, B = settings, settings.greedy, len(prompt_ids)
    device = next(model.parameters()).device
    uniforms = None if greedy else _row_uniforms(row_seeds, B, st.max_new_tokens, device)  # [B, max_new_tokens]
    ids, mask, pos, cache, n = _prefill_inputs(model, prompt_ids, st.pad_id, st.shared_prefix, device)
    stop_t = torch.tensor(list(st.stop), device=device, dtype=torch.long)
    lean = LeanDecoder(model) if resolve_engine(model, st.engine) == "lean" else None
    if lean is not None:
        logits = lean.prefill(ids, mask, pos, st.max_new_tokens, cache=cache)  # [B, V]
    else:
        keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        extra = {} if cache is None else cache_kwargs(model, cache)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **keep, **extra)
        past, logits = output_cache(out), out.logits[:, -1]  # [B, V]
    next_pos = pos[:, -1:] + 1  # [B, 1]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    toks = []
    with decode_threads(device):  # the small-row steps: one thread under PASSIVE (`decode_threads`)
        for step in range(st.max_new_tokens):
            u = None if uniforms is None else uniforms[:, step : step + 1]  # None exactly when greedy
            tok = torch.where(
                done,
                torch.full_like(done, st.pad_id, dtype=torch.long),
                _next_token(logits[:, : st.vocab], u, st.temperature),
            )  # ids >= vocab: never drawn
            toks.append(tok)
            done = done | torch.isin(tok, stop_t)
            if bool(done.all()) or step == st.max_new_tokens - 1:
                break
            if lean is not None:
                logits = lean.step(tok, next_pos)
            else:
                mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=device)], dim=1)
                out = model(
                    input_ids=tok[:, None],
                    attention_mask=mask,
                    position_ids=next_pos,
                    use_cache=True,
                    **cache_kwargs(model, past),
                )
                past, logits = output_cache(out), out.logits[:, -1]
            next_pos = next_pos + 1
    return cut_at_stop(torch.stack(toks, 1).tolist() if toks else [[] for _ in range(B)], st.stop, n)


@contextlib.contextmanager
def decode_threads(device: torch.device) -> Iterator[int]:
    """The decode steps on ONE intra-op thread under ``OMP_WAIT_POLICY=PASSIVE`` on the CPU (mechopd's default,
    `core.threads`), then the caller's count again; yields the count the steps run on.

    Why (issue 58 item 1): a decode step is ~200 small GEMMs of 1-16 rows; with PASSIVE a waiting thread sleeps, so
    each parallel region pays a wake-up, and a second thread made SmolLM2's step slower, quiet (62 vs 50 ms) and with
    a busy core (57 vs 50 ms) (`python bench/threads.py`). The prefill, many rows, keeps every thread. oneDNN's and
    the lean decoder's results do not depend on the thread count at these row counts (tested), so no number moves.
    PASSIVE counts only where it holds (`core.threads.passive`: not when set after this process loaded torch)."""
    before = torch.get_num_threads()
    one = device.type == "cpu" and passive() and before > 1
    if one:
        torch.set_num_threads(1)
    try:
        yield 1 if one else before
    finally:
        if one:
            torch.set_num_threads(before)


BLOCK = 256  # ids per block of the two-level inverse CDF (`_inverse_cdf`)


def _next_token(logits: torch.Tensor, u: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """``[B]`` ids from ``[B, V]`` logits: argmax (u None), else inverse-CDF with the rows' uniforms ``u [B, 1]``."""
    if u is None:
        return logits.argmax(-1)
    return _inverse_cdf(torch.softmax(logits.float() / temperature, -1), u)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``[B]`` ids: the first id whose cumulative probability exceeds ``u * total``, for ``probs [B, V]`` (float32)
    and uniforms ``u [B, 1]`` (float64).

    Two levels, so that nothing over the whole vocabulary is float64 and no float32 running sum spans it (a float32
    cumsum over 152k ids loses every increment below ~6e-8 of the running total): float32 sums of `BLOCK`-id blocks,
    their cumsum in float64 (``[B, V / BLOCK]``), the block holding ``u * total``, then the cumsum of that one block in
    float64 (``[B, BLOCK]``). An id of probability 0 (masked, padding) is never returned."""
    B, V = probs.shape
    nb = -(-V // BLOCK)
    blocks = torch.nn.functional.pad(probs, (0, nb * BLOCK - V)).view(B, nb, BLOCK)  # [B, nb, BLOCK]
    cdf = blocks.sum(-1).double().cumsum(-1)  # [B, nb]
    target = u * cdf[:, -1:]  # [B, 1]
    b = torch.searchsorted(cdf, target, right=True).clamp(max=nb - 1)  # [B, 1] the block
    before = torch.where(b > 0, cdf.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(target))
    inner = blocks.gather(1, b[..., None].expand(B, 1, BLOCK))[:, 0].double().cumsum(-1)  # [B, BLOCK]
    j = torch.searchsorted(inner, target - before, right=True)  # [B, 1] first id whose cdf exceeds it
    j = torch.minimum(j, inner.argmax(-1, keepdim=True))  # rounding past the block's end: its last id with mass
    return (b * BLOCK + j).squeeze(-1)


def _row_uniforms(row_seeds: Sequence[int] | None, B: int, steps: int, device: torch.device) -> torch.Tensor:
    """``[B, steps]`` float64 uniforms, row i from its own generator seeded with ``row_seeds[i]``."""
    if row_seeds is None:
        raise ValueError("sample needs row_seeds (one per prompt) unless settings.greedy")
    if len(row_seeds) != B:
        raise ValueError(f"row_seeds has {len(row_seeds)} seeds for {B} prompts")
    return torch.stack(
        [torch.rand(steps, generator=torch.Generator().manual_seed(int(s)), dtype=torch.float64) for s in row_seeds]
    ).to(device)


def shared_len(prompt_ids: Sequence[Sequence[int]], shared_prefix: str | int, agree: Any = None) -> int:
    """How many leading tokens the prefill shares: the caller's explicit length (an int), else the decision of
    `prefix.decide` for these prompts ("auto" | "off"; `agree`: the processes' common prefix)."""
    if isinstance(shared_prefix, int):
        if not 0 <= shared_prefix <= common_prefix_len(prompt_ids):
            raise ValueError(f"shared prefix of {shared_prefix} tokens is not common to every prompt")
        return shared_prefix
    candidate = list(prompt_ids[0][: common_prefix_len(prompt_ids)]) if shared_prefix == "auto" else []
    return decide(len(prompt_ids), candidate, shared_prefix, agree)


def _prefill_inputs(
    model: Any, prompt_ids: Sequence[Sequence[int]], pad_id: int, shared_prefix: str | int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any, int]:
    """The prefill's ids/positions ``[B, S]``, mask ``[B, n + S]``, the shared prefix's cache (None) and length n."""
    B = len(prompt_ids)
    n = 0 if sliding_window(model) else shared_len(prompt_ids, shared_prefix)
    ids, mask = left_pad([p[n:] for p in prompt_ids], pad_id)
    ids, mask = ids.to(device), mask.to(device)
    pos = n + (mask.cumsum(-1) - 1).clamp(min=0)  # the unshared layout's positions of every real token
    cache = None
    if n:
        cache = expanded_cache(model, prefix_kv(model, torch.tensor([list(prompt_ids[0][:n])], device=device)), B)
        mask = torch.cat([mask.new_ones(B, n), mask], 1)  # [B, n + S]: the prefix, then the row's own columns
    return ids, mask, pos, cache, n


def sample_rows(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    seeds: Sequence[int] | None,
    settings: SamplingSettings,
    *,
    paths: list[int] | None = None,
    agree: Any = None,
    charge_decode: bool = False,
) -> list[list[int]]:
    """One response per prompt, ``settings.batch_size`` prompts per `sample` call; row i samples with ``seeds[i]``.

    The one entry point every caller (trainer, evaluation, probes) samples through: per-row seeds make a row's
    response a function of (model, prompt, seed) only, so any batch size gives the same ids (tests, per caller).
    seeds: one per prompt (``item_seed`` / `stable_seed` of the row's identity); may be None only when greedy.
    paths: if given, gets each call's shared prefix length (0: unshared prefill), for the caller's logs.
    ``settings.shared_prefix`` is decided ONCE over all the prompts and applied to every chunk, a chunk of one row
    included, so the arithmetic a row sees does not depend on the batch size: "auto" in one process groups the rows by
    their leading block (`groups.group_prompts`: each group's prefix prefilled once, its rows in chunks); with
    `agree` (several processes, e.g. `train.dist.agree_prefix`) one prefix common to the global batch.
    charge_decode: the grouping charges each group its decode steps too (`groups.group_prompts`; the evaluation
    passes it: fewer, larger decode calls). Off by default: a training rollout's groups, hence its arithmetic, as
    before.
    """
    greedy, size = settings.greedy, settings.batch_size
    if seeds is None and not greedy:
        raise ValueError("sample_rows needs one seed per prompt unless greedy (batch-size invariance)")
    if seeds is not None and len(seeds) != len(prompt_ids):
        raise ValueError(f"{len(seeds)} seeds for {len(prompt_ids)} prompts")
    if settings.shared_prefix == "auto" and agree is None and isinstance(settings.engine, str):
        steps = settings.max_new_tokens if charge_decode else 0
        groups = group_prompts(prompt_ids, steps)  # one process: a prefix per group of rows (generate/groups.py)
    else:
        groups = [Group(tuple(range(len(prompt_ids))), shared_len(prompt_ids, settings.shared_prefix, agree))]
    out: list[list[int]] = [[] for _ in prompt_ids]
    chunks = [min(size, len(g.rows) - s) for g in groups for s in range(0, len(g.rows), size)]
    with _layout(model, settings, sum(rows > 1 for rows in chunks)):
        for g in groups:
            chunk = settings.replace(shared_prefix=g.length)
            for s in range(0, len(g.rows), size):
                rows = g.rows[s : s + size]
                seeded = None if greedy else [int(seeds[i]) for i in rows]  # type: ignore[index]
                gen = sample(model, [prompt_ids[i] for i in rows], chunk, seeded)
                for i, resp in zip(rows, gen.responses):
                    out[i] = resp
                if paths is not None:
                    paths.append(gen.shared_prefix)
    return out


def _layout(model: Any, settings: SamplingSettings, calls: int) -> contextlib.AbstractContextManager:
    """The lean decoder's projections laid out for small-row GEMMs over `calls` sampling calls of 2 or more rows
    (one-row calls never read the copy), where that pays for the copy (`layout.worth_laying_out`); the same bits
    either way (`generate/layout.py`). Nothing trains inside."""
    if not (isinstance(settings.engine, str) and resolve_engine(model, settings.engine) == "lean"):
        return contextlib.nullcontext()
    mods = projections(model)
    if layout.worth_laying_out(mods, settings.max_new_tokens * calls):
        return layout.laid_out(mods)
    return contextlib.nullcontext()


def strip_stop(ids: Sequence[int], stop: Sequence[int]) -> list[int]:
    """Response ids without the trailing stop token (for decoding and length counting)."""
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] in set(stop) else ids


@dataclass
class Turn:
    """One move of one game: the user prompt text at that move and the model's response ids."""

    game: int
    move: int
    prompt: str
    response: list[int]


def play_games(
    model: Any,
    tokenizer: Any,
    task: Any,
    examples: Sequence[Any],
    render: Any,
    settings: SamplingSettings,
    *,
    with_context: bool,
    seeds: Sequence[int] | None = None,
) -> tuple[list[Any], list[Turn]]:
    """Play one game per example, all games batched move by move (one prompt per move: log so far + board).

    render(prompt_text, context_or_None) -> prompt ids. seeds: one per game; move m of game g samples with row seed
    ``seeds[g] * 1000 + m`` (batch invariant); all active games of a move go through one `sample_rows` call. The
    lean decoder's weights are laid out once for all moves (`generate/layout.py`; each move's call nests in it).
    Returns the finished episodes and every (turn prompt, response).
    """
    episodes = [task.new_episode(ex) for ex in examples]
    turns: list[Turn] = []
    move = 0
    with _layout(model, settings, int(len(examples) > 1)):  # laid out once for every move (nothing trains inside)
        while True:
            active = [g for g, ep in enumerate(episodes) if not ep.done]
            if not active:
                break
            texts = [episodes[g].prompt() for g in active]
            ids = [render(t, examples[g].context if with_context else None) for g, t in zip(active, texts)]
            row_seeds = None if (settings.greedy or seeds is None) else [int(seeds[g]) * 1000 + move for g in active]
            responses = sample_rows(model, ids, row_seeds, settings.replace(batch_size=len(ids)))  # prefix groups
            for g, text, resp in zip(active, texts, responses):
                turns.append(Turn(g, move, text, resp))
                episodes[g].step(tokenizer.decode(strip_stop(resp, settings.stop), skip_special_tokens=True))
            move += 1
    return episodes, turns
