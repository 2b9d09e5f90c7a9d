"""Checks that run before a command loads a model or writes a file; each failure is one `MechopdError` line.

- Weights (`check_checkpoint`, before `from_pretrained`; `check_finite`, after it): a local checkpoint directory holds
  safetensors weights that are readable (not empty, not truncated, a valid header), that are exactly the tensors its
  config.json describes (none missing, none extra, every shape as configured), and whose values are all finite.
  Pickled weights (``.bin`` / ``.pt``) are refused with the conversion to run, never unpickled.
- Devices (`resolve_device`): ``cuda`` on a machine without one is an error, not a traceback from ``.to()``.
- Outputs (`check_out_dir`, `check_report_target`, `parse_labels`): ``--out`` is a directory that exists and is
  writable or can be created; a report never overwrites a file it did not write; a user label that becomes a file name
  is a plain name (no path separators, no ``..``, no checkpoint file stems), and labels are unique.
- Vocabulary (`check_task_vocab`): a word-level tokenizer that lacks the task's words would train or be scored on
  ``<unk>`` soup.
- Model directories (`check_checkpoint`, `check_tokenizer`): ``vocab_size`` >= 1; every file the directory names
  (index shards, tokenizer files) lies inside it; the tokenizer is not empty (transformers builds a 1-entry one when
  the files are gone), has no id past the embedding rows, and agrees with config.json on its eos / bos ids (another
  model's tokenizer next to the weights).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from mechopd.core.errors import ConfigError, DataError, ModelError, TaskError

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")  # no separator, no leading dot: '.', '..', '.hidden' refused
# File stems a label must not take: a checkpoint's own files and the compare table (a report is <label>.json/.csv).
RESERVED_LABELS = frozenset({"config", "generation_config", "tokenizer", "tokenizer_config", "special_tokens_map",
                             "chat_template", "model", "organism", "training", "trainer_state", "accuracy", "compare",
                             "con", "prn", "aux", "nul", *(f"{d}{i}" for d in ("com", "lpt") for i in range(10))})


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
        raise ModelError(f"{file} is truncated or not a safetensors file ({_first_line(e)}); copy or re-save the "
                         "checkpoint with save_pretrained") from None


def weight_files(path: str | os.PathLike) -> dict[str, Path]:
    """Tensor name -> file of a local checkpoint dir (``model.safetensors`` or a sharded index). Refuses pickles."""
    d = Path(path)
    if (d / WEIGHTS).is_file():
        return {name: d / WEIGHTS for name in read_header(d / WEIGHTS)}
    if (d / INDEX).is_file():
        try:
            weight_map = dict(json.loads((d / INDEX).read_text())["weight_map"])
        except (ValueError, KeyError, TypeError) as e:
            raise ModelError(f"{d / INDEX} is not a safetensors index ({_first_line(e)}); re-save the checkpoint "
                             "with save_pretrained") from None
        files = {name: inside(d, str(shard), INDEX) for name, shard in weight_map.items()}
        for name, file in files.items():
            if not file.is_file():
                raise ModelError(f"shard {file} (tensor {name!r} in {d / INDEX}) is missing; copy the whole checkpoint")
        return files
    pickles = sorted(p.name for pattern in PICKLED for p in d.glob(pattern))
    if pickles:
        raise ModelError(f"{d} holds only pickled weights ({pickles[0]}) and mechopd never unpickles: convert them "
                         f"once where you trust the file, e.g. AutoModelForCausalLM.from_pretrained('{d}')"
                         f".save_pretrained('{d}-safetensors'), and pass {d}-safetensors")
    raise ModelError(f"{d} holds no weights (no {WEIGHTS} or {INDEX}); pass a directory written by save_pretrained")


def read_config(path: str | os.PathLike) -> Any:
    """`AutoConfig` of a path or hub id; an unreadable or inconsistent config.json -> `ModelError`."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - transformers raises many types for a bad config.json; all are user input
        raise ModelError(f"cannot read the model config at {path} ({type(e).__name__}: {_first_line(e)}); fix "
                         "config.json or re-save the checkpoint") from None


def expected_tensors(config: Any) -> tuple[dict[str, tuple[int, ...]], list[set[str]]]:
    """Shapes of every tensor a model built from `config` holds (built on the meta device: no memory, no init), and
    the groups of names that share one tensor (tied embeddings: storing one name of a group is enough)."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except ValueError as e:
        raise ModelError(f"model_type {getattr(config, 'model_type', '?')!r} is not a causal LM: {_first_line(e)}") \
            from None
    state = model.state_dict(keep_vars=True)
    groups: dict[int, set[str]] = {}
    for name, t in state.items():
        groups.setdefault(id(t), set()).add(name)
    return {n: tuple(t.shape) for n, t in state.items()}, [g for g in groups.values() if len(g) > 1]


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
        raise ModelError(f"{d / 'config.json'}: vocab_size={vocab!r} is invalid (the embedding has >= 1 row); restore "
                         "the checkpoint's own config.json")
    want, tied = expected_tensors(config)
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(files.values())):
        shapes.update(read_header(file))
    covered = set(shapes) | {n for g in tied if g & set(shapes) for n in g}
    missing, extra = sorted(set(want) - covered), sorted(set(shapes) - set(want))
    where = files[next(iter(files))] if len(set(files.values())) == 1 else d / INDEX
    if missing:
        raise ModelError(f"{where} lacks {len(missing)} tensor(s) that {d / 'config.json'} describes (e.g. "
                         f"{missing[0]!r}): the config does not belong to these weights (more layers or modules "
                         "than were saved); restore the checkpoint's own config.json")
    if extra:
        raise ModelError(f"{where} holds {len(extra)} tensor(s) that {d / 'config.json'} does not describe (e.g. "
                         f"{extra[0]!r}): the config does not belong to these weights; restore its own config.json")
    for name in sorted(shapes):
        if shapes[name] != want[name]:
            raise ModelError(f"tensor {name!r} has shape {list(shapes[name])} in {files[name]} but "
                             f"{d / 'config.json'} implies {list(want[name])}; restore the checkpoint's own "
                             "config.json")
    return files


def inside(d: Path, name: str, where: str) -> Path:
    """``d / name``, refused unless the name stays inside `d` (no absolute path, no ``..``). Judged on the name, not
    on where a link points: a Hugging Face cache snapshot links its files into the cache's blob store."""
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm == ".." or norm.startswith(".." + os.sep):
        raise ModelError(f"{d / where} names {name!r}, which lies outside {d}; a model directory may only name its "
                         "own files: copy the file into it")
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
        raise ModelError(f"{d} has no tokenizer files (transformers built an empty tokenizer of {n} entry); save the "
                         "model's tokenizer next to it with tokenizer.save_pretrained(DIR)")
    config = read_config(d)
    rows = getattr(config, "vocab_size", None)
    if isinstance(rows, int) and n > rows:
        raise ModelError(f"the tokenizer in {d} has {n} entries but the model's embedding has {rows} rows: the "
                         "tokenizer belongs to another model; restore the model's own tokenizer files")
    for role in ("eos", "bos"):
        want, have = getattr(config, f"{role}_token_id", None), getattr(tokenizer, f"{role}_token_id", None)
        wants = set(want) if isinstance(want, list) else {want}
        if want is not None and have is not None and have not in wants:
            raise ModelError(f"the tokenizer in {d} has {role} id {have} but config.json says {want}: the tokenizer "
                             "belongs to another model; restore the model's own tokenizer files (or, if this "
                             f"tokenizer is right, set {role}_token_id in config.json to {have})")


def check_loading_info(src: str, info: dict[str, Any]) -> None:
    """`from_pretrained(..., output_loading_info=True)`'s report is clean (a second line of defence, e.g. hub ids)."""
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        bad = sorted(str(k) for k in info.get(key) or [])
        if bad:
            raise ModelError(f"{src}: loading reported {len(bad)} {key.replace('_', ' ')} (e.g. {bad[0]}); the "
                             "weights do not match the config; restore the checkpoint's own files")


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
                raise ModelError(f"{where}: tensor {name!r} holds {bad} NaN/inf value(s) of {t.numel()}; the weights "
                                 "are corrupted (a diverged run or a damaged copy); use an earlier checkpoint")


# --------------------------------------------------------------------------------------------------------- devices
def resolve_device(spec: str | torch.device | None) -> torch.device:
    """``auto`` / None -> cuda when available, else cpu; a named device must exist on this machine."""
    if spec is None or spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"device={spec!r} is not a device name; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={spec} but this machine has no usable CUDA device (torch.cuda.is_available() "
                              "is False); use device=cpu or device=auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device={spec} but this machine has {torch.cuda.device_count()} CUDA device(s); use "
                              f"cuda:0..cuda:{torch.cuda.device_count() - 1}")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device={spec} but MPS is not available on this machine; use device=cpu or device=auto")
    return dev


# --------------------------------------------------------------------------------------------------------- outputs
def check_out_dir(path: str | os.PathLike, flag: str = "--out", shown: str | os.PathLike | None = None) -> Path:
    """`path` is a writable directory or can be created (nothing is created here). `shown`: the path the user
    passed, named in the error (the report path whose directory `path` is)."""
    p = Path(path)
    shown = Path(shown) if shown is not None else p
    if p.exists() and not p.is_dir():
        if shown != p:
            raise ConfigError(f"{flag} {shown} cannot be created: {p} is a file; pass a path under a directory")
        raise ConfigError(f"{flag} {p} is a file, not a directory; pass a directory (it is created if missing)")
    anc = p
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise ConfigError(f"{flag} {shown} cannot be created: {anc} is a file; pass a path under a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {shown} is not writable ({anc} is read-only for this user); pass a directory you "
                          "can write to")
    return p


def umask_mode(directory: bool) -> int:
    """The mode a plain ``open`` / ``mkdir`` would give under this process's umask (temp files get 0600 / 0700:
    a finished checkpoint or artifact renamed from one must not stay private to its writer)."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def _is_report(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"summary", "records", "settings"} <= set(data)


def check_report_target(json_path: str | os.PathLike, flag: str = "--out") -> Path:
    """An evaluation report `X.json` (+ its records `X.csv`) may replace only an earlier report, never other files."""
    p = Path(json_path)
    check_out_dir(p.parent, flag, shown=p)
    if p.is_dir():
        raise ConfigError(f"{flag}: {p} is a directory; pass a report path ending in .json")
    csv_path = p.with_suffix(".csv")
    if csv_path.is_symlink() or (csv_path.exists() and not csv_path.is_file()):
        raise ConfigError(f"{flag}: {csv_path}, where the records CSV goes, is a directory or a link; move it away or "
                          "choose another --out")
    if p.exists() and not _is_report(p):
        raise ConfigError(f"{flag}: {p} exists and is not an evaluation report; it would be overwritten; choose "
                          "another --out")
    if p.with_suffix(".csv").exists() and not p.exists():
        raise ConfigError(f"{flag}: {p.with_suffix('.csv')} exists and would be overwritten by the records CSV; "
                          "choose another --out")
    return p


def check_label(label: str, flag: str) -> str:
    """A user label that becomes a file name: a plain name, not a checkpoint file stem."""
    if not LABEL.match(label):
        raise ConfigError(f"{flag} label {label!r} is not a plain name; use letters, digits, '_', '-', '.' (not "
                          "starting with '.' or '-'), e.g. opd")
    if label.lower() in RESERVED_LABELS:
        raise ConfigError(f"{flag} label {label!r} is reserved (a checkpoint or report file has that name); pick "
                          "another label, e.g. opd")
    return label


def parse_labels(pairs: Iterable[str] | None, flag: str, example: str = "base=runs/organisms/rules") -> dict[str, str]:
    """``["base=DIR", "opd=DIR"]`` -> {label: DIR} in order; malformed items, bad labels and duplicates refused."""
    out: dict[str, str] = {}
    for item in pairs or []:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            raise ConfigError(f"{flag} {item!r} is not NAME=DIR; e.g. {flag} {example}")
        check_label(label, flag)
        dup = next((k for k in out if k.lower() == label.lower()), None)
        if dup is not None:
            raise ConfigError(f"{flag} names {label!r} twice ({dup}={out[dup]} and {item}); give each model its own "
                              "label")
        out[label] = path
    return out


# ------------------------------------------------------------------------------------------------------ vocabulary
def check_task_vocab(tokenizer: Any, task: Any) -> None:
    """A task whose words the tokenizer cannot represent would be trained or scored on <unk> soup: refuse it."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not hasattr(task, "vocab"):
        return
    words = task.vocab()
    ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
    if unk in ids:
        bad = [w for w in words if unk in tokenizer(w, add_special_tokens=False)["input_ids"]][:8]
        raise TaskError(f"the model's tokenizer lacks tokens of task {task.name!r} (e.g. {bad}); use a model whose "
                        "vocabulary covers the task (an organism pretrained with this task's words)")


def check_response_ids(responses: Iterable[Iterable[int]], tokenizer: Any, where: str) -> None:
    """Response ids a probe scores are ids of the tokenizer: 0 <= id < len(tokenizer) (a padding row past the
    tokenizer is no token; an id past the embedding would crash the model or read another row)."""
    n = len(tokenizer)
    for i, ids in enumerate(responses):
        bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n), None)
        if bad is not None:
            raise DataError(f"{where}: response {i + 1} holds token id {bad!r}, outside the tokenizer's 0..{n - 1}; "
                            "rebuild the responses with this model's tokenizer")


# -------------------------------------------------------------------------------------------------- study files
DISPLAY_PUNCT = set(" -_.,:;=+()/%'*~^#@?!")  # besides letters and digits (any script: ρ, β)


def check_display_label(label: object, where: str) -> str | None:
    """A run's display label (the report's Markdown, the figures' legends) in a safe character set: letters and
    digits of any script, spaces and ``-_.,:;=+()/%'*~^#@?!``; at most 80 characters. No newline, no Markdown table bar
    or code tick, no ``<``/``>`` (raw HTML), no brackets (links). None passes (no label given)."""
    if label is None:
        return None
    text = str(label)
    bad = next((ch for ch in text if not (ch.isalnum() or ch in DISPLAY_PUNCT)), None)
    if bad is not None or not text.strip() or len(text) > 80:
        what = f"contains {bad!r}" if bad is not None else ("is empty" if not text.strip() else "is over 80 characters")
        raise ConfigError(f"{where} {text[:40]!r} {what}; a label is at most 80 letters, digits, spaces and "
                          f"{''.join(sorted(DISPLAY_PUNCT - {' '}))}")
    return text


def inside_root(folder: Path, given: object, where: str) -> Path:
    """A study file's ``root:`` (relative to its `folder`): refused when it leads outside `folder` (the figures and
    report.md it writes go there); `folder` itself when none is given."""
    if not given:
        return folder
    root = folder / str(given)
    if root.resolve() != folder.resolve() and folder.resolve() not in root.resolve().parents:
        raise ConfigError(f"{where}: root {str(given)!r} leads outside the study file's folder {folder}, and mechopd "
                          "writes figures and report.md into the root; move the study file into that run directory, "
                          f"or name the run on the command line: mechopd figures {root} --study {where}")
    return root
