"""Checks of a model directory before and after it loads; each failure is one `ModelError` line.

- Weights (`check_checkpoint`, before `from_pretrained`; `check_finite`, after it): a local checkpoint directory holds
  safetensors weights that are readable (not empty, not truncated, a valid header), that are exactly the tensors its
  config.json describes (none missing, none extra, every shape as configured), and whose values are all finite.
  Pickled weights (``.bin`` / ``.pt``) are refused with the conversion to run, never unpickled.
- Model directories (`check_checkpoint`, `check_tokenizer`): ``vocab_size`` >= 1; every file the directory names
  (index shards, tokenizer files) lies inside it; the tokenizer is not empty (transformers builds a 1-entry one when
  the files are gone), has no id past the embedding rows, and agrees with config.json on its eos / bos ids (another
  model's tokenizer next to the weights).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import torch

from mechopd.core.errors import ConfigError, ModelError

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def require_peft() -> Any:
    """The peft package (LoRA students, `mechopd.models.lora`), or one line saying how to install it."""
    try:
        import peft
    except ImportError:
        raise ConfigError("lora_rank > 0 needs peft (a core dependency of mechopd): pip install 'peft>=0.17'") from None
    return peft


VLLM_INSTALL = "pip install mechopd[vllm]"


def require_vllm(field: str = "rollout_engine") -> None:
    """Raise a one-line `ConfigError` naming the install command if vLLM is not importable (the config's and the
    engine's check: `mechopd.generate.vllm_engine`)."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"{field}=vllm needs vLLM, which is not installed; install the extra: {VLLM_INSTALL} (or choose {field}=lean)"
        )


# --------------------------------------------------------------------------------------------------------- weights
def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def read_header(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors header (no tensor data is read)."""
    from safetensors import SafetensorError, safe_open

    if file.stat().st_size == 0:
        raise ModelError(f"{file} is empty (0 bytes): an interrupted save or copy; copy or re-save the checkpoint")
    try:
        with safe_open(str(file), framework="pt") as f:
            return {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelError(
            f"{file} is truncated or not a safetensors file ({_first_line(e)}); copy or re-save the "
            "checkpoint with save_pretrained"
        ) from None


def weight_files(path: str | os.PathLike) -> dict[str, Path]:
    """Tensor name -> file of a local checkpoint dir (``model.safetensors`` or a sharded index). Refuses pickles."""
    d = Path(path)
    if (d / WEIGHTS).is_file():
        return {name: d / WEIGHTS for name in read_header(d / WEIGHTS)}
    if (d / INDEX).is_file():
        try:
            weight_map = dict(json.loads((d / INDEX).read_text())["weight_map"])
        except (ValueError, KeyError, TypeError) as e:
            raise ModelError(
                f"{d / INDEX} is not a safetensors index ({_first_line(e)}); re-save the checkpoint "
                "with save_pretrained"
            ) from None
        files = {name: inside(d, str(shard), INDEX) for name, shard in weight_map.items()}
        for name, file in files.items():
            if not file.is_file():
                raise ModelError(f"shard {file} (tensor {name!r} in {d / INDEX}) is missing; copy the whole checkpoint")
        return files
    pickles = sorted(p.name for pattern in PICKLED for p in d.glob(pattern))
    if pickles:
        raise ModelError(
            f"{d} holds only pickled weights ({pickles[0]}) and mechopd never unpickles: convert them "
            f"once where you trust the file, e.g. AutoModelForCausalLM.from_pretrained('{d}')"
            f".save_pretrained('{d}-safetensors'), and pass {d}-safetensors"
        )
    raise ModelError(f"{d} holds no weights (no {WEIGHTS} or {INDEX}); pass a directory written by save_pretrained")


def read_config(path: str | os.PathLike) -> Any:
    """`AutoConfig` of a path or hub id; an unreadable or inconsistent config.json -> `ModelError`."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - transformers raises many types for a bad config.json; all are user input
        raise ModelError(
            f"cannot read the model config at {path} ({type(e).__name__}: {_first_line(e)}); fix "
            "config.json or re-save the checkpoint"
        ) from None


def expected_tensors(config: Any) -> tuple[dict[str, tuple[int, ...]], list[set[str]]]:
    """Shapes of every tensor a model built from `config` holds (built on the meta device: no memory, no init), and
    the groups of names that share one tensor (tied embeddings: storing one name of a group is enough)."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except ValueError as e:
        raise ModelError(
            f"model_type {getattr(config, 'model_type', '?')!r} is not a causal LM: {_first_line(e)}"
        ) from None
    state = model.state_dict(keep_vars=True)
    groups: dict[int, set[str]] = {}
    for name, t in state.items():
        groups.setdefault(id(t), set()).add(name)
    saved = _saved_names(model, list(state))
    shapes = {saved[n]: tuple(t.shape) for n, t in state.items()}
    return shapes, [{saved[n] for n in g} for g in groups.values() if len(g) > 1]


def _saved_names(model: Any, names: list[str]) -> dict[str, str]:
    """State-dict name -> the name `save_pretrained` writes: transformers' own key renamings reversed (GPT-NeoX's
    ``lm_head`` is stored as ``embed_out`` and renamed back on load)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key
    except ImportError:  # an older transformers renames nothing
        return {n: n for n in names}
    renamings: list[Any] = [
        t.reverse_transform() for t in get_model_conversion_mapping(model) if type(t) is WeightRenaming
    ]
    return {n: rename_source_key(n, renamings, [], reverse=True)[0] if renamings else n for n in names}


def check_checkpoint(path: str | os.PathLike, config: Any = None) -> dict[str, Path]:
    """Refuse a local checkpoint whose weights are unreadable or are not the tensors its config.json describes.

    Reads headers only (cheap); values are checked after loading (`check_finite`). Returns tensor name -> file.
    A path that is not a local directory (a hub id) is left to `from_pretrained`.
    """
    d = Path(path)
    if not d.is_dir():
        return {}
    files = weight_files(d)
    config = config if config is not None else read_config(d)
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ModelError(
            f"{d / 'config.json'}: vocab_size={vocab!r} is invalid (the embedding has >= 1 row); restore "
            "the checkpoint's own config.json"
        )
    want, tied = expected_tensors(config)
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(files.values())):
        shapes.update(read_header(file))
    covered = set(shapes) | {n for g in tied if g & set(shapes) for n in g}
    missing, extra = sorted(set(want) - covered), sorted(set(shapes) - set(want))
    where = files[next(iter(files))] if len(set(files.values())) == 1 else d / INDEX
    if missing:
        raise ModelError(
            f"{where} lacks {len(missing)} tensor(s) that {d / 'config.json'} describes (e.g. "
            f"{missing[0]!r}): the config does not belong to these weights (more layers or modules "
            "than were saved); restore the checkpoint's own config.json"
        )
    if extra:
        raise ModelError(
            f"{where} holds {len(extra)} tensor(s) that {d / 'config.json'} does not describe (e.g. "
            f"{extra[0]!r}): the config does not belong to these weights; restore its own config.json"
        )
    for name in sorted(shapes):
        if shapes[name] != want[name]:
            raise ModelError(
                f"tensor {name!r} has shape {list(shapes[name])} in {files[name]} but "
                f"{d / 'config.json'} implies {list(want[name])}; restore the checkpoint's own "
                "config.json"
            )
    check_tied_equal(d, files, tied)
    return files


def check_tied_equal(d: Path, files: dict[str, Path], tied: list[set[str]]) -> None:
    """Names the config ties to one tensor (``tie_word_embeddings``: lm_head = embed_tokens) that the files store
    apart must hold the same values: a different ``lm_head.weight`` would be dropped (untied with a warning) on load."""
    from safetensors import safe_open

    for group in tied:
        stored = sorted(n for n in group if n in files)
        if len(stored) < 2:
            continue
        first = None
        for name in stored:
            with safe_open(str(files[name]), framework="pt") as fh:
                t = fh.get_tensor(name)
            if first is None:
                first = t
            elif not torch.equal(first, t):
                raise ModelError(
                    f"{d / 'config.json'} ties {' and '.join(stored)} (tie_word_embeddings) but the files hold them "
                    "with different values: the model would load with one of them dropped; set tie_word_embeddings: "
                    "false in config.json, or save the checkpoint again"
                )


def inside(d: Path, name: str, where: str) -> Path:
    """``d / name``, refused unless the name stays inside `d` (no absolute path, no ``..``). Judged on the name, not
    on where a link points: a Hugging Face cache snapshot links its files into the cache's blob store."""
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == ".." or norm.startswith(".." + os.sep):
        raise ModelError(
            f"{d / where} names {name!r}, which lies outside {d}; a model directory may only name its "
            "own files: copy the file into it"
        )
    return d / name


TOKENIZER_FILES = ("tokenizer_file", "vocab_file", "merges_file", "chat_template_file")


def check_tokenizer(tokenizer: Any, src: str) -> None:
    """A local model's tokenizer is its own: not empty, no id past the embedding, eos / bos as config.json says."""
    d = Path(src)
    if not d.is_dir():
        return
    cfg_file = d / "tokenizer_config.json"
    if cfg_file.is_file():
        try:
            named = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            named = {}
        for key in TOKENIZER_FILES:
            if isinstance(named, dict) and isinstance(named.get(key), str):
                inside(d, named[key], "tokenizer_config.json")
    n = len(tokenizer)
    if n < 2:
        raise ModelError(
            f"{d} has no tokenizer files (transformers built an empty tokenizer of {n} entry); save the "
            "model's tokenizer next to it with tokenizer.save_pretrained(DIR)"
        )
    config = read_config(d)
    rows = getattr(config, "vocab_size", None)
    if isinstance(rows, int) and n > rows:
        raise ModelError(
            f"the tokenizer in {d} has {n} entries but the model's embedding has {rows} rows: the "
            "tokenizer belongs to another model; restore the model's own tokenizer files"
        )
    for role in ("eos", "bos"):
        want, have = getattr(config, f"{role}_token_id", None), getattr(tokenizer, f"{role}_token_id", None)
        wants = set(want) if isinstance(want, list) else {want}
        if want is not None and have is not None and have not in wants:
            raise ModelError(
                f"the tokenizer in {d} has {role} id {have} but config.json says {want}: the tokenizer "
                "belongs to another model; restore the model's own tokenizer files (or, if this "
                f"tokenizer is right, set {role}_token_id in config.json to {have})"
            )


def check_loading_info(src: str, info: dict[str, Any]) -> None:
    """`from_pretrained(..., output_loading_info=True)`'s report is clean (a second line of defence, e.g. hub ids)."""
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        bad = sorted(str(k) for k in info.get(key) or [])
        if bad:
            raise ModelError(
                f"{src}: loading reported {len(bad)} {key.replace('_', ' ')} (e.g. {bad[0]}); the "
                "weights do not match the config; restore the checkpoint's own files"
            )


def check_finite(model: torch.nn.Module, src: str, files: dict[str, Path] | None = None) -> None:
    """Every floating-point weight of a loaded model is finite, else `ModelError` naming file and tensor (parameters
    only: a buffer such as an attention mask may hold -inf by design)."""
    with torch.no_grad():
        for name, t in model.named_parameters():
            if not t.is_floating_point():
                continue
            chunks = t.reshape(-1).split(1 << 24)  # bounded temporaries on a large embedding
            if not all(bool(torch.isfinite(c).all()) for c in chunks):
                bad = sum(int((~torch.isfinite(c)).sum()) for c in chunks)
                where = (files or {}).get(name, src)
                raise ModelError(
                    f"{where}: tensor {name!r} holds {bad} NaN/inf value(s) of {t.numel()}; the weights "
                    "are corrupted (a diverged run or a damaged copy); use an earlier checkpoint"
                )


def check_saved_finite(files: dict[str, Path]) -> None:
    """`check_finite` on the saved tensors themselves (``files``: `check_checkpoint`'s name -> file), read one at a
    time without building the model: what a command runs before its first file is written (`mechopd run`)."""
    from safetensors import safe_open

    for file in sorted(set(files.values())):
        with safe_open(str(file), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                t = fh.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    raise ModelError(
                        f"{file}: tensor {name!r} holds {int((~torch.isfinite(t)).sum())} NaN/inf value(s) of "
                        f"{t.numel()}; the weights are corrupted (a diverged run or a damaged copy); use an "
                        "earlier checkpoint"
                    )
