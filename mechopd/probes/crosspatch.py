"""Patching between checkpoints: model A's context-view residual at site s written into model B's context view
(e.g. NCA's into OPD's), at the scored positions (the last prompt token and every response token but the last).

Two effects per site s (docs/method.md, "Patching between checkpoints"):

    dlogp(s)   = mean_items Σ_t [log p_B^{A,s}(y_t | x, c, y_<t) − log p_B(y_t | x, c, y_<t)]   (logits / T)
                 y = the task's reference answer (``logp_of = answers``; the items' responses for a task without one)
    Harm       = P(wrong with c | right without c), B's greedy answers: without c (unpatched), with c (unpatched),
                 with c and A's residual patched at s at every decoding step (``harm_patched``)

The patched greedy decode runs both models on the growing sequence each step without a KV cache (A's residual at the
new position depends on the tokens B chose): O(T²) forwards, cheap on the organism, slow for long real responses
(pass fewer ``--cross-sites`` and a lower ``--max-new-tokens``). Both models are resident during this step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechopd.core.artifacts import write_csv
from mechopd.core.errors import ConfigError
from mechopd.core.views import TwoViewBatch, assemble_two_views, pad_id, render_prompt_ids
from mechopd.generate.settings import stop_ids
from mechopd.probes import causal_items as ci
from mechopd.probes.capture import forward, resolve_sites

COLUMNS = (
    "donor",
    "recipient",
    "site",
    "n_items",
    "logp_of",
    "logp",
    "logp_patched",
    "dlogp",
    "acc_x",
    "acc_xc",
    "acc_xc_patched",
    "harm",
    "harm_patched",
    "d_harm",
)


def _donor_edit(donor: nn.Module | None, batch: TwoViewBatch, site: str | None) -> dict[str, torch.Tensor]:
    if donor is None or site is None:
        return {}
    return {site: forward(donor, batch, "c", head=False, capture=[site], positions="predict")[site]}


def answer_logp(
    recipient: nn.Module, donor: nn.Module | None, batch: TwoViewBatch, site: str | None, temperature: float
) -> torch.Tensor:
    """``[B]`` Σ_t log p(y_t) of the batch's responses in the recipient's context view (patched when `donor`)."""
    out = forward(recipient, batch, "c", edit=_donor_edit(donor, batch, site), positions="predict")
    lp = ci.logp(out.logits, temperature).gather(-1, batch.response_ids[..., None]).squeeze(-1)  # [B, R]
    return (lp * batch.response_mask).sum(1)


def greedy(
    recipient: nn.Module,
    tok: Any,
    examples: Sequence[Any],
    spec: Any,
    which: str,
    max_new_tokens: int,
    *,
    donor: nn.Module | None = None,
    site: str | None = None,
    batch_size: int,
) -> list[str]:
    """Greedy responses of `recipient` in view `which` (the donor's context-view residual patched at `site` at every
    step when given): the module docstring's uncached loop."""
    stop, pad = set(stop_ids(tok, recipient)), pad_id(tok)
    texts: list[str] = []
    for i in range(0, len(examples), batch_size):
        exs = examples[i : i + batch_size]
        px = [render_prompt_ids(tok, e.prompt, None, spec) for e in exs]
        pc = [render_prompt_ids(tok, e.prompt, e.context, spec) for e in exs]
        gen: list[list[int]] = [[] for _ in exs]
        done = [False] * len(exs)
        for _ in range(max_new_tokens):
            batch = assemble_two_views(px, pc, [g + [pad] for g in gen], pad)  # the pad slot is never attended
            batch = batch.to(next(recipient.parameters()).device)
            logits = forward(recipient, batch, which, edit=_donor_edit(donor, batch, site), positions="predict").logits
            nxt = logits[torch.arange(len(gen)), torch.tensor([len(g) for g in gen])].argmax(-1).tolist()
            for j, t in enumerate(nxt):
                if not done[j]:
                    gen[j].append(t)
                    done[j] = t in stop
            if all(done):
                break
        texts += [tok.decode([t for t in g if t not in stop]) for g in gen]
    return texts


def harm(right_x: Sequence[bool], right_c: Sequence[bool]) -> float:
    """P(wrong with c | right without c); NaN when no item is right without c."""
    n = sum(right_x)
    return sum(1 for a, b in zip(right_x, right_c) if a and not b) / n if n else math.nan


def run_cross(run: Any, out: Path, pair: tuple[str, str], sites: Sequence[int | str] | None) -> dict[str, Any]:
    """``patching_cross.csv`` for (donor, recipient) over `sites` (default every residual site); returns the summary."""
    a, b = pair
    for label in pair:
        if label not in run.models:
            raise ConfigError(
                f"--cross {a},{b}: {label!r} is not a compared model ({', '.join(run.models)}); add it to --models"
            )
    donor, recipient = run.load(a), run.load(b)
    task, tok, spec = run.task, run.tokenizer, run.items.spec
    examples = run.items.examples
    has_answers = all(getattr(e, "answer", None) is not None for e in examples)
    scored = run.setup.items(tok, "answers", task) if has_answers else run.items
    kw = dict(batch_size=run.setup.batch_size)
    right_x = [
        bool(task.score(e, t))
        for e, t in zip(examples, greedy(recipient, tok, examples, spec, "x", task.max_new_tokens, **kw))
    ]
    right_c = [
        bool(task.score(e, t))
        for e, t in zip(examples, greedy(recipient, tok, examples, spec, "c", task.max_new_tokens, **kw))
    ]
    base = torch.cat([answer_logp(recipient, None, bt, None, run.temperature) for bt in scored])
    rows: list[dict[str, Any]] = []
    for site in resolve_sites(recipient, sites):
        patched = torch.cat([answer_logp(recipient, donor, bt, site, run.temperature) for bt in scored])
        texts = greedy(recipient, tok, examples, spec, "c", task.max_new_tokens, donor=donor, site=site, **kw)
        right_p = [bool(task.score(e, t)) for e, t in zip(examples, texts)]
        h0, h1 = harm(right_x, right_c), harm(right_x, right_p)
        rows.append(
            {
                "donor": a,
                "recipient": b,
                "site": site,
                "n_items": len(examples),
                "logp_of": "answers" if has_answers else "responses",
                "logp": float(base.mean()),
                "logp_patched": float(patched.mean()),
                "dlogp": float((patched - base).mean()),
                "acc_x": sum(right_x) / len(examples),
                "acc_xc": sum(right_c) / len(examples),
                "acc_xc_patched": sum(right_p) / len(examples),
                "harm": h0,
                "harm_patched": h1,
                "d_harm": h1 - h0,
            }
        )
    write_csv(out / "patching_cross.csv", rows, COLUMNS)
    return {"donor": a, "recipient": b, "rows": sorted(rows, key=lambda r: -abs(r["dlogp"]))[:3]}
