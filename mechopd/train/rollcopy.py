"""The rollout's bfloat16 copy of the student (``rollout_dtype: bfloat16``; issue 58 item 2): an opt-in speed-up that
makes the training OFF-policy by the cast, never the default.

With it on, the training rollouts (the main batch, the follow term's c′ batch, game moves) are sampled from a
bfloat16 copy ``q_bf16`` of the float32 student ``q_x``; the student's loss, the teacher and every evaluation read
the float32 weights as before. The responses are then draws from ``q_bf16``, not from the ``q_x`` the reverse KL is
taken under: bench/bf16_rollout.py measures how far apart they are on SmolLM2-135M (|Δ log p| of the sampled token,
KL(q_bf16 ‖ q_x), the importance ratios q_x / q_bf16, greedy agreement; docs/real_models.md, "bf16 rollouts"), and a
run's label says "bf16 rollouts" (`objectives.labels.rollout_label`) so no table passes it off as on-policy OPD.

The copy is made once (`RolloutCopy`: every parameter cast to bfloat16, buffers such as RoPE's ``inv_freq`` kept as
the student's, tied weights still tied) and follows the student: `refresh` after every optimizer step copies the
parameters the optimizer moves (all of them; a LoRA student's adapter A and B only, its frozen base cast once), each
cast with round-to-nearest-even exactly as ``tensor.to(torch.bfloat16)``. A resumed run builds it from the resumed
weights. Its cost: one read of the float32 weights and one write of half as many bytes per step (measured in the
bench: ``refresh``; in a run its seconds count in the step's ``optimizer`` stage, `train.profile`)."""

from __future__ import annotations

import copy

import torch
from torch import nn


class RolloutCopy:
    """``model``: the student's copy in ``dtype`` (same modules, same train/eval mode, no gradients); `refresh`
    re-casts the student's trainable parameters into it in place."""

    def __init__(self, student: nn.Module, dtype: torch.dtype = torch.bfloat16):
        memo = {id(p): nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in student.parameters()}
        self.model = copy.deepcopy(student, memo)  # buffers copied as they are; parameters: the cast ones
        own = dict(self.model.named_parameters())
        pairs = [(own[n], p) for n, p in student.named_parameters() if p.requires_grad]
        self._dst: list[torch.Tensor] = [d for d, _ in pairs]
        self._src: list[torch.Tensor] = [s for _, s in pairs]

    @torch.no_grad()
    def refresh(self) -> None:
        """The copy's trainable parameters <- the student's, cast (after every optimizer step)."""
        torch._foreach_copy_(self._dst, self._src)


def make(rollout_dtype: str, student: nn.Module) -> RolloutCopy | None:
    """The copy for ``rollout_dtype`` (None for "same": the student samples its own rollouts)."""
    return None if rollout_dtype == "same" else RolloutCopy(student, getattr(torch, rollout_dtype))


def sampler(student: nn.Module, copied: RolloutCopy | None) -> nn.Module:
    """The model the training rollouts sample from: the student, or its copy (``rollout_dtype``)."""
    return student if copied is None else copied.model
