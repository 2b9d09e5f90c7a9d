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
import functools
import hashlib
import itertools
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import nn

from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.model_checks import require_peft
from mechopd.core.provenance import weight_hashes
from mechopd.core.sites import ATTN_MODULES, MLP_MODULES
from mechopd.models.arch import lora_modules

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer

ADAPTER_DIR = "adapter"  # a LoRA checkpoint's adapter, beside its merged weights
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
BASE_RECORD = "mechopd_base.json"  # the sha256 of the base's weight files the adapter was trained on
DEFAULT_TARGETS = ATTN_MODULES + MLP_MODULES  # the attention and MLP projections
NAME = "default"  # peft's adapter name


class LoraSpec(Protocol):
    """What an adapter is built from: the fields of `mechopd.config.sections.LoraOptions`, where they are declared
    once (its section, or the whole `TrainConfig`, satisfies this); models/ reads them without importing the config."""

    lora_rank: int
    lora_alpha: float
    lora_dropout: float
    lora_targets: list[str] | None


def adapter_label(opts: LoraSpec) -> str:
    """The adapter's words in a run's label: ``, LoRA r=8`` for a LoRA student, nothing when every weight trains."""
    return f", LoRA r={opts.lora_rank}" if opts.lora_rank else ""


def targets_of(opts: LoraSpec) -> tuple[str, ...]:
    """The adapted module names: ``lora_targets``, or (None) the attention and MLP projections."""
    return tuple(opts.lora_targets) if opts.lora_targets else DEFAULT_TARGETS


def peft_config(opts: LoraSpec, base: str | None = None, targets: list[str] | None = None) -> Any:
    peft = require_peft()
    return peft.LoraConfig(
        r=opts.lora_rank,
        lora_alpha=opts.lora_alpha,
        lora_dropout=opts.lora_dropout,
        target_modules=list(targets_of(opts)) if targets is None else targets,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base,
    )


def shared_base(model: nn.Module) -> nn.Module:
    """A copy of `model` whose every parameter and buffer IS the original's tensor (new module objects only): the
    student's base weights as a separate module, no memory. Call before `add_adapter`."""
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


def add_adapter(model: nn.Module, opts: LoraSpec) -> nn.Module:
    """Inject a LoRA adapter into `model` in place; only the adapter's A and B stay trainable, in float32 whatever the
    base's dtype (peft casts the input per layer). A target that matches no module raises `ConfigError` naming the
    model's linear module names."""
    peft = require_peft()
    chosen = targets_of(opts)
    paths = lora_modules(model, chosen, every=chosen != DEFAULT_TARGETS)  # fused modules whole
    check_fits(model, opts, paths)
    model.requires_grad_(False)
    peft.inject_adapter_in_model(peft_config(opts, targets=paths), model, adapter_name=NAME)
    for n, p in model.named_parameters():
        p.requires_grad_(".lora_A." in n or ".lora_B." in n)
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()  # the adapter trains in float32 over a bf16 / fp16 base (peft's autocast default)
    return model


def check_fits(model: nn.Module, opts: LoraSpec, paths: list[str]) -> None:
    """Refuse, before anything is allocated, a rank below 1 or above every targeted projection's smaller dimension
    (``lora_rank=2**40``), and ``lm_head`` as a target when the head is tied to the embeddings (the merged checkpoint
    would save an untied head). ``paths``: the targeted modules (`arch.lora_modules`; Linear or Conv1D, whose weight's
    smaller dimension bounds the rank either way)."""
    most = max((min(cast(torch.Tensor, model.get_submodule(p).weight).shape) for p in paths), default=0)
    if not isinstance(opts.lora_rank, int) or not 1 <= opts.lora_rank <= most:
        raise ConfigError(
            f"lora_rank={opts.lora_rank} is outside 1..{most} (the most any targeted projection's ΔW can use: a larger "
            f"rank adds no capacity); choose a lora_rank from 1 to {most}"
        )
    none: Any = lambda: None  # noqa: E731  (a model without transformers' embedding accessors)
    head, embed = getattr(model, "get_output_embeddings", none)(), getattr(model, "get_input_embeddings", none)()
    if "lm_head" in targets_of(opts) and head is not None and embed is not None and head.weight is embed.weight:
        raise ConfigError(
            "lora_targets names lm_head, which this model ties to embed_tokens: its merged checkpoint would save an "
            "untied head; drop lm_head from lora_targets"
        )


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
    shapes_differ = set(want) == set(tensors) and any(tensors[k].shape != params[n].shape for k, n in want.items())
    if set(want) != set(tensors) or shapes_differ:
        raise ModelError(
            f"{source}: the adapter's tensors do not match this run's adapter (lora_rank / lora_targets "
            "changed?); resume with the run's own config"
        )
    if not all(bool(t.isfinite().all()) for t in tensors.values()):
        raise ModelError(
            f"{source}: the adapter holds NaN or inf values: checkpoint {source} is damaged; delete it to resume "
            "from the previous one"
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


def save_adapter(model: nn.Module, opts: LoraSpec, out: Path, base: str | None) -> Path:
    """``out/adapter_config.json`` + ``out/adapter_model.safetensors`` (PEFT's format; `base` recorded as
    ``base_model_name_or_path``)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    peft_config(opts, base).save_pretrained(str(out))
    save_file(adapter_state(model), str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    if base is not None and Path(base).is_dir():  # what the adapter was trained on: checked where W0 is read again
        (out / BASE_RECORD).write_text(json.dumps({"base": str(base), "sha256": dict(base_hashes(str(base)))}))
    return out


@functools.lru_cache(maxsize=4)
def base_hashes(path: str) -> tuple[tuple[str, str], ...]:
    """`core.provenance.weight_hashes` of a checkpoint dir as (file, sha256) pairs; computed once per process."""
    return tuple(weight_hashes(path).items())


def check_base(adapter: Path, base: str | Path) -> None:
    """The base a LoRA adapter is read over has the weight files it was trained on (its ``mechopd_base.json``, when
    the base was a local directory at training time), else one `ModelError`."""
    try:
        recorded = json.loads((adapter / BASE_RECORD).read_text())
    except FileNotFoundError:
        return  # an adapter saved elsewhere (plain PEFT) records no base hashes
    except (OSError, ValueError):
        raise ModelError(f"{adapter / BASE_RECORD} is unreadable; re-save the adapter") from None
    if not isinstance(recorded, dict) or dict(base_hashes(str(base))) != recorded.get("sha256"):
        raise ModelError(
            f"{adapter} was trained on other base weights ({recorded.get('base') if isinstance(recorded, dict) else '?'}"
            f") than {base}; pass its own base (--base) to read its update"
        )


class AdapterDeltas:
    """ΔW of a saved adapter (``<checkpoint>/adapter``), by the HF weight name it adapts
    (``model.layers.0.self_attn.q_proj.weight``): ``delta(name)`` -> float64 ``[d_out, d_in]`` = (α / r) B A.

    The adapter proves what it holds before it is read (else one `ModelError`): every ``lora_A`` has its ``lora_B``,
    A is ``[r, d_in]`` and B ``[d_out, r]`` with the one rank ``r`` its ``adapter_config.json`` states (r >= 1, α a
    finite number, no per-module rank or α patterns), every value finite. ``record`` names it (path, sha256 of its
    weights, r, α, the base it was trained from): the deltas probe's settings carry it."""

    def __init__(self, adapter_dir: str | Path):
        from safetensors.torch import load_file

        d = Path(adapter_dir)
        try:
            cfg = json.loads((d / ADAPTER_CONFIG).read_text())
            tensors = load_file(str(d / ADAPTER_WEIGHTS))
        except Exception as e:  # OSError, a JSON error, safetensors' own error type for a damaged file
            raise ModelError(f"{d}: unreadable LoRA adapter ({type(e).__name__}); re-save it or delete {d}") from None
        if (
            not isinstance(cfg, dict)
            or cfg.get("peft_type", "LORA") != "LORA"
            or cfg.get("use_rslora")
            or cfg.get("use_dora")
        ):
            raise ModelError(f"{d}: only plain LoRA adapters are read (peft_type LORA, no rsLoRA / DoRA)")
        rank, alpha = _rank_and_alpha(d, cfg)
        self.path, self.scale, self.rank, self.alpha = d, alpha / rank, rank, alpha
        self.pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = _pairs(d, tensors, rank)
        self.record = {
            "path": str(d.resolve()),
            "sha256": _sha256(d / ADAPTER_WEIGHTS),
            "r": rank,
            "lora_alpha": alpha,
            "base_model_name_or_path": cfg.get("base_model_name_or_path"),
            "base_sha256": _base_record(d),
        }

    def delta(self, name: str) -> torch.Tensor:
        a, b = self.pairs[name]
        return (b.double() @ a.double()) * self.scale


def _rank_and_alpha(d: Path, cfg: dict[str, Any]) -> tuple[int, float]:
    """``r`` (an integer >= 1) and ``lora_alpha`` (a finite number) of an adapter config; no per-module patterns."""
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ModelError(f"{d}/{ADAPTER_CONFIG}: r {rank!r} is not a rank (an integer >= 1); re-save the adapter")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise ModelError(f"{d}/{ADAPTER_CONFIG}: lora_alpha {alpha!r} is not a finite number; re-save the adapter")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise ModelError(f"{d}/{ADAPTER_CONFIG}: per-module rank_pattern / alpha_pattern are not read; use one rank")
    return rank, float(alpha)


def _pairs(d: Path, tensors: dict[str, torch.Tensor], rank: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{adapted weight name: (A [r, d_in], B [d_out, r])}``, every pair complete, of the config's rank, finite."""
    pairs = {}
    for key in tensors:
        if not key.startswith("base_model.model.") or not key.endswith((".lora_A.weight", ".lora_B.weight")):
            raise ModelError(f"{d}/{ADAPTER_WEIGHTS}: {key} is not a LoRA tensor of PEFT's layout; re-save the adapter")
        a_key = key.replace(".lora_B.", ".lora_A.")
        b_key = a_key.replace(".lora_A.", ".lora_B.")
        if a_key not in tensors or b_key not in tensors:
            missing = b_key if a_key in tensors else a_key
            raise ModelError(f"{d}/{ADAPTER_WEIGHTS} lacks {missing} (half an adapter pair); re-save the adapter")
        a, b = tensors[a_key], tensors[b_key]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or a.shape[0] != rank:
            raise ModelError(
                f"{d}: {a_key[len('base_model.model.') : -len('.lora_A.weight')]} has lora_A {tuple(a.shape)} and "
                f"lora_B {tuple(b.shape)}, not rank {rank} as {ADAPTER_CONFIG} says (r); re-save the adapter"
            )
        if not (a.isfinite().all() and b.isfinite().all()):
            raise ModelError(f"{d}: {a_key} or its lora_B holds NaN or inf values; re-save the adapter")
        pairs[a_key[len("base_model.model.") : -len(".lora_A.weight")] + ".weight"] = (a, b)
    return pairs


def _base_record(d: Path) -> Any:
    try:
        return json.loads((d / BASE_RECORD).read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None


def _sha256(path: Path) -> str:

    return hashlib.sha256(path.read_bytes()).hexdigest()


def adapter_dir(checkpoint: str | Path) -> Path | None:
    """``<checkpoint>/adapter`` when the checkpoint holds one, else None."""
    d = Path(checkpoint) / ADAPTER_DIR
    return d if (d / ADAPTER_CONFIG).is_file() else None
