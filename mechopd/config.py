"""Configs as dataclasses: YAML keys, CLI flags (``--set key=value``) and field names are the same words.

Defaults are the papers' (docs/method.md): lr 5e-6, β = 0.5, ρ = 0.10, K = 16, top-k 256, one rollout per prompt.
Organism recipes in ``training/`` override what a tiny model needs (higher lr, fewer steps).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mechopd.errors import ConfigError

SHARDINGS = ("none", "fsdp")  # train.sharding implements them

METHOD_ALIASES = {
    # shorthand methods that name a selector: "ta_opd" = OPD with the teachability selector (docs/method.md §3)
    "ta_opd": ("opd", "ta_opd"),
    "ta_opd_ent": ("opd", "ta_opd_ent"),
}


@dataclass
class TrainConfig:
    """One training run.

    Task:      task (rules | frozenlake | sokoban | jsonl | a registered name), task_options (passed to the factory).
    Models:    student (checkpoint dir, hub id, or ``organism:<task>`` = pretrain/reuse the embedded organism),
               teacher (None = the frozen initial student, i.e. self-distillation; else a checkpoint: cross-model).
    Method:    method (opd | nca | dual_opd | sym_kl; shorthand ta_opd / ta_opd_ent = opd + that selector),
               beta (NCA / SymKL weight), selector (full | random | entropy | divergence | tip | compat | ta_opd |
               ta_opd_ent), budget (ρ), k (TA-OPD top-K), c_mode, d_mode, nca_positions ("all": the NCA term covers
               every response token, "selected": only the selector's kept tokens).
    Estimator: estimator (topk | full | sampled), topk (k for the student-top-k reverse KL), renormalize, tail.
    Rollouts:  temperature (None = the task's: 1.0 QA, 0.7 games), max_new_tokens (None = the task's), rollout_decoder
               (lean: `generate.lean`, Llama/Qwen2/Qwen3; hf: ``model(...)`` per decode step, any causal LM), batch_size
               (prompts or games per optimizer step, global across processes), pool_size (training items the run cycles through in
               seeded epochs; independent of `steps`, so a resumed run sees the same data).
    Optim:     lr, steps, warmup, weight_decay, grad_clip, seed.
    Logging:   eval_every, eval_n (held-out items per periodic evaluation; 0 = off), save_every, log_tensorboard.
    Rendering: no_context_system, chat_template_kwargs (see views.RenderSpec).
    Scale-out: sharding (none: every process holds full student and teacher, gradients all-reduced; fsdp: PyTorch
               FSDP2, student and frozen teacher sharded per decoder layer over all processes, full weights
               gathered only while generating). Same update either way; one process has nothing to shard.
    Sharing:   shared_prefix (auto: a context-view token prefix common to every row is computed once per batch at
               batch size 1, exact, logged per step as ``shared_prefix`` = tokens shared; off: every row in full).
    Hardware:  dtype (float32 | bfloat16 | float16), device (auto | cpu | cuda | ...), organism_dir.
    """

    task: str = "rules"
    task_options: dict[str, Any] = field(default_factory=dict)
    student: str = "organism:rules"
    teacher: str | None = None
    method: str = "opd"
    beta: float = 0.5
    selector: str = "full"
    budget: float = 0.10
    k: int = 16
    c_mode: str = "exact"
    d_mode: str = "union"
    nca_positions: str = "all"
    estimator: str = "topk"
    topk: int = 256
    renormalize: bool = False
    tail: bool = False
    temperature: float | None = None
    max_new_tokens: int | None = None
    batch_size: int = 128
    pool_size: int = 2048
    lr: float = 5e-6
    steps: int = 100
    warmup: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 0
    eval_n: int = 200
    save_every: int = 0
    log_tensorboard: bool = False
    no_context_system: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    device: str = "auto"
    organism_dir: str = "runs/organisms"
    sharding: str = "none"
    rollout_decoder: str = "lean"
    shared_prefix: str = "auto"

    def __post_init__(self) -> None:
        if self.method in METHOD_ALIASES:
            self.method, sel = METHOD_ALIASES[self.method]
            if self.selector == "full":
                self.selector = sel
        from mechopd.objectives.losses import ESTIMATORS, METHODS
        from mechopd.objectives.select import C_MODES, D_MODES, SELECTORS
        from mechopd.generate.lean import DECODERS
        from mechopd.generate.prefix import MODES as PREFIX_MODES

        _choice("method", self.method, METHODS + tuple(METHOD_ALIASES))
        _choice("selector", self.selector, SELECTORS)
        _choice("estimator", self.estimator, ESTIMATORS)
        _choice("c_mode", self.c_mode, C_MODES)
        _choice("d_mode", self.d_mode, D_MODES)
        _choice("nca_positions", self.nca_positions, ("all", "selected"))
        _choice("dtype", self.dtype, ("float32", "bfloat16", "float16"))
        _choice("sharding", self.sharding, SHARDINGS)
        _choice("rollout_decoder", self.rollout_decoder, DECODERS)
        if isinstance(self.shared_prefix, bool):  # YAML 1.1 reads a bare `off` / `on` as a boolean
            self.shared_prefix = "auto" if self.shared_prefix else "off"
        _choice("shared_prefix", self.shared_prefix, PREFIX_MODES)
        if not (isinstance(self.beta, (int, float)) and self.beta >= 0 and math.isfinite(self.beta)):
            raise ConfigError(f"beta={self.beta} is invalid: the NCA weight must be a finite number >= 0 (default 0.5)")
        if not (isinstance(self.budget, (int, float)) and 0 < self.budget <= 1):
            raise ConfigError(f"budget={self.budget} is invalid: the token budget ρ must be in (0, 1] (default 0.10)")
        if not (isinstance(self.k, int) and self.k >= 1):
            raise ConfigError(f"k={self.k} is invalid: the TA-OPD top-K must be an integer >= 1 (default 16)")
        for name in ("batch_size", "steps", "topk", "pool_size"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid: must be an integer >= 1")
        if not self.lr > 0:
            raise ConfigError(f"lr={self.lr} is invalid: must be > 0")
        if self.temperature is not None and not self.temperature > 0:
            raise ConfigError(f"temperature={self.temperature} is invalid: must be > 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is unknown; choose one of {', '.join(allowed)}")


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["lr=1e-4", "task_options.rule=shift:2"]`` -> a nested dict; values parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set {pair!r} is not key=value; e.g. --set lr=1e-4")
        key, value = pair.split("=", 1)
        try:
            parsed = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            parsed = value
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = parsed
    return out


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _coerce(name: str, value: Any, hint: Any, source: str) -> Any:
    """YAML reads ``1e-3`` as a string and CLI values arrive as strings: convert to the field's declared type."""
    text = str(hint)
    if value is None:
        if "None" in text:
            return None
        raise ConfigError(f"{source}: {name} must not be null")
    try:
        if hint is float or text.startswith("float"):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if hint is int or text.startswith("int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if hint is bool or text.startswith("bool"):
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            if not isinstance(value, bool):
                raise ValueError
            return value
        if text.startswith("dict") and not isinstance(value, dict):
            raise ValueError
    except (TypeError, ValueError):
        kind = getattr(hint, "__name__", text.split(" |")[0])
        raise ConfigError(f"{source}: {name}={value!r} is not a valid {kind}") from None
    return value


def build_config(cls: type, data: dict[str, Any], source: str = "config") -> Any:
    """Instantiate a config dataclass, naming unknown keys and the known ones; values coerced to the field types."""
    import typing

    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(k, v, hints[k], source) for k, v in data.items()})


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist; pass a YAML file (see training/*.yaml)")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a YAML mapping of config keys, got {type(data).__name__}")
    return data


def load_train_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    data = load_yaml(path) if path else {}
    data = merge(data, overrides or {})
    return build_config(TrainConfig, data, source=str(path or "train config"))


def dump_yaml(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
