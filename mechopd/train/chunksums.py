"""What one step's chunks add up to (`train.step`): the loss and logs summed over chunks and micro-batches, and
their gradients routed into ``.grad`` (one backward per chunk into the detached trunk outputs and the head, then one
through each trunk) or, on a per-term step, per term into `gradstats.TermGrads`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.profiler import record_function

from mechopd.objectives.losses import LossTerm
from mechopd.train.gradstats import TermGrads


class ChunkSums:
    """Sums the chunk shares (loss, logs) and routes their gradients: ``backward`` into ``.grad`` (and the leaves),
    or per term into `TermGrads`."""

    def __init__(self, terms: list[LossTerm], params: list, head_params: list, per_term: bool):
        self.per_term, self.head_params = per_term, head_params
        self.loss: Tensor | float = 0.0
        self.logs: dict[str, Tensor] = {}
        self.weights: dict[str, float] = {}
        self.grads = TermGrads([t.name for t in terms], params)
        self.leaf_grads: dict[str, dict[str, Tensor]] = {}

    def chunk(self, res: Any, leaves: dict[str, Tensor], kl_share: Tensor) -> None:
        self.loss = self.loss + res.loss.detach()
        for k, v in list(res.logs.items()) + [("kl/teacher_student", kl_share)]:
            self.logs[k] = self.logs.get(k, 0.0) + v.detach()
        self.weights = res.weights
        names, leaf_list = list(leaves), list(leaves.values())
        if not self.per_term:
            with record_function("mechopd.backward.chunk"):
                res.loss.backward()  # leaves' .grad and the head's .grad accumulate
            return
        terms = list(res.weighted)
        for j, t in enumerate(terms):
            g = torch.autograd.grad(
                res.weighted[t], leaf_list + self.head_params, retain_graph=j < len(terms) - 1, allow_unused=True
            )
            acc = self.leaf_grads.setdefault(t, {})
            for n, gl in zip(names, g[: len(names)]):
                if gl is not None:
                    acc[n] = gl if n not in acc else acc[n] + gl
            self.grads.add(t, self.head_params, g[len(names) :])

    def trunk(self, hs: dict[str, Tensor], leaves: dict[str, Tensor]) -> None:
        """One backward through the trunk(s) of this micro-batch (per term on a per-term step)."""
        if not self.per_term:
            ready = [r for r in hs if leaves[r].grad is not None and hs[r].requires_grad]
            if ready:
                with record_function("mechopd.backward.trunk"):
                    torch.autograd.backward([hs[r] for r in ready], [leaves[r].grad for r in ready])
            return
        todo = [(t, [(hs[r], g) for r, g in lg.items() if hs[r].requires_grad]) for t, lg in self.leaf_grads.items()]
        todo = [(t, p) for t, p in todo if p]
        for j, (t, pairs) in enumerate(todo):
            g = torch.autograd.grad(
                [p[0] for p in pairs],
                self.grads.params,
                [p[1] for p in pairs],
                retain_graph=j < len(todo) - 1,
                allow_unused=True,
            )
            self.grads.add(t, self.grads.params, g)
        self.leaf_grads = {}
