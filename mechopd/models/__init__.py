"""Load / save Hugging Face causal LMs and tokenizers; resolve module paths by structure (`mechopd.models.arch`).

Probe sites are named in `mechopd.core.sites` (the one naming table); this file resolves them to modules of a loaded model
(`module_at`, `layer_modules`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from mechopd.core.checks import resolve_device, umask_mode
from mechopd.core.errors import ModelError
from mechopd.core.model_checks import check_checkpoint, check_finite, check_loading_info, check_tokenizer, read_config
from mechopd.core.runcheck import as_disk_error
from mechopd.core.sites import ATTN_MODULES, FUSED_MODULES, MLP_MODULES, NORM_MODULES, QK_NORMS
from mechopd.models import arch


def _looks_like_hub_id(name: str) -> bool:
    """``org/name`` — unless ``org`` is a local directory: ``runs/x`` beside a ``runs/`` folder is a local path that
    is missing, reported as such before any hub lookup."""
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~")) and not Path(parts[0]).is_dir()


def _no_config(d: Path) -> str:
    """Why ``d`` (no config.json) is no model; a Trainer's ``output_dir`` (TRL's too) names its checkpoint-N folders."""
    steps = sorted(
        int(c.name.split("-", 1)[1])
        for c in (d.glob("checkpoint-*") if d.is_dir() else [])
        if c.name.split("-", 1)[1].isdigit() and (c / "config.json").is_file()
    )
    if steps:
        names = ", ".join(f"checkpoint-{n}" for n in steps)
        return (
            f"{d} has no config.json but holds Trainer checkpoints ({names}); pass one, e.g. the latest "
            f"{d / f'checkpoint-{steps[-1]}'}, or call trainer.save_model() to write the model into {d}"
        )
    return f"{d} has no config.json; pass a directory written by save_pretrained (or a hub id)"


def _check_source(path: str | os.PathLike) -> str:
    s = str(path)
    if Path(s).exists():
        if not Path(s, "config.json").exists():
            raise ModelError(_no_config(Path(s)))
        return s
    if _looks_like_hub_id(s):
        return s
    parent = Path(s).parent
    where = (
        f" ({parent}/ exists, so this is read as a local path)"
        if str(parent) not in ("", ".") and parent.is_dir()
        else ""
    )
    raise ModelError(f"model path {s!r} does not exist{where} and is not a hub id like 'Qwen/Qwen3-4B'; check the path")


@contextlib.contextmanager
def quiet_progress(enabled: bool = True) -> Iterator[None]:
    """Inside the block, transformers' progress bars ("Loading weights", "Writing model shards") are off; the previous
    state (transformers' and huggingface_hub's) is restored after. ``enabled=False`` leaves them as they are."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging as hf_logging

    if not enabled:
        yield
        return
    was_on, hub_was_off = hf_logging.is_progress_bar_enabled(), are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
        if hub_was_off:
            disable_progress_bars()


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer saved with a model (path or hub id). A directory without one raises `ModelError`."""
    from transformers import AutoTokenizer

    src = _check_source(path)
    try:
        tok = AutoTokenizer.from_pretrained(src)
    except Exception as e:  # noqa: BLE001 - tokenizers / transformers raise many types for a damaged file
        raise ModelError(
            f"no usable tokenizer at {src} ({type(e).__name__}); save it next to the model with "
            "tokenizer.save_pretrained(DIR)"
        ) from None
    check_tokenizer(tok, src)  # not empty, not another model's
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token  # explicit: padding is masked everywhere, so the id only needs to exist
    return tok


def check_model(path: str | os.PathLike) -> str:
    """`path` names a loadable checkpoint (a local dir passes `checks.check_checkpoint`; headers only, cheap) or a hub
    id; returns it as a string. Commands call it for every model before loading the first one."""
    src = _check_source(path)
    config = None
    if Path(src).is_dir():  # refused before any work: mixture-of-experts, encoder-decoder, state-space layers
        config = read_config(src)
        arch.check_supported(config)
        from mechopd.models.family import check_family

        check_family(config, f"{Path(src) / 'config.json'}")  # MoE however spelled, recurrent layers, heads, activation
    check_checkpoint(src, config)
    return src


def load_model(
    path: str | os.PathLike, *, dtype: torch.dtype | str | None = None, device: str | torch.device | None = None
) -> nn.Module:
    """A causal LM from a path or hub id, in eval mode, after `checks.check_checkpoint` (weights readable and as
    config.json describes; pickles refused) and `checks.check_finite` (no NaN/inf weight). Failures -> `ModelError`.

    A local directory loads without transformers' per-load progress bar (`quiet_progress`); a hub id keeps the bars,
    which then also show the download."""
    from transformers import AutoModelForCausalLM

    src = _check_source(path)
    dev = resolve_device(device) if device is not None else None  # a missing device fails before any loading
    config = read_config(src)
    arch.check_supported(config)
    files = check_checkpoint(src, config)
    try:
        with quiet_progress(Path(src).exists()):
            # output_loading_info=True: (model, info), which transformers' return annotation (the model) omits
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                src, config=config, dtype=dtype or torch.float32, use_safetensors=True, output_loading_info=True
            )
            model, info = loaded
    except ValueError as e:
        raise ModelError(
            f"{src} (model_type {getattr(config, 'model_type', '?')!r}) is not a causal LM: {str(e).splitlines()[0]}"
        ) from None
    except OSError as e:  # a hub id without safetensors / not cached
        raise ModelError(f"cannot load weights for {src}: {str(e).splitlines()[0]}") from None
    check_loading_info(src, info)
    check_finite(model, src, files)
    if dev is not None:
        model = model.to(dev)
    return model.eval()


def atomic_save(
    model: Any, tokenizer: Any, out_dir: str | os.PathLike, extra: dict[str, str] | None = None, writer: Any = None
) -> Path:
    """`save_pretrained` (safetensors) into a temp dir next to `out_dir`, then rename into place.

    A killed process never leaves a half-written checkpoint at `out_dir`. `extra` maps file names to text contents;
    `writer(tmp_dir)` may write more files before the rename. `model`: anything with transformers'
    ``save_pretrained`` (a model, or `train.teachers`' savable view of one).
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(umask_mode(directory=True))  # mkdtemp's 0700 would outlive the rename
    try:
        try:
            with quiet_progress():
                model.save_pretrained(tmp, safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            for name, text in (extra or {}).items():
                (tmp / name).write_text(text)
            if writer is not None:
                writer(tmp)
        except Exception as e:  # safetensors' own error type for a full disk: the OSError every verb reports
            full = as_disk_error(e)
            if full is e:
                raise
            assert isinstance(full, OSError)  # as_disk_error returns its argument or a new OSError
            raise OSError(full.errno, full.strerror, str(tmp)) from None
        for f in tmp.rglob("*"):  # save_pretrained writes the weights 0600 (a temp file renamed): respect the umask
            f.chmod(umask_mode(directory=f.is_dir()))
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            old.unlink() if old.is_symlink() else shutil.rmtree(old, ignore_errors=True)  # a link: never its target
        else:
            tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def model_type(model: nn.Module) -> str:
    """The config's model_type, after `arch.check_supported` (mixture-of-experts, encoder-decoder and state-space
    models are refused with the reason)."""
    config = getattr(model, "config", None)
    if config is None:
        raise ModelError(f"{type(model).__name__} has no config; pass a transformers causal LM")
    arch.check_supported(config)
    return str(getattr(config, "model_type", "?"))


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers, found by structure (`arch.layers_path`: ``model.layers``, ``transformer.h``, ...)."""
    return cast(nn.ModuleList, model.get_submodule(arch.layers_path(model)))


def num_layers(model: nn.Module) -> int:
    return len(decoder_layers(model))


def layer_modules(model: nn.Module, i: int) -> dict[str, nn.Module]:
    """Per layer, in Llama's words: the attention and MLP projections the model has as modules (q/k/v/o_proj,
    gate/up/down_proj; a fused model's ``qkv_proj`` / ``gate_up_proj``), the norms, q_norm / k_norm where present."""
    layers = decoder_layers(model)
    if not -len(layers) <= i < len(layers):
        raise ModelError(f"layer {i} is out of range; the model has {len(layers)} layers (0..{len(layers) - 1})")
    i %= len(layers)
    out: dict[str, nn.Module] = {}
    for name in ATTN_MODULES + QK_NORMS + FUSED_MODULES + MLP_MODULES + NORM_MODULES:
        block = "self_attn." if name in ATTN_MODULES + QK_NORMS or name == "qkv_proj" else ""
        block = "mlp." if name in MLP_MODULES or name == "gate_up_proj" else block
        with contextlib.suppress(ModelError):
            out[name] = model.get_submodule(arch.site_path(model, f"layers.{i}.{block}{name}"))
    return out


def module_at(model: nn.Module, site: str) -> nn.Module:
    """Resolve a site address (``layers.3.self_attn.q_proj``, ``layers.3.resid_post``, ``embed``, ``final_norm``,
    ``lm_head``) on this model's own module tree (`arch.site_path`: GPT-2's ``transformer.h.3.attn.c_proj`` for
    ``layers.3.self_attn.o_proj``)."""
    return model.get_submodule(arch.site_path(model, site))


def vocab_size(model: Any) -> int:  # a transformers causal LM (get_output_embeddings)
    return int(model.get_output_embeddings().weight.shape[0])


def check_same_tokenizer(tok_a: Any, tok_b: Any, name_a: str = "student", name_b: str = "teacher") -> None:
    """Refuse two tokenizers that would map the same text to different ids (cross-model distillation needs that)."""
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    common = set(va) & set(vb)
    if any(va[w] != vb[w] for w in common) or len(common) < 0.99 * max(len(va), len(vb)):
        raise ModelError(
            f"the {name_a} and {name_b} tokenizers differ ({len(va)} vs {len(vb)} entries, "
            f"{sum(va[w] != vb[w] for w in common)} shared words with different ids); cross-model "
            "distillation needs a shared tokenizer"
        )
