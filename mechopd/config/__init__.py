"""Configs as dataclasses: YAML keys, CLI flags (``--NAME``, ``--set NAME=VALUE``) and field names are the same words.

`TrainConfig` is built from sections (run, the loss terms' options, the selector's, rollout, optim, log, render, scale,
LoRA, teacher); its fields stay flat (``cfg.beta``, YAML ``beta:``, ``--beta``, ``--set beta=``). Every field is
declared once, with `mechopd.core.options.option`: its default, help, range and choices; the binder (`mechopd.core.options.bind`)
reads YAML / ``--set`` / flags into it, and the CLI flags and docs/config.md are generated from it. A loss term or
selector registers its options section (`losses.register_term(..., options=)`, `select.register_selector(...,
options=)`); a plug-in's sections are bound the same way (`mechopd.core.options.register_options`), their keys kept in
``TrainConfig.plugins`` and read as attributes. Defaults are the papers' (docs/method.md). A student
``organism:<task>`` starts from that organism's recipe instead, key by key, unless the key is set explicitly: the
caller applies it (`mechopd.organisms.recipes.load_train_config` / `resolve_train_data`; config imports nothing above
itself). Every value is validated once, here, in ``TrainConfig.__post_init__``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mechopd.config.sections import (
    FUSED_TERMS,
    VLLM_OPTIONS,
    LogOptions,
    LoraOptions,
    OptimOptions,
    RenderOptions,
    RolloutOptions,
    RunOptions,
    ScaleOptions,
    TeacherOptions,
)
from mechopd.config.terms import EstimatorOptions, FollowOptions, NCAOptions, SelectionOptions, SignalOptions
from mechopd.core import options as _opts
from mechopd.core.config_parse import StrictLoader, check_saveable, merge
from mechopd.core.errors import ConfigError

DATE_PIN = "date_string"  # the template variable that pins a date-reading chat template (`views.pin_render`)
# keys `--resume` accepts changed (everything else must equal the run's config.yaml): the run's length and what is
# logged or saved, and the process layout (`sharding` computes the same update; checkpoints resume under either)
RESUME_MUTABLE = (
    "steps",
    "eval_every",
    "save_every",
    "keep_checkpoints",
    "eval_n",
    "log_tensorboard",
    "log_wandb",
    "wandb_project",
    "grad_stats_every",
    "sharding",
    "loss_head",
)
METHOD_ALIASES = {
    # shorthand methods that name a selector: "ta_opd" = OPD with the teachability selector (docs/method.md §3)
    "ta_opd": ("opd", "ta_opd"),
    "ta_opd_ent": ("opd", "ta_opd_ent"),
}


def method_names() -> list[str]:
    """Every name ``method`` accepts: the registered loss-term sets, then the shorthands (`METHOD_ALIASES`): the live
    names of the ``method`` registry (`mechopd.objectives.losses.method_registry`)."""
    return list(_opts.registry_names("method"))


@dataclass
class TrainConfig(
    TeacherOptions,
    LoraOptions,
    ScaleOptions,
    RenderOptions,
    LogOptions,
    OptimOptions,
    RolloutOptions,
    SignalOptions,
    SelectionOptions,
    EstimatorOptions,
    FollowOptions,
    NCAOptions,
    RunOptions,
):
    """One training run: the sections' fields, flat (docs/config.md lists them; `field_facts(TrainConfig)`).

    plugins: the values of plug-in options (a loss term or selector registered with its own options dataclass,
    `mechopd.core.options.register_options`), by key; read as attributes (``cfg.toy_weight``) and saved flat."""

    plugins: dict[str, Any] = field(default_factory=dict, repr=False, metadata={"bound": False})

    def __getattr__(self, name: str) -> Any:
        plugins = self.__dict__.get("plugins") or {}
        if name in plugins:
            return plugins[name]
        for facts in _opts.plugin_facts(type(self)):
            if facts.name == name:
                return facts.default
        raise AttributeError(f"TrainConfig has no field {name!r}")

    def __post_init__(self) -> None:
        _check_plugins(self)
        _opts.check_fields(self, _FACTS)
        if self.method in METHOD_ALIASES:
            self.method, sel = METHOD_ALIASES[self.method]
            if self.selector == "full":
                self.selector = sel
        _check_rollout_dtype(self)  # before vLLM's import check: its refusal names the real conflict
        _check_vllm(self)
        if self.follow_contexts is not None and (
            not isinstance(self.follow_contexts, (list, tuple))
            or not self.follow_contexts
            or not all(isinstance(c, str) and c.strip() for c in self.follow_contexts)
        ):
            raise ConfigError(
                f"follow_contexts={self.follow_contexts!r} is invalid: give a non-empty list of "
                "other-context labels (e.g. [shift:2, reverse]) or null for all of them"
            )
        if self.q_low >= self.q_high:
            raise ConfigError(
                f"q_low={self.q_low}, q_high={self.q_high} are invalid: need q_low < q_high "
                f"(defaults {TrainConfig.q_low}, {TrainConfig.q_high})"
            )
        if self.nca_gate is not None and self.nca_gate_acc is not None:
            raise ConfigError(
                "nca_gate (KL) and nca_gate_acc (accuracy) are exclusive: the anchor has one gate; set one"
            )
        if self.nca_gate_acc is not None and self.rollout_engine == "vllm":
            raise ConfigError(
                "nca_gate_acc decodes with the student itself, not vLLM; use nca_gate or rollout_engine=auto"
            )
        if self.renormalize and self.tail:
            raise ConfigError(
                "renormalize and tail are exclusive: a renormalised top-k distribution has no tail; "
                "set one of them to false"
            )
        if self.grad_stats_every and self.sharding != "none":
            raise ConfigError(
                f"grad_stats_every={self.grad_stats_every} needs sharding: none (per-term gradients "
                "are taken on full replicas); set grad_stats_every=0 or sharding=none"
            )
        if isinstance(self.shared_prefix, bool):  # YAML 1.1 reads a bare `off` / `on` as a boolean
            self.shared_prefix = "auto" if self.shared_prefix else "off"
        if self.logit_chunk is not None and self.sharding != "none":
            raise ConfigError(
                f"logit_chunk={self.logit_chunk} needs sharding: none (an FSDP root holds the LM head, "
                "so the head cannot run per chunk); set logit_chunk=null or sharding=none "
                "(micro_batch_size works under both)"
            )
        _check_lora_and_teacher(self)
        check_loss_head(self.loss_head, self.method, self.sharding)  # fused: opd / nca terms, sharding none
        check_saveable(self.to_dict(), "train config")

    def to_dict(self) -> dict[str, Any]:
        """The flat config (what config.yaml records): every field, then the plug-in options' values."""
        out = dataclasses.asdict(self)
        return out | out.pop("plugins")

    def section(self, cls: type) -> Any:
        """The options dataclass ``cls`` (a section or a plug-in's options) filled from this config's values."""
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})


_FACTS = _opts.field_facts(TrainConfig)


def train_facts() -> list[_opts.Facts]:
    """Every TrainConfig key's facts: the sections' fields, then the registered plug-in options'."""
    return _FACTS + _opts.plugin_facts(TrainConfig)


def _check_plugins(cfg: TrainConfig) -> None:
    """The plug-in values: keys of registered plug-in options only, each checked by its facts."""
    facts = {f.name: f for f in _opts.plugin_facts(TrainConfig)}
    unknown = sorted(set(cfg.plugins) - set(facts))
    if unknown:
        raise ConfigError(f"unknown plug-in option(s) {', '.join(unknown)}; registered: {', '.join(facts) or 'none'}")
    for key, value in cfg.plugins.items():
        _opts.check_value(facts[key], value)


def _check_vllm(cfg: TrainConfig) -> None:
    """vllm_options' keys (refused whatever the engine: else ignored silently) and, for rollout_engine=vllm, vLLM
    itself. (method, selector, rollout_engine and shared_prefix are checked with every field: their choices.)"""
    unknown = sorted(set(cfg.vllm_options) - set(VLLM_OPTIONS))
    if unknown:
        raise ConfigError(f"vllm_options: unknown key(s) {', '.join(unknown)}; known: {', '.join(VLLM_OPTIONS)}")
    if cfg.rollout_engine == "vllm":
        from mechopd.core.model_checks import require_vllm

        require_vllm("rollout_engine")


def _check_rollout_dtype(cfg: TrainConfig) -> None:
    """``rollout_dtype: bfloat16`` only where a bfloat16 copy means something and can follow the student
    (`train.rollcopy`): a float32 student, the built-in decoder, full replicas. One line each, naming the fix."""
    if cfg.rollout_dtype == "same":
        return
    for key, ok, why in (
        ("dtype", "float32", "the student already samples in reduced precision"),
        ("sharding", "none", "the copy would be a whole unsharded model on every process"),
    ):
        if getattr(cfg, key) != ok:
            raise ConfigError(
                f"rollout_dtype={cfg.rollout_dtype} needs {key}: {ok}, not {getattr(cfg, key)} ({why}); set "
                f"rollout_dtype=same or {key}={ok}"
            )
    if cfg.rollout_engine == "vllm":
        raise ConfigError(
            f"rollout_dtype={cfg.rollout_dtype} samples from a copy with the built-in decoder; vLLM holds its own "
            "weights: set rollout_engine=auto or rollout_dtype=same"
        )


def check_loss_head(loss_head: str, method: str, sharding: str) -> None:
    """Config-time refusal of ``loss_head: fused`` where the fused head (`objectives.head`) cannot run (one line
    naming the fix): a method's terms, read from the ``method`` registry, all in `FUSED_TERMS`; sharding none."""
    if loss_head != "fused":
        return
    other = [t for t in _opts.registry("method").get(method, ()) if t not in FUSED_TERMS]
    if other:
        raise ConfigError(
            f"loss_head=fused computes the opd and nca terms only; method={method} needs "
            f"{', '.join(other)}: set loss_head=logits (or auto)"
        )
    if sharding != "none":
        raise ConfigError(
            "loss_head=fused needs sharding: none (an FSDP root holds the LM head); set "
            "loss_head=logits (or auto) or sharding=none"
        )


def _check_lora_and_teacher(cfg: TrainConfig) -> None:
    """LoRA and teacher-mode fields: values and the layouts they run under (one line each, naming the fix)."""
    t = cfg.lora_targets
    if t is not None and (
        not isinstance(t, (list, tuple))
        or not t
        or len(set(t)) != len(t)
        or not all(isinstance(x, str) and x.strip() for x in t)
    ):
        raise ConfigError(
            f"lora_targets={t!r} is invalid: give a non-empty list of distinct module names (e.g. "
            "[q_proj, v_proj]) or null for the attention and MLP projections"
        )
    if cfg.lora_dropout >= 1:
        raise ConfigError(f"lora_dropout={cfg.lora_dropout} is invalid: need 0 <= lora_dropout < 1")
    if cfg.uses_lora:
        from mechopd.core.model_checks import require_peft

        require_peft()
        for key, bad, fix in (("sharding", "fsdp", "sharding=none"), ("rollout_engine", "vllm", "rollout_engine=auto")):
            if getattr(cfg, key) == bad:
                raise ConfigError(
                    f"lora_rank={cfg.lora_rank} does not run with {key}: {bad} (untested there); set "
                    f"{fix} or lora_rank=0"
                )
    if cfg.teacher_mode != "frozen":
        if cfg.teacher is not None:
            raise ConfigError(
                f"teacher_mode={cfg.teacher_mode} needs self-distillation (teacher: null); a cross-model "
                "teacher is frozen: set teacher_mode=frozen or drop teacher"
            )
        if cfg.sharding != "none":
            raise ConfigError(
                f"teacher_mode={cfg.teacher_mode} does not run with sharding: {cfg.sharding} (the "
                "teacher would share the student's shards); set sharding=none or teacher_mode=frozen"
            )


def config_diff(old: dict[str, Any], new: dict[str, Any], allowed: tuple[str, ...] = RESUME_MUTABLE) -> list[str]:
    """``"key: old -> new"`` for every key that differs between two config dicts, except the ``allowed`` ones."""
    keys = sorted((set(old) | set(new)) - set(allowed))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def build_config(cls: type, data: dict[str, Any], source: str = "config") -> Any:
    """Instantiate a config dataclass from a mapping (`mechopd.core.options.bind`: unknown keys named, values coerced)."""
    if cls is TrainConfig:
        return bind_train(data, source=source)
    return _opts.bind(cls, data, source=source)


def bind_train(
    data: dict[str, Any],
    sets: dict[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
    source: str = "train config",
) -> TrainConfig:
    """`TrainConfig` from a file's keys, flags and ``--set`` (`mechopd.core.options.bind`); plug-in keys into ``plugins``."""
    merged = merge(merge(dict(data), flags or {}), sets or {})
    facts = {f.name: f for f in _opts.plugin_facts(TrainConfig)}
    plugins = {k: _opts.coerce(facts[k], merged.pop(k), source) for k in list(merged) if k in facts}
    return _opts.bind(
        TrainConfig, merged, source=source, fixed={"plugins": plugins} if plugins else None, also=tuple(facts)
    )


def adopt_pins(cfg: TrainConfig, run_config: Path, resume: bool = True) -> dict[str, Any]:
    """A resumed run renders as it started: the pinned date in its config.yaml is kept unless the config sets one.
    Returns the run's recorded chat_template_kwargs ({} for no run, or without `resume`)."""
    if not resume:
        return {}
    try:
        recorded = (yaml.load(Path(run_config).read_text(), Loader=StrictLoader) or {}).get("chat_template_kwargs")
    except (OSError, yaml.YAMLError, AttributeError):
        return {}
    recorded = recorded if isinstance(recorded, dict) else {}
    if DATE_PIN in recorded and DATE_PIN not in cfg.chat_template_kwargs:
        cfg.chat_template_kwargs = {**cfg.chat_template_kwargs, DATE_PIN: recorded[DATE_PIN]}
    return recorded


def dump_yaml(cfg: Any, path: str | Path) -> None:
    flat = cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)  # TrainConfig: plug-ins flattened
    Path(path).write_text(yaml.safe_dump(flat, sort_keys=False))
