"""LoRA students (peft): the adapter put into a loaded HF model, its teacher without a copy, and its files.

A LoRA student keeps its base weights W0 frozen and learns, per targeted projection, ``ΔW = (α / r) · B A``
(A: ``[r, d_in]``, B: ``[d_out, r]``, B = 0 at the start so the first step's student IS the base model; Hu et al. 2021).

Non-standard about this file:
  * The adapter is injected in place (`peft.inject_adapter_in_model`), so the student stays the transformers class it
    was (Llama / Qwen2 / Qwen3 ...): the scorer's trunk/head split, the lean decoder (which calls an adapted
    projection as a module, `generate.lean`) and the probes see the same object as for a full student.
  * Self-distillation teacher without a second copy: `shared_base` is a structural copy of the model made BEFORE the
    adapter goes in, every parameter and buffer the very same tensor as the student's (the copy owns only module
    objects). It is the student with its adapter off: same W0, no ΔW.
  * Files (`save_adapter`, `merged_state`): a LoRA run's checkpoint directory is a MERGED full HF checkpoint
    (W0 + ΔW in every adapted projection, computed on the CPU in float32 and cast to the stored dtype), so that
    ``from_pretrained``, ``mechopd eval``, every probe, TransformerLens and nnsight open it unchanged; the adapter is
    saved beside it in ``<dir>/adapter/`` in PEFT's own format (``adapter_config.json`` + ``adapter_model.safetensors``,
    keys ``base_model.model.<module>.lora_A.weight``), which ``peft.PeftModel.from_pretrained(base, dir)`` loads, and
    from which ``mechopd probe deltas`` reads ΔW = (α / r) B A exactly (`AdapterDeltas`).
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.sites import ATTN_MODULES, MLP_MODULES

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer

ADAPTER_DIR = "adapter"  # a LoRA checkpoint's adapter, beside its merged weights
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
DEFAULT_TARGETS = ATTN_MODULES + MLP_MODULES  # the attention and MLP projections
NAME = "default"  # peft's adapter name


@dataclass(frozen=True)
class LoraOptions:
    """rank r (> 0), alpha α (scale α / r), dropout on the adapter's input, targets (module names, e.g. q_proj)."""

    rank: int
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS


def require_peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError("lora_rank > 0 needs peft (a core dependency of mechopd): pip install 'peft>=0.17'") from None
    return peft


def peft_config(opts: LoraOptions, base: str | None = None, targets: list[str] | None = None) -> Any:
    peft = require_peft()
    return peft.LoraConfig(
        r=opts.rank,
        lora_alpha=opts.alpha,
        lora_dropout=opts.dropout,
        target_modules=list(opts.targets) if targets is None else targets,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base,
    )


def shared_base(model: nn.Module) -> nn.Module:
    """A copy of `model` whose every parameter and buffer IS the original's tensor (new module objects only): the
    student's base weights as a separate module, no memory. Call before `add_adapter`."""
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


def add_adapter(model: nn.Module, opts: LoraOptions) -> nn.Module:
    """Inject a LoRA adapter into `model` in place; only the adapter's A and B stay trainable, in float32 whatever the
    base's dtype (peft casts the input per layer). A target that matches no module raises `ConfigError` naming the
    model's linear module names."""
    from mechopd.models.arch import lora_modules

    peft = require_peft()
    paths = lora_modules(model, opts.targets, every=opts.targets != DEFAULT_TARGETS)  # fused modules whole
    model.requires_grad_(False)
    peft.inject_adapter_in_model(peft_config(opts, targets=paths), model, adapter_name=NAME)
    for n, p in model.named_parameters():
        p.requires_grad_(".lora_A." in n or ".lora_B." in n)
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()  # the adapter trains in float32 over a bf16 / fp16 base (peft's autocast default)
    return model


def lora_layers(model: nn.Module) -> dict[str, LoraLayer]:
    """``{module path: peft LoRA layer}`` of the adapted projections."""
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def site_name(param_name: str) -> str:
    """An adapter parameter's name as the weight it adapts (``...q_proj.lora_A.default.weight`` ->
    ``...q_proj.weight``), so per-layer / per-module statistics group it with its projection."""
    for part in (f".lora_A.{NAME}", f".lora_B.{NAME}", ".base_layer"):
        param_name = param_name.replace(part, "")
    return param_name


def trainable_share(model: nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters) of `model` (adapter included)."""
    ps = list(model.parameters())
    return sum(p.numel() for p in ps if p.requires_grad), sum(p.numel() for p in ps)


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors in PEFT's file layout: ``base_model.model.<module>.lora_A.weight`` (CPU, contiguous)."""
    return {
        "base_model.model." + n.replace(f".{NAME}.", "."): p.detach().cpu().contiguous()
        for n, p in model.named_parameters()
        if ".lora_A." in n or ".lora_B." in n
    }


def load_adapter_state(model: nn.Module, tensors: dict[str, torch.Tensor], source: Path) -> None:
    """Copy adapter tensors in `adapter_state`'s layout into `model`'s adapter (a resume)."""
    params = dict(model.named_parameters())
    want = {"base_model.model." + n.replace(f".{NAME}.", "."): n for n in params if ".lora_" in n}
    if set(want) != set(tensors):
        raise ModelError(
            f"{source}: the adapter's tensors do not match this run's adapter (lora_rank / lora_targets "
            "changed?); resume with the run's own config"
        )
    with torch.no_grad():
        for key, name in want.items():
            params[name].copy_(tensors[key])


def delta_weight(layer: LoraLayer) -> torch.Tensor:
    """ΔW = (α / r) B A of one LoRA layer, float32 ``[d_out, d_in]``."""
    lin_a, lin_b = layer.lora_A[NAME], layer.lora_B[NAME]
    assert isinstance(lin_a, nn.Linear) and isinstance(lin_b, nn.Linear)  # peft's A / B of an adapted nn.Linear
    a = lin_a.weight.detach().float()
    b = lin_b.weight.detach().float()
    return (b @ a) * float(layer.scaling[NAME])


def stored_delta(layer: LoraLayer) -> torch.Tensor:
    """ΔW in the adapted weight's stored layout (a Conv1D's [d_in, d_out]: the transpose of `delta_weight`)."""
    d = delta_weight(layer)
    return d.T if getattr(layer, "fan_in_fan_out", False) else d


def merged_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full model's state dict with W0 + ΔW in every adapted projection, under the plain HF names, on CPU (tensors
    that are one tensor in the model, e.g. tied embeddings, stay one tensor)."""
    layers = lora_layers(model)
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}
    for key, t in model.state_dict().items():
        if ".lora_" in key:
            continue
        owner = key.rsplit(".base_layer.", 1)[0] if ".base_layer." in key else None
        name = key.replace(".base_layer.", ".")
        if owner in layers and key.endswith("base_layer.weight"):
            out[name] = (t.detach().float().cpu() + stored_delta(layers[owner]).cpu()).to(t.dtype)
            continue
        if id(t) not in seen:
            seen[id(t)] = t.detach().cpu()
        out[name] = seen[id(t)]
    return out


def save_adapter(model: nn.Module, opts: LoraOptions, out: Path, base: str | None) -> Path:
    """``out/adapter_config.json`` + ``out/adapter_model.safetensors`` (PEFT's format; `base` recorded as
    ``base_model_name_or_path``)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    peft_config(opts, base).save_pretrained(str(out))
    save_file(adapter_state(model), str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return out


class AdapterDeltas:
    """ΔW of a saved adapter (``<checkpoint>/adapter``), by the HF weight name it adapts
    (``model.layers.0.self_attn.q_proj.weight``): ``delta(name)`` -> float64 ``[d_out, d_in]`` = (α / r) B A."""

    def __init__(self, adapter_dir: str | Path):
        from safetensors.torch import load_file

        d = Path(adapter_dir)
        try:
            cfg = json.loads((d / ADAPTER_CONFIG).read_text())
            tensors = load_file(str(d / ADAPTER_WEIGHTS))
        except (OSError, ValueError) as e:
            raise ModelError(f"{d}: unreadable LoRA adapter ({type(e).__name__}); re-save it or delete {d}") from None
        if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("use_rslora") or cfg.get("use_dora"):
            raise ModelError(f"{d}: only plain LoRA adapters are read (peft_type LORA, no rsLoRA / DoRA)")
        self.path, self.scale = d, float(cfg["lora_alpha"]) / float(cfg["r"])
        self.pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, a in tensors.items():
            if key.endswith(".lora_A.weight"):
                module = key[len("base_model.model.") : -len(".lora_A.weight")]
                self.pairs[module + ".weight"] = (a, tensors[key.replace(".lora_A.", ".lora_B.")])

    def delta(self, name: str) -> torch.Tensor:
        a, b = self.pairs[name]
        return (b.double() @ a.double()) * self.scale


def adapter_dir(checkpoint: str | Path) -> Path | None:
    """``<checkpoint>/adapter`` when the checkpoint holds one, else None."""
    d = Path(checkpoint) / ADAPTER_DIR
    return d if (d / ADAPTER_CONFIG).is_file() else None
