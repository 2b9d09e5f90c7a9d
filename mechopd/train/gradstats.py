"""Per-term gradient statistics during training (``grad_stats_every``; docs/method.md §6, "gradient alignment").

On a stats step each WEIGHTED term w_i·L_i gets its own backward (``autograd.grad``, graph retained between terms);
their sum is the step's gradient (linearity), so it is written into ``.grad`` and no further backward runs: a stats
step costs one backward per term instead of one. Under micro-batches and logit chunks (`train.step`) the per-term
gradients are summed piece by piece in a `TermGrads` (each chunk's and each trunk's ``autograd.grad`` per term). Gradients are summed over processes before any statistic.
With g_i the flat gradient of term i over the student's parameters (tied weights once):

    grad/norm/<i>                          ‖g_i‖
    grad/cos/<i>__<j>                      <g_i, g_j> / (‖g_i‖ ‖g_j‖)             (None when a norm is 0)
    grad/cos_group/<i>__<j>/<layer>.<m>    the same over one layer × module group (layer = decoder layer index, or
                                           "none" for parameters outside the decoder layers: embeddings, final norm)
    grad/dominance/<i>                     share of coordinates where |g_i| is the largest of all terms (ties to the
                                           earlier term; coordinates where every term is 0 are not counted)
Pairs (i, j) follow the method's term order (i before j).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import Tensor

from mechopd.core.sites import module_kind, param_layer
from mechopd.train import dist


def term_grads(weighted: dict[str, Tensor], params: list[torch.nn.Parameter]) -> dict[str, list[Tensor]]:
    """One backward per weighted term: ``{term: [grad per parameter]}`` (zeros where a term does not reach)."""
    out: dict[str, list[Tensor]] = {}
    names = list(weighted)
    for i, name in enumerate(names):
        grads = torch.autograd.grad(weighted[name], params, retain_graph=i < len(names) - 1, allow_unused=True)
        out[name] = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
    return out


def set_summed_grads(params: list[torch.nn.Parameter], grads: dict[str, list[Tensor]]) -> None:
    """``p.grad = Σ_terms g_term`` (this process's gradient of the total loss)."""
    for k, p in enumerate(params):
        total = sum(g[k] for g in grads.values())
        assert isinstance(total, Tensor)  # `grads` holds at least one term
        p.grad = total.detach()


def _flat(grads: list[Tensor]) -> Tensor:
    """This process's gradients as one float32 vector, summed over processes. ``[Σ numel]``."""
    return dist.all_sum(torch.cat([g.detach().reshape(-1).float() for g in grads]))


def _cos(dot: float, sq_a: float, sq_b: float) -> float | None:
    return dot / math.sqrt(sq_a * sq_b) if sq_a > 0 and sq_b > 0 else None


def grad_stats(grads: dict[str, list[Tensor]], param_names: list[str]) -> dict[str, float | None]:
    """The metrics listed in the module docstring; ``param_names`` align with each term's list of gradients."""
    names = list(grads)
    flats = {t: _flat(g) for t, g in grads.items()}
    sizes = [g.numel() for g in next(iter(grads.values()))]
    groups = [f"{'none' if param_layer(n) is None else param_layer(n)}.{module_kind(n)}" for n in param_names]
    rec: dict[str, float | None] = {}
    for t in names:
        rec[f"grad/norm/{t}"] = float(flats[t].double().norm())
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            fa, fb = flats[a].double(), flats[b].double()
            rec[f"grad/cos/{a}__{b}"] = _cos(float(fa @ fb), float(fa @ fa), float(fb @ fb))
            acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
            offset = 0
            for group, size in zip(groups, sizes):
                sa, sb = fa[offset : offset + size], fb[offset : offset + size]
                s = acc[group]
                s[0] += float(sa @ sb)
                s[1] += float(sa @ sa)
                s[2] += float(sb @ sb)
                offset += size
            for group, (dot, qa, qb) in acc.items():
                rec[f"grad/cos_group/{a}__{b}/{group}"] = _cos(dot, qa, qb)
    rec.update(_dominance(names, flats))
    return rec


def _dominance(names: list[str], flats: dict[str, Tensor]) -> dict[str, float | None]:
    mags = torch.stack([flats[t].abs() for t in names])  # [terms, Σ numel]
    top, arg = mags.max(0)  # max returns the first index on ties
    counted = top > 0
    n = int(counted.sum())
    return {f"grad/dominance/{t}": (float((arg[counted] == i).sum()) / n if n else None) for i, t in enumerate(names)}


def term_norms(weighted: dict[str, Tensor], params: list[torch.nn.Parameter]) -> dict[str, float]:
    """Each weighted term's gradient norm over all processes (failure diagnosis: pass freshly computed terms)."""
    grads = term_grads(weighted, params)
    return {t: math.sqrt(float(dist.all_sum(_squares([x.detach() for x in g])))) for t, g in grads.items()}


class TermGrads:
    """Per-term gradients accumulated piece by piece (chunks, micro-batches): ``add(term, params, grads)`` adds
    ``grads`` (None = no contribution) to the entries of ``params`` (a subset of the run's parameters, by identity);
    ``result()`` gives ``{term: [grad per parameter]}`` as `term_grads` does (zeros where a term does not reach)."""

    def __init__(self, names: list[str], params: list[torch.nn.Parameter]):
        self.names, self.params = names, params
        self._index = {id(p): i for i, p in enumerate(params)}
        self._g: dict[str, list[Tensor | None]] = {n: [None] * len(params) for n in names}

    def add(self, term: str, params: list[torch.nn.Parameter], grads: tuple[Tensor | None, ...] | list) -> None:
        acc = self._g[term]
        for p, g in zip(params, grads):
            if g is not None:
                i = self._index[id(p)]
                acc[i] = g.detach() if acc[i] is None else acc[i] + g.detach()

    def result(self) -> dict[str, list[Tensor]]:
        return {
            n: [torch.zeros_like(p) if g is None else g for g, p in zip(gs, self.params)] for n, gs in self._g.items()
        }


def norms(grads: dict[str, list[Tensor]]) -> dict[str, float]:
    """Each term's gradient norm over all processes, from per-term gradients (`TermGrads.result`)."""
    return {t: math.sqrt(float(dist.all_sum(_squares(g)))) for t, g in grads.items()}


def _squares(g: list[Tensor]) -> Tensor:
    """``Σ_x Σ x²`` in float64 over this process's tensors (a 0-d tensor; 0 for none)."""
    return sum(((x.double() ** 2).sum() for x in g), torch.zeros((), dtype=torch.float64))
