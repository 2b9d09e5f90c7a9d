"""Slow references for the causal probes' tests: what a number should be, computed the plainest way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def output_kl(model: Any, records: Sequence[Mapping[str, Any]], temperature: float = 1.0) -> float:
    """An independent forward on saved items (``prompt_ids_x``, ``prompt_ids_c``, ``response_ids``): the whole model
    on each item alone, full logits, float64, KL(p_c ‖ p_x) at the positions predicting the response, token mean."""
    total, n = 0.0, 0
    for rec in records:
        px, pc, y = rec["prompt_ids_x"], rec["prompt_ids_c"], rec["response_ids"]
        with torch.no_grad():
            lx = model(input_ids=torch.tensor([px + y])).logits[0, len(px) - 1 : len(px) + len(y) - 1]
            lc = model(input_ids=torch.tensor([pc + y])).logits[0, len(pc) - 1 : len(pc) + len(y) - 1]
        a = torch.log_softmax(lc.double() / temperature, -1)
        b = torch.log_softmax(lx.double() / temperature, -1)
        total += float((a.exp() * (a - b)).sum())
        n += len(y)
    return total / n
