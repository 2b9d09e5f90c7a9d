"""Score a `TwoViewBatch`: response-position logits / log-probs of one view.

Only the response positions go through the LM head (``logits_to_keep``) in the left layout: for a real model's
150k-row head that is most of a forward's memory. One log-softmax per logits tensor, in float32, reused by every loss
term and selector. Logits are divided by the rollout temperature (docs/method.md: all distributions are computed from
logits / T).
"""

from __future__ import annotations

from typing import Any

import torch

from mechopd.views import TwoViewBatch


def response_logits(model: Any, batch: TwoViewBatch, which: str) -> torch.Tensor:
    """``[batch, R, V]``: index t holds the logits that predict response token t in view `which` ("x" | "c")."""
    kw = batch.view(which)
    R = batch.response_ids.shape[1]
    if batch.layout == "left":
        out = model(**kw, logits_to_keep=R + 1, use_cache=False)
        return out.logits[:, :R]  # columns P-1 .. P+R-2 of the view
    out = model(**kw, use_cache=False)
    return batch.response_logits(out.logits, which)


def to_logp(logits: torch.Tensor, temperature: float, vocab: int | None = None) -> torch.Tensor:
    """log_softmax(logits[..., :vocab] / T) in float32. `vocab` restricts to the common ids (padding rows dropped)."""
    if vocab is not None:
        logits = logits[..., :vocab]
    return torch.log_softmax(logits.float() / temperature, dim=-1)
