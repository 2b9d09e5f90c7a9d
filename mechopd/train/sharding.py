"""How the models are laid out over processes: ``sharding: none`` (replicas) or ``fsdp`` (PyTorch FSDP2).

Both layouts compute the same update. The loss terms are normalised by the GLOBAL token count, so the gradient of
the global batch is the SUM of the per-process gradients (never their mean):
  - `Replicated`: every process holds the full student and teacher; `dist.all_reduce_grads` sums the gradients.
  - `FSDP`: `fully_shard` on every decoder layer, then on the root, for the student and the (frozen) teacher; the
    reduce-scatter SUMS (divide factor 1, sum-only collectives; FSDP's default would average).
Non-standard about the FSDP layout:
  - Generation (rollouts, games, evaluation) runs inside `gathered`: the student's full parameters are all-gathered
    once and kept for the whole generation, so a decode step runs no collective. That is what lets processes decode
    different numbers of steps (games, early stops) and rank 0 evaluate alone; it costs one full student per process
    while generating (the teacher stays sharded).
  - Clipping uses the global norm (`clip_grad_norm_` on DTensor parameters reduces over the mesh).
  - Checkpoints hold FULL weights (`from_pretrained` loads them) and a full optimizer state keyed by parameter index,
    the same format as the replicated layout, so a run resumes under either layout.
With one process there is nothing to shard: both layouts are the plain model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from mechopd.core.errors import TrainingError
from mechopd.models import decoder_layers
from mechopd.train import dist
from mechopd.train.checkpoint import read_optimizer_state

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


class Replicated:
    """Full replicas on every process; gradients summed by `dist.all_reduce_grads` (identity for one process)."""

    name = "none"

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        """`model` (loaded on CPU) placed on `device` in this layout."""
        return model.to(device)

    def gathered(self, model: nn.Module) -> Any:
        return nullcontext()

    def reduce_grads(self, params: list[nn.Parameter]) -> None:
        dist.all_reduce_grads(params)

    def clip_grads(self, params: list[nn.Parameter], max_norm: float) -> float:
        """Clip to `max_norm` over the global gradient norm; returns that norm (before clipping)."""
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def full_model(self, model: nn.Module) -> nn.Module | None:
        """A plain HF model with the full weights on rank 0 (None elsewhere); every process must call it."""
        return model if dist.rank() == 0 else None

    def optimizer_state(self, model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
        """``opt.state_dict()`` layout (state keyed by parameter index), full tensors; every process must call it."""
        return opt.state_dict()

    def load_optimizer_state(self, model: nn.Module, opt: torch.optim.Optimizer, ckpt: Path) -> None:
        """Restore `opt` from checkpoint `ckpt`; every process must call it."""
        opt.load_state_dict(read_optimizer_state(ckpt))


class FSDP(Replicated):
    """FSDP2 (`torch.distributed.fsdp.fully_shard`) over all processes, one shard group per decoder layer."""

    name = "fsdp"

    def __init__(self, device: torch.device):
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(device.type, (dist.world_size(),))

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        """Shard `model` in place; `fully_shard` moves each process's shard to the mesh's device."""
        from torch.distributed.fsdp import FSDPModule, fully_shard

        for layer in decoder_layers(model):
            fully_shard(layer, mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)  # the rest: embeddings, final norm, (tied) LM head
        for m in model.modules():
            if isinstance(m, FSDPModule):  # sum, not mean: the losses are already global token means
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)
        return model

    @contextmanager
    def gathered(self, model: nn.Module) -> Iterator[None]:
        """Full parameters on every process inside the block; forwards in it run no collective."""
        mods = _fsdp_modules(model)
        for m in mods:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        try:
            yield
        finally:
            for m in mods:
                m.reshard()
                # FSDP's defaults: layers free their full weights after forward; the root keeps them for backward
                m.set_reshard_after_forward(m is not model, recurse=False)

    def reduce_grads(self, params: list[nn.Parameter]) -> None:
        pass  # done by FSDP's reduce-scatter during backward

    def clip_grads(self, params: list[nn.Parameter], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # a replicated DTensor: the global norm
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def full_model(self, model: nn.Module) -> nn.Module | None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        from transformers import AutoModelForCausalLM

        sd = get_model_state_dict(model, options=_full())  # rank 0: full CPU tensors; others: {}
        if dist.rank() != 0:
            return None
        first = next(iter(sd.values()))
        assert isinstance(first, torch.Tensor)  # a full model state dict: name -> tensor
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(model.config, dtype=first.dtype)
        plain.load_state_dict(sd, strict=False, assign=True)  # tied LM head: one key may be absent
        plain.tie_weights()
        _materialise_buffers(plain, model)
        missing = [n for n, t in [*plain.named_parameters(), *plain.named_buffers()] if t.is_meta]
        if missing:
            raise TrainingError(
                f"gathering the sharded student for saving left {', '.join(missing[:3])} unset; "
                "the checkpoint was not written (report this with the model's architecture)"
            )
        plain.generation_config = model.generation_config
        return plain

    def optimizer_state(self, model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        sd = get_optimizer_state_dict(model, opt, options=_full())  # keyed by parameter name
        if dist.rank() != 0:
            return {}
        # torch's layout of a keyed-by-name optimizer state: {"state": {name: ...}, "param_groups": [{"params": [name]}]}
        state, groups = cast(dict[str, Any], sd["state"]), cast(list[dict[str, Any]], sd["param_groups"])
        index = {name: i for i, name in enumerate(n for g in groups for n in g["params"])}
        return {
            "state": {index[k]: v for k, v in state.items()},
            "param_groups": [dict(g, params=[index[n] for n in g["params"]]) for g in groups],
        }

    def load_optimizer_state(self, model: nn.Module, opt: torch.optim.Optimizer, ckpt: Path) -> None:
        """Rank 0 reads the full state and broadcasts it; each process keeps its shards (no full copy per process)."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        full: dict[str, Any] = {}
        if dist.rank() == 0:
            sd = read_optimizer_state(ckpt)
            name_of = {id(p): n for n, p in model.named_parameters()}
            names = [name_of[id(p)] for g in opt.param_groups for p in g["params"]]
            full = {
                "state": {names[int(i)]: v for i, v in sd["state"].items()},
                "param_groups": [dict(g, params=[names[int(i)] for i in g["params"]]) for g in sd["param_groups"]],
            }
        set_optimizer_state_dict(model, opt, full, options=_full(broadcast_from_rank0=True))
        for group, saved in zip(opt.param_groups, read_optimizer_state(ckpt, tensors=False)["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})  # lr etc. on every process alike


def _full(**kw: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    options: dict[str, Any] = {"full_state_dict": True, "cpu_offload": True, **kw}
    return StateDictOptions(**options)


def _fsdp_modules(model: nn.Module) -> list[FSDPModule]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _materialise_buffers(plain: nn.Module, like: nn.Module) -> None:
    """Non-persistent buffers (rotary inv_freq) are not in a state dict: copy them from the live model."""
    live = dict(like.named_buffers())
    for name, buf in list(plain.named_buffers()):
        if buf.is_meta:
            owner, _, attr = name.rpartition(".")
            mod = plain.get_submodule(owner) if owner else plain
            mod._buffers[attr] = live[name].detach().cpu().clone()


def make_sharding(name: str, device: torch.device) -> Replicated:
    """The layout for `name` (config ``sharding``); one process -> `Replicated` (nothing to shard)."""
    if name == "fsdp" and dist.world_size() > 1:
        return FSDP(device)
    return Replicated()
