"""Checks that run before a command loads a model or writes a file; each failure is one `MechopdError` line.

- Weights and model directories: `mechopd.core.model_checks`.
- Devices (`resolve_device`): ``cuda`` on a machine without one is an error, not a traceback from ``.to()``.
- Outputs (`check_out_dir`, `check_report_target`, `parse_labels`): ``--out`` is a directory that exists and is
  writable or can be created; a report never overwrites a file it did not write; a user label that becomes a file name
  is a plain name (no path separators, no ``..``, no checkpoint file stems), and labels are unique.
- Vocabulary (`check_task_vocab`): a word-level tokenizer that lacks the task's words would train or be scored on
  ``<unk>`` soup.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from mechopd.core.errors import ConfigError, DataError, TaskError

LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")  # no separator, no leading dot: '.', '..', '.hidden' refused
# File stems a label must not take: a checkpoint's own files and the compare table (a report is <label>.json/.csv).
RESERVED_LABELS = frozenset(
    {
        "config",
        "generation_config",
        "tokenizer",
        "tokenizer_config",
        "special_tokens_map",
        "chat_template",
        "model",
        "organism",
        "training",
        "trainer_state",
        "accuracy",
        "compare",
        "con",
        "prn",
        "aux",
        "nul",
        *(f"{d}{i}" for d in ("com", "lpt") for i in range(10)),
    }
)


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
            raise ConfigError(
                f"device={spec} but this machine has no usable CUDA device (torch.cuda.is_available() "
                "is False); use device=cpu or device=auto"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device={spec} but this machine has {torch.cuda.device_count()} CUDA device(s); use "
                f"cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
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
        raise ConfigError(
            f"{flag} {shown} is not writable ({anc} is read-only for this user); pass a directory you can write to"
        )
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
        raise ConfigError(
            f"{flag}: {csv_path}, where the records CSV goes, is a directory or a link; move it away or "
            "choose another --out"
        )
    if p.exists() and not _is_report(p):
        raise ConfigError(
            f"{flag}: {p} exists and is not an evaluation report; it would be overwritten; choose another --out"
        )
    if p.with_suffix(".csv").exists() and not p.exists():
        raise ConfigError(
            f"{flag}: {p.with_suffix('.csv')} exists and would be overwritten by the records CSV; choose another --out"
        )
    return p


def check_label(label: str, flag: str) -> str:
    """A user label that becomes a file name: a plain name, not a checkpoint file stem."""
    if not LABEL.match(label):
        raise ConfigError(
            f"{flag} label {label!r} is not a plain name; use letters, digits, '_', '-', '.' (not "
            "starting with '.' or '-'), e.g. opd"
        )
    if label.lower() in RESERVED_LABELS:
        raise ConfigError(
            f"{flag} label {label!r} is reserved (a checkpoint or report file has that name); pick "
            "another label, e.g. opd"
        )
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
            raise ConfigError(
                f"{flag} names {label!r} twice ({dup}={out[dup]} and {item}); give each model its own label"
            )
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
        raise TaskError(
            f"the model's tokenizer lacks tokens of task {task.name!r} (e.g. {bad}); use a model whose "
            "vocabulary covers the task (an organism pretrained with this task's words)"
        )


def check_response_ids(responses: Iterable[Iterable[int]], tokenizer: Any, where: str) -> None:
    """Response ids a probe scores are ids of the tokenizer: 0 <= id < len(tokenizer) (a padding row past the
    tokenizer is no token; an id past the embedding would crash the model or read another row)."""
    n = len(tokenizer)
    for i, ids in enumerate(responses):
        bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n), None)
        if bad is not None:
            raise DataError(
                f"{where}: response {i + 1} holds token id {bad!r}, outside the tokenizer's 0..{n - 1}; "
                "rebuild the responses with this model's tokenizer"
            )


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
        raise ConfigError(
            f"{where} {text[:40]!r} {what}; a label is at most 80 letters, digits, spaces and "
            f"{''.join(sorted(DISPLAY_PUNCT - {' '}))}"
        )
    return text


def inside_root(folder: Path, given: object, where: str) -> Path:
    """A study file's ``root:`` (relative to its `folder`): refused when it leads outside `folder` (the figures and
    report.md it writes go there); `folder` itself when none is given."""
    if not given:
        return folder
    root = folder / str(given)
    if root.resolve() != folder.resolve() and folder.resolve() not in root.resolve().parents:
        raise ConfigError(
            f"{where}: root {str(given)!r} leads outside the study file's folder {folder}, and mechopd "
            "writes figures and report.md into the root; move the study file into that run directory, "
            f"or name the run on the command line: mechopd figures {root} --study {where}"
        )
    return root
