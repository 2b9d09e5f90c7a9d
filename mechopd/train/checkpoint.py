"""Checkpoints: HF ``save_pretrained`` (safetensors) + ``trainer_state.json`` + ``optimizer.safetensors``.

No pickle anywhere: the optimizer's tensors go to safetensors (keys ``{param_index}.{state_name}``), its scalars, the
scheduler, the step, the data position and the Python RNG state to JSON, torch RNG states to safetensors as uint8.
The weights and the optimizer state are always FULL (a sharded run gathers them to rank 0 first), so a checkpoint is
loadable by ``from_pretrained`` and resumable under either ``sharding`` layout. Each checkpoint is written to a temp
dir and renamed into place (`models.atomic_save`), so a killed run never leaves a half checkpoint; the latest
complete one is what ``--resume`` loads. Only the latest checkpoint keeps what a resume needs: once a newer one is
complete, an older one is pruned to a model (`prune_older`: its optimizer, RNG and EMA files go, ``WEIGHTS_ONLY``
marks it), a third of its size, still loadable by ``from_pretrained`` and by the probes.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from mechopd.core.errors import TrainingError
from mechopd.models import atomic_save

STATE = "trainer_state.json"
OPTIM = "optimizer.safetensors"
WEIGHTS_ONLY = "WEIGHTS_ONLY"  # a pruned checkpoint: a model, not a resume point
RESUME_FILES = (OPTIM, "rng.safetensors", "teacher_ema.safetensors")  # what pruning removes (teachers.EMA_FILE)


def _optimizer_tensors(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{k}"] = v
    return tensors, {"scalars": scalars, "param_groups": sd["param_groups"]}


def save_checkpoint(
    out: Path, model: Any, tokenizer: Any, optim_state: dict[str, Any], sched: Any, state: dict[str, Any]
) -> Path:
    """Write ``out`` atomically: weights, tokenizer, trainer_state.json (incl. `state`), optimizer.safetensors.

    optim_state: the optimizer's full state in ``opt.state_dict()`` layout (state keyed by parameter index; a sharded
    run gathers it first, see `sharding`).
    """
    tensors, optim_meta = _optimizer_tensors(optim_state)
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["torch_cuda"] = torch.cuda.get_rng_state()
    full_state = dict(state, optimizer=optim_meta, scheduler=sched.state_dict(), python_rng=_py_rng())
    model_to_save = getattr(model, "module", model)  # DDP-wrapped

    def extra_files(tmp: Path) -> None:
        save_file(tensors, str(tmp / OPTIM))
        save_file({f"rng.{k}": v for k, v in rng.items()}, str(tmp / "rng.safetensors"))

    try:
        return atomic_save(
            model_to_save,
            tokenizer,
            out,
            extra={STATE: json.dumps(full_state, indent=1, default=str)},
            writer=extra_files,
        )
    except OSError as e:  # disk full, quota, permissions: the temp dir is gone, older checkpoints untouched
        raise TrainingError(
            f"writing checkpoint {out} failed: {e.strerror or e}; the older checkpoints are kept — "
            "free disk space, then --resume"
        ) from None


def _py_rng() -> list:
    v, internal, gauss = random.getstate()
    return [v, list(internal), gauss]


def read_optimizer_state(ckpt: Path, tensors: bool = True) -> dict[str, Any]:
    """The optimizer state saved in `ckpt`, in ``opt.state_dict()`` layout (full tensors, on CPU).

    ``tensors=False``: the param groups only (hyperparameters; "state" empty), without reading the tensor file.
    """
    meta = read_state(ckpt)["optimizer"]
    if not tensors:
        return {"state": {}, "param_groups": meta["param_groups"]}
    per: dict[int, dict[str, Any]] = {}
    for key, v in _load_tensors(ckpt / OPTIM).items():
        pid, name = key.split(".", 1)
        per.setdefault(int(pid), {})[name] = v
    for key, v in meta["scalars"].items():
        pid, name = key.split(".", 1)
        per.setdefault(int(pid), {})[name] = v
    return {"state": per, "param_groups": meta["param_groups"]}


def _damaged(path: Path, why: str) -> TrainingError:
    ckpt = path.parent
    return TrainingError(
        f"{path} {why}: checkpoint {ckpt} is damaged; delete {ckpt} to resume from the previous "
        "checkpoint (or start a new --out)"
    )


def read_state(ckpt: Path) -> dict[str, Any]:
    """trainer_state.json with the keys a resume reads; a missing, garbled or incomplete file is one TrainingError."""
    try:
        state = json.loads((ckpt / STATE).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise _damaged(ckpt / STATE, f"is unreadable ({type(e).__name__})") from None
    need = ("step", "position", "scheduler", "python_rng", "optimizer")
    if (
        not isinstance(state, dict)
        or any(k not in state for k in need)
        or not isinstance(state["optimizer"], dict)
        or not {"scalars", "param_groups"} <= set(state["optimizer"])
    ):
        raise _damaged(ckpt / STATE, f"lacks the resume state ({', '.join(need)})")
    return state


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:

    if not path.is_file():
        raise _damaged(path, "is missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise _damaged(
            path, f"is truncated or not safetensors ({str(e).splitlines()[0][:80] if str(e) else ''})"
        ) from None


def load_checkpoint(ckpt: Path, opt: torch.optim.Optimizer | None, sched: Any) -> dict[str, Any]:
    """Restore optimizer (unless `opt` is None: a sharded run restores it itself), scheduler and RNG states.

    Weights are loaded by the caller.
    """
    state = read_state(ckpt)
    rng = _load_tensors(ckpt / "rng.safetensors")  # every file is read before any state is restored
    if "rng.torch_cpu" not in rng:
        raise _damaged(ckpt / "rng.safetensors", "lacks rng.torch_cpu")
    optim = read_optimizer_state(ckpt) if opt is not None else None
    try:
        if opt is not None:
            assert optim is not None  # read above whenever opt is given
            opt.load_state_dict(optim)
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(rng["rng.torch_cpu"])
        if "rng.torch_cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["rng.torch_cuda"])
        v, internal, gauss = state["python_rng"]
        random.setstate((v, tuple(internal), gauss))
    except (TypeError, ValueError, KeyError, RuntimeError) as e:
        raise _damaged(ckpt / STATE, f"does not fit this run ({type(e).__name__}: {str(e)[:80]})") from None
    return state


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The highest complete ``checkpoints/step-N`` (temp dirs are dot-prefixed and ignored)."""
    root = run_dir / "checkpoints"
    if not root.exists():
        return None
    steps = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := re.fullmatch(r"step-(\d+)", p.name)) and (p / STATE).exists() and not (p / WEIGHTS_ONLY).exists()
    ]
    return max(steps)[1] if steps else None


def prune_older(latest: Path) -> list[Path]:
    """Prune every complete checkpoint beside `latest` (in ``checkpoints/``) to its model: the resume state goes
    (optimizer, RNG, EMA), ``WEIGHTS_ONLY`` is written first. Returns the pruned checkpoints."""
    pruned = []
    for p in latest.parent.iterdir():
        if p == latest or p.is_symlink() or not re.fullmatch(r"step-\d+", p.name) or (p / WEIGHTS_ONLY).exists():
            continue
        if not (p / STATE).is_file():
            continue
        (p / WEIGHTS_ONLY).write_text(f"a model only: its resume state was removed once {latest.name} was complete\n")
        for name in RESUME_FILES:
            (p / name).unlink(missing_ok=True)
        pruned.append(p)
    return pruned
