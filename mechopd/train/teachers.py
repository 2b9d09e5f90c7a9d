"""The student and its teacher, for a full or a LoRA student and each ``teacher_mode`` (config fields: docs/scaling.md).

    mode     full student                                   LoRA student (`mechopd.models.lora`)
    frozen   the initial student, loaded once more          the student's base weights, SHARED (no copy): the
             (or the cross-model teacher)                   student with its adapter off (or the cross-model teacher)
    live     the student itself, scored without grad        the student itself (base + current adapter), no grad
    ema      a copy, θ_T ← d · θ_T + (1 − d) · θ after      the shared base + its own adapter, A_T, B_T ← EMA of
             every optimizer step (d = ema_decay)           the student's A, B after every step (a few MB)

EMA averages the parameters the optimizer moves (all of them, or the adapter's A and B); with a LoRA teacher that is an
average of A and B, so ΔW_T = B_T A_T is not the average of the student's ΔW (the adapter-space average, as PEFT-based
SDFT recipes keep it). A live or EMA teacher changes every step, so its context prefix is not cached across steps
(the trainer's `PrefixStore` is for a frozen teacher only). Checkpoints of an EMA run hold the teacher's averaged
tensors (``teacher_ema.safetensors``) so that a resumed run continues the same average.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechopd.config import LoraOptions, TrainConfig
from mechopd.core.errors import TrainingError
from mechopd.models import load_model, lora

EMA_FILE = "teacher_ema.safetensors"


def lora_options(cfg: TrainConfig) -> LoraOptions | None:
    """The config's LoRA section (a `TrainConfig` is one), or None for a full student."""
    return cfg if cfg.uses_lora else None


@dataclass
class Models:
    """What the trainer holds: ``student`` (trainable), ``teacher`` (no grad; IS the student when live), the LoRA
    options (None: full student), the EMA pairs (teacher tensor, student tensor) and the student's path."""

    student: nn.Module
    teacher: nn.Module
    lora: LoraOptions | None
    ema: list[tuple[str, torch.Tensor, torch.Tensor]] | None
    decay: float
    base_path: str

    @property
    def frozen_teacher(self) -> bool:
        """The teacher never changes (its context prefix may be cached across steps)."""
        return self.ema is None and self.teacher is not self.student

    def share(self) -> tuple[int, int]:
        """(trainable parameters, all parameters) of the student."""
        return lora.trainable_share(self.student)

    def share_line(self) -> tuple[float, str]:
        """The trainable share of the student's parameters and the line the trainer prints."""
        n_train, n_all = self.share()
        share = n_train / max(1, n_all)
        return share, f"trainable parameters: {n_train:,} of {n_all:,} ({100 * share:.2f} %)"

    def param_name(self, name: str) -> str:
        """A trainable parameter's name for per-layer / per-module statistics (an adapter's: its projection's)."""
        return lora.site_name(name) if self.lora else name

    @torch.no_grad()
    def after_step(self) -> None:
        """The EMA teacher follows the student (nothing for frozen / live teachers)."""
        if self.ema:
            torch._foreach_lerp_([t for _, t, _ in self.ema], [s for _, _, s in self.ema], 1.0 - self.decay)

    def ema_state(self) -> dict[str, torch.Tensor]:
        return {n: t.detach().cpu().contiguous() for n, t, _ in self.ema or []}

    def savable(self, model: nn.Module | None, checkpoint: bool) -> Any:
        """What `models.atomic_save` writes for `model` (None on ranks > 0 stays None): the model itself (full,
        frozen / live), or a writer of the merged weights + ``adapter/`` (LoRA) and, in a checkpoint of an EMA run,
        the teacher's averaged tensors."""
        if model is None or (self.lora is None and not (checkpoint and self.ema)):
            return model
        return _Writer(self, model, checkpoint)


class _Writer:
    """Duck-types ``save_pretrained`` for `models.atomic_save` / `checkpoint.save_checkpoint`."""

    def __init__(self, models: Models, model: Any, checkpoint: bool):  # model: a transformers model
        self.models, self.model, self.checkpoint = models, model, checkpoint

    def save_pretrained(self, path: str | Path, safe_serialization: bool = True) -> None:
        from safetensors.torch import save_file

        m, path = self.models, Path(path)
        if m.lora is None:
            self.model.save_pretrained(path, safe_serialization=True)
        else:
            self.model.save_pretrained(path, state_dict=lora.merged_state(self.model), safe_serialization=True)
            lora.save_adapter(self.model, m.lora, path / lora.ADAPTER_DIR, m.base_path)
        if self.checkpoint and m.ema:
            save_file(m.ema_state(), str(path / EMA_FILE))


def build(
    cfg: TrainConfig,
    student_path: str,
    teacher_path: str,
    resume_from: Path | None,
    dtype: torch.dtype,
    shard: Any,
    device: torch.device,
) -> Models:
    """Load the student (a resume's weights: its checkpoint, or the base + its adapter) and make the teacher."""
    opts = lora_options(cfg)
    student = load_model(resume_from if resume_from is not None and opts is None else student_path, dtype=dtype)
    mode, teacher = cfg.teacher_mode, None
    if cfg.teacher is not None or (opts is None and mode == "frozen"):
        teacher = load_model(teacher_path, dtype=dtype)  # cross-model, or the initial student
    elif opts is not None and mode != "live":
        teacher = lora.shared_base(student)  # the student's own W0, before its adapter goes in
    elif opts is None and mode == "ema":
        teacher = load_model(student_path, dtype=dtype)
    if opts is not None:
        lora.add_adapter(student, opts)
        if resume_from is not None:
            lora.load_adapter_state(student, _read(resume_from / lora.ADAPTER_DIR / lora.ADAPTER_WEIGHTS), resume_from)
        if mode == "ema":
            assert teacher is not None  # loaded above for every mode but "live"
            lora.add_adapter(teacher, opts)
            _copy_trainable(student, teacher)
    student = shard.wrap(student.train(), device)
    if mode == "live":
        teacher = student
    else:
        assert teacher is not None  # loaded above for every mode but "live"
        teacher = shard.wrap(teacher.eval().requires_grad_(False), device)
    ema = _ema_pairs(student, teacher) if mode == "ema" else None
    models = Models(student, teacher, opts, ema, cfg.ema_decay, str(student_path))
    if ema is not None and resume_from is not None:
        saved = _read(resume_from / EMA_FILE)
        with torch.no_grad():
            for n, t, _ in ema:
                if n not in saved:
                    raise TrainingError(
                        f"{resume_from / EMA_FILE} lacks {n}: checkpoint {resume_from} is damaged; "
                        "delete it to resume from the previous one"
                    )
                t.copy_(saved[n])
    return models


def _copy_trainable(src: nn.Module, dst: nn.Module) -> None:
    dst_params = dict(dst.named_parameters())
    with torch.no_grad():
        for n, p in src.named_parameters():
            if p.requires_grad:
                dst_params[n].copy_(p)


def _ema_pairs(student: nn.Module, teacher: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, teacher tensor, student tensor) for every parameter the optimizer moves."""
    t = dict(teacher.named_parameters())
    return [(n, t[n].data, p.data) for n, p in student.named_parameters() if p.requires_grad]


def _read(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (OSError, ValueError, RuntimeError) as e:
        raise TrainingError(
            f"{path} is missing or unreadable ({type(e).__name__}): checkpoint {path.parent} is "
            "damaged; delete it to resume from the previous one"
        ) from None
