"""Configs as dataclasses: YAML keys, CLI flags (``--set key=value``) and field names are the same words.

Defaults are the papers' (docs/method.md): lr 5e-6, β = 0.5, ρ = 0.10, K = 16, top-k 256, one rollout per prompt.
A student ``organism:<task>`` starts from that organism's recipe (`mechopd.organisms.recipes`) instead, key by key,
unless the key is set explicitly (`resolve_train_data`). Every value is validated once, here, in
``TrainConfig.__post_init__`` (the objectives and the trainer assume valid values); ``FIELD_RANGES`` states the range
of every numeric field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mechopd.config_parse import (CliValue, StrictLoader, check_saveable, flag_text, load_yaml, merge,  # noqa: F401
                                   parse_options, parse_overrides, scalar, text_value, typed_options)
from mechopd.errors import ConfigError
from mechopd.ranges import (MIN_TEMPERATURE, SEED_MAX, SEED_RANGE, TEMPERATURE_RANGE,  # noqa: F401
                            check_seed, check_temperature, in_range as _in_range)

SHARDINGS = ("none", "fsdp")  # train.sharding implements them
DATE_PIN = "date_string"  # the template variable that pins a date-reading chat template (`views.pin_render`)
YAML_BOOL_WORDS = ("shared_prefix",)  # text fields whose values YAML 1.1 reads as booleans (`off` / `on`)

# every numeric field's range: (integer?, lower bound, lower bound inclusive?, upper bound or None, None allowed?)
FIELD_RANGES: dict[str, tuple[bool, float, bool, float | None, bool]] = {
    "beta": (False, 0, True, None, False), "budget": (False, 0, False, 1, False), "k": (True, 1, True, None, False),
    "topk": (True, 1, True, None, False), "temperature": TEMPERATURE_RANGE,
    "max_new_tokens": (True, 1, True, None, True), "batch_size": (True, 1, True, None, False),
    "pool_size": (True, 1, True, None, False), "lr": (False, 0, False, None, False), "steps": (True, 1, True, None, False),
    "warmup": (True, 0, True, None, False), "weight_decay": (False, 0, True, None, False),
    "grad_clip": (False, 0, False, None, False), "seed": SEED_RANGE,
    "eval_every": (True, 0, True, None, False), "eval_n": (True, 0, True, None, False),
    "save_every": (True, 0, True, None, False), "nca_start": (True, 0, True, None, False),
    "beta_warmup": (True, 0, True, None, False), "nca_gate": (False, 0, False, None, True),
    "nca_gate_window": (True, 1, True, None, False), "grad_stats_every": (True, 0, True, None, False),
    "q_low": (False, 0, True, 1, False), "q_high": (False, 0, True, 1, False),
    "micro_batch_size": (True, 1, True, None, True), "logit_chunk": (True, 1, True, None, True),
    "follow_weight": (False, 0, True, None, False), "lora_rank": (True, 0, True, None, False),
    "lora_alpha": (False, 0, False, None, False), "lora_dropout": (False, 0, True, 1, False),
    "ema_decay": (False, 0, True, 1, False),
}
TEACHER_MODES = ("frozen", "live", "ema")  # `train.teachers`
# keys `--resume` accepts changed (everything else must equal the run's config.yaml): the run's length and what is
# logged or saved, and the process layout (`sharding` computes the same update; checkpoints resume under either)
LR_SCHEDULES = ("constant", "linear", "cosine")  # `train.lr.lr_multiplier`
RESUME_MUTABLE = ("steps", "eval_every", "save_every", "eval_n", "log_tensorboard", "log_wandb", "wandb_project",
                  "grad_stats_every", "sharding")

def method_names() -> list[str]:
    """Every name ``method`` accepts: the registered loss-term sets, then the shorthands (`METHOD_ALIASES`)."""
    from mechopd.objectives.losses import METHODS

    return [*METHODS, *METHOD_ALIASES]


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
               beta (NCA / SymKL weight), nca_start (steps with β = 0 before the anchor starts), beta_warmup (steps
               of a linear ramp 0 → β after nca_start; both 0 = the papers' constant β), nca_gate (None = no gate;
               a level in nats: the anchor starts no earlier than the step after the mean KL(q_x ‖ f) of the last
               nca_gate_window steps falls to it, `objectives.schedule.AnchorGate`), nca_positions ("all": the
               NCA term covers every response token, "selected": only the selector's kept tokens).
    Following: follow_weight (0 = off; > 0 adds the `follow` term, `objectives.follow`: on-policy self-distillation
               under the task's OTHER contexts), follow_contexts (labels of `Task.other_contexts` it draws from;
               None = all of them).
    Selector:  selector (full | random | entropy | divergence | tip | compat | ta_opd | ta_opd_ent), budget (ρ),
               k (TA-OPD top-K), c_mode, d_mode, tie_break (position | sequence), min_one_per_response (False: exactly
               the top ⌈ρN⌉, the paper's text; True: the released code's "≥ 1 token per response", added on top),
               q_low / q_high (the normalisation quantiles).
    Estimator: estimator (topk | full | sampled), topk (k for the student-top-k reverse KL), renormalize, tail.
    Rollouts:  temperature (None = the task's: 1.0 QA, 0.7 games), max_new_tokens (None = the task's), rollout_engine
               (lean: `generate.lean`, Llama/Qwen2/Qwen3; hf: ``model(...)`` per decode step, any causal LM; vllm:
               `generate.vllm_engine`, colocated vLLM synced after every step, extra ``mechopd[vllm]``), vllm_options
               (`VllmEngine` keywords: gpu_memory_utilization, enforce_eager, max_model_len, max_num_seqs), batch_size
               (prompts or games per optimizer step, global across processes), pool_size (training items the run cycles through in
               seeded epochs; independent of `steps`, so a resumed run sees the same data).
    Optim:     lr, steps, warmup (linear warm-up steps), lr_schedule (constant: the papers'; linear | cosine: decay to 0
               at the last step, `train.lr`), weight_decay, grad_clip, seed.
    Logging:   eval_every, eval_n (held-out items per periodic evaluation; 0 = off), save_every, log_tensorboard
               (RUN/tensorboard; extra mechopd[tensorboard]), log_wandb and wandb_project (W&B, offline unless
               WANDB_MODE says otherwise, under RUN/wandb; extra mechopd[wandb]),
               grad_stats_every (every N steps: per-term gradient norms, cosines, dominance; 0 = off; one extra
               backward per term on those steps; needs sharding: none).
    Rendering: no_context_system, chat_template_kwargs (see views.RenderSpec).
    Scale-out: sharding (none: every process holds full student and teacher, gradients all-reduced; fsdp: PyTorch
               FSDP2, student and frozen teacher sharded per decoder layer over all processes, full weights
               gathered only while generating). Same update either way; one process has nothing to shard.
    Sharing:   shared_prefix (auto: a context-view token prefix common to every row is computed once per batch at
               batch size 1, exact, logged per step as ``shared_prefix`` = tokens shared; off: every row in full).
    LoRA:      lora_rank (0 = off: every weight trains; r > 0: a peft LoRA adapter of rank r on lora_targets, the
               base weights frozen, `mechopd.lora`), lora_alpha (α: ΔW = (α / r) B A), lora_dropout (on the adapter's
               input, every student forward in train mode, rollouts included), lora_targets (module names; None = the
               attention and MLP projections q/k/v/o/gate/up/down_proj). Self-distillation's teacher is then the
               student's own base weights, shared, no copy; final/ and checkpoints hold the merged weights (W0 + ΔW,
               what every command opens) and the adapter in <dir>/adapter/ (PEFT's format). Needs sharding: none and
               a lean / hf rollout engine.
    Teacher:   teacher_mode (frozen: the initial student, or the cross-model teacher; live: the current student
               itself, no grad; ema: an exponential moving average of the student, θ_T ← ema_decay · θ_T +
               (1 − ema_decay) · θ after every optimizer step, of the adapter alone for a LoRA student), ema_decay.
               live / ema need self-distillation (teacher: null) and sharding: none (`train.teachers`).
    Hardware:  dtype (float32 | bfloat16 | float16; bfloat16 / float16 also run the forwards under torch.autocast,
               log-softmax and losses in float32), device (auto | cpu | cuda | ...), organism_dir.
    Memory:    micro_batch_size (rows per forward/backward inside one optimizer step, gradients accumulated; None =
               all of this process's rows at once; the update is the one-shot step's, `train.step`), logit_chunk
               (response positions per LM-head / log-softmax / loss chunk, so no [rows, R, vocab] tensor of a whole
               micro-batch exists; None = the whole response; needs sharding: none), gradient_checkpointing
               (recompute the student's decoder layers in backward; the student's own shared prefix is then off).
    """

    task: str = "rules"
    task_options: dict[str, Any] = field(default_factory=dict)
    student: str = "organism:rules"
    teacher: str | None = None
    method: str = "opd"
    beta: float = 0.5
    nca_start: int = 0
    beta_warmup: int = 0
    nca_gate: float | None = None
    nca_gate_window: int = 5
    selector: str = "full"
    budget: float = 0.10
    k: int = 16
    c_mode: str = "exact"
    d_mode: str = "union"
    min_one_per_response: bool = False
    tie_break: str = "position"
    q_low: float = 0.05
    q_high: float = 0.95
    nca_positions: str = "all"
    follow_weight: float = 0.0
    follow_contexts: list[str] | None = None
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
    lr_schedule: str = "constant"
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 0
    eval_n: int = 200
    save_every: int = 0
    log_tensorboard: bool = False
    log_wandb: bool = False
    wandb_project: str = "mechopd"
    grad_stats_every: int = 0
    no_context_system: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    device: str = "auto"
    organism_dir: str = "runs/organisms"
    sharding: str = "none"
    rollout_engine: str = "lean"
    vllm_options: dict[str, Any] = field(default_factory=dict)
    shared_prefix: str = "auto"
    micro_batch_size: int | None = None
    logit_chunk: int | None = None
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: list[str] | None = None
    teacher_mode: str = "frozen"
    ema_decay: float = 0.99

    def __post_init__(self) -> None:
        _check_types(self)
        if self.method in METHOD_ALIASES:
            self.method, sel = METHOD_ALIASES[self.method]
            if self.selector == "full":
                self.selector = sel
        from mechopd.generate.lean import DECODERS
        from mechopd.generate.prefix import MODES as PREFIX_MODES
        from mechopd.objectives.losses import ESTIMATORS, METHODS
        from mechopd.objectives.select import C_MODES, D_MODES, SELECTORS, TIE_BREAKS

        if self.method not in METHODS:
            follow = (" — the follow term is not a method: add it to any method with follow_weight (--set "
                      "follow_weight=1, e.g. --method nca --set follow_weight=1)") if "follow" in str(self.method) else ""
            raise ConfigError(f"method={self.method!r} is unknown; choose one of {', '.join(method_names())}{follow}")
        for name, allowed in (("selector", SELECTORS), ("estimator", ESTIMATORS),
                              ("c_mode", C_MODES), ("d_mode", D_MODES), ("tie_break", TIE_BREAKS),
                              ("nca_positions", ("all", "selected")), ("dtype", ("float32", "bfloat16", "float16")),
                              ("sharding", SHARDINGS), ("rollout_engine", DECODERS), ("lr_schedule", LR_SCHEDULES)):
            _choice(name, getattr(self, name), allowed)
        for name, spec in FIELD_RANGES.items():
            _in_range(name, getattr(self, name), *spec)
        if self.follow_contexts is not None and (not isinstance(self.follow_contexts, (list, tuple)) or not
                                                 self.follow_contexts or not all(isinstance(c, str) and c.strip()
                                                                                 for c in self.follow_contexts)):
            raise ConfigError(f"follow_contexts={self.follow_contexts!r} is invalid: give a non-empty list of "
                              "other-context labels (e.g. [shift:2, reverse]) or null for all of them")
        if self.q_low >= self.q_high:
            raise ConfigError(f"q_low={self.q_low}, q_high={self.q_high} are invalid: need q_low < q_high "
                              "(defaults 0.05, 0.95)")
        if self.renormalize and self.tail:
            raise ConfigError("renormalize and tail are exclusive: a renormalised top-k distribution has no tail; "
                              "set one of them to false")
        if self.grad_stats_every and self.sharding != "none":
            raise ConfigError(f"grad_stats_every={self.grad_stats_every} needs sharding: none (per-term gradients "
                              "are taken on full replicas); set grad_stats_every=0 or sharding=none")
        from mechopd.generate.vllm_engine import check_options, require_vllm

        check_options(self.vllm_options)  # a typo is refused whatever the engine (it would be ignored silently)
        if self.rollout_engine == "vllm":
            require_vllm("rollout_engine")
        if isinstance(self.shared_prefix, bool):  # YAML 1.1 reads a bare `off` / `on` as a boolean
            self.shared_prefix = "auto" if self.shared_prefix else "off"
        _choice("shared_prefix", self.shared_prefix, PREFIX_MODES)
        if not isinstance(self.gradient_checkpointing, bool):
            raise ConfigError(f"gradient_checkpointing={self.gradient_checkpointing!r} is invalid: use true or false")
        if self.logit_chunk is not None and self.sharding != "none":
            raise ConfigError(f"logit_chunk={self.logit_chunk} needs sharding: none (an FSDP root holds the LM head, "
                              "so the head cannot run per chunk); set logit_chunk=null or sharding=none "
                              "(micro_batch_size works under both)")
        _check_lora_and_teacher(self)
        check_saveable(self.to_dict(), "train config")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_types(cfg: Any) -> None:
    """Text fields hold text and mapping fields mappings, however the config was built (YAML, CLI, Python)."""
    import typing

    for name, hint in typing.get_type_hints(type(cfg)).items():
        value, text = getattr(cfg, name), "str" if hint is str else str(hint)
        if name in YAML_BOOL_WORDS and isinstance(value, bool):
            continue
        if text.startswith("str") and not (isinstance(value, str) or (value is None and "None" in text)):
            raise ConfigError(f"{name}={value!r} is not text; pass a string (quote it in YAML)")
        if text.startswith("dict") and not isinstance(value, dict):
            raise ConfigError(f"{name}={value!r} is not a mapping; pass key: value pairs (--set {name}.KEY=VALUE)")



def _check_lora_and_teacher(cfg: TrainConfig) -> None:
    """LoRA and teacher-mode fields: values and the layouts they run under (one line each, naming the fix)."""
    _choice("teacher_mode", cfg.teacher_mode, TEACHER_MODES)
    t = cfg.lora_targets
    if t is not None and (not isinstance(t, (list, tuple)) or not t or len(set(t)) != len(t)
                          or not all(isinstance(x, str) and x.strip() for x in t)):
        raise ConfigError(f"lora_targets={t!r} is invalid: give a non-empty list of distinct module names (e.g. "
                          "[q_proj, v_proj]) or null for the attention and MLP projections")
    if cfg.lora_dropout >= 1:
        raise ConfigError(f"lora_dropout={cfg.lora_dropout} is invalid: need 0 <= lora_dropout < 1")
    if cfg.lora_rank:
        from mechopd.lora import require_peft

        require_peft()
        for key, bad, fix in (("sharding", "fsdp", "sharding=none"), ("rollout_engine", "vllm", "rollout_engine=lean")):
            if getattr(cfg, key) == bad:
                raise ConfigError(f"lora_rank={cfg.lora_rank} does not run with {key}: {bad} (untested there); set "
                                  f"{fix} or lora_rank=0")
    if cfg.teacher_mode != "frozen":
        if cfg.teacher is not None:
            raise ConfigError(f"teacher_mode={cfg.teacher_mode} needs self-distillation (teacher: null); a cross-model "
                              "teacher is frozen: set teacher_mode=frozen or drop teacher")
        if cfg.sharding != "none":
            raise ConfigError(f"teacher_mode={cfg.teacher_mode} does not run with sharding: {cfg.sharding} (the "
                              "teacher would share the student's shards); set sharding=none or teacher_mode=frozen")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is unknown; choose one of {', '.join(allowed)}")



def config_diff(old: dict[str, Any], new: dict[str, Any], allowed: tuple[str, ...] = RESUME_MUTABLE) -> list[str]:
    """``"key: old -> new"`` for every key that differs between two config dicts, except the ``allowed`` ones."""
    keys = sorted((set(old) | set(new)) - set(allowed))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def _coerce(name: str, value: Any, hint: Any, source: str) -> Any:
    """Convert a YAML or command-line value to the field's declared type (type-directed: text fields stay text)."""
    text = str(hint)
    if value is None or (isinstance(value, CliValue) and value in ("null", "~") and "None" in text):
        if "None" in text:
            return None
        raise ConfigError(f"{source}: {name} must not be null")
    if hint is str or text.startswith("str"):
        if isinstance(value, bool) and name in YAML_BOOL_WORDS:
            return value  # YAML 1.1's bare off/on; the field reads it (`TrainConfig.__post_init__`)
        return text_value(value, name, "None" in text, source)
    if isinstance(value, CliValue) and not text.startswith("dict"):
        value = scalar(value)
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
        if text.startswith("dict"):
            if isinstance(value, CliValue):
                value = yaml.load(value, Loader=StrictLoader) if value.strip() else {}  # noqa: S506
            if not isinstance(value, dict):
                raise ValueError
            return typed_options(value)
    except (TypeError, ValueError, OverflowError, yaml.YAMLError, RecursionError):
        if text.startswith("dict"):
            raise ConfigError(f"{source}: {name}={value!r} is not a mapping; pass KEY: VALUE pairs (--set "
                              f"{name}.KEY=VALUE)") from None
        kind = getattr(hint, "__name__", text.split(" |")[0].split("[")[0])
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


def resolve_train_data(data: dict[str, Any]) -> dict[str, Any]:
    """Explicit keys over the student's organism recipe (``organism:<task>``; none for other students)."""
    from mechopd.organisms.recipes import recipe_for

    student = data.get("student", TrainConfig.student)
    return merge(recipe_for(student), data)


def load_train_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """YAML file, then overrides, then the organism recipe for every key neither sets (see the module docstring)."""
    data = load_yaml(path) if path else {}
    data = resolve_train_data(merge(data, overrides or {}))
    return build_config(TrainConfig, data, source=str(path or "train config"))


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
    Path(path).write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
