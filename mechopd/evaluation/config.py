"""`mechopd eval`'s settings, `EvalConfig`: each field's help, range and choices declared once
(`mechopd.core.options.option`); the CLI's flags (`EVAL_FACTS`, cli/eval_cmd.py) and docs/config.md's evaluation table
are generated from them. A light module (no task or tokenizer imports): the parser is built on every CLI start."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mechopd.config.sections import DECODERS, PREFIX_MODES, RolloutOptions
from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.options import GE0, GE1, GT0, SEED_RANGE, check_fields, check_temperature, field_facts, option


@dataclass(frozen=True)
class RegimeThresholds:
    """Decision thresholds for the removability regimes (proportions, 0..1).

    drop_min:  A if Acc_x − Acc_xc ≥ drop_min (default 0.02: a 2-point accuracy drop with c).
    harm_high: A if Harm ≥ harm_high (default 0.10: c flips ≥ 10 % of the items solved without it).
    gain_min:  B if Acc_xc − Acc_x ≥ gain_min and not A (default 0.02).
    """

    drop_min: float = 0.02
    harm_high: float = 0.10
    gain_min: float = 0.02

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0):
                raise ConfigError(f"RegimeThresholds.{name}={value!r} must be a proportion in [0, 1]")


@dataclass
class EvalConfig:
    """n held-out items (split "test"), seed, greedy unless samples > 1, batch_size prompts per generation call.
    Each field's help, range and choices are declared once here (`mechopd.core.options.option`): `mechopd eval`'s
    flags and their checks are generated from them (`EVAL_FACTS`)."""

    n: int = option(200, help="held-out items", range=GE1)
    seed: int = option(0, help="seed of item choice and sampling", range=SEED_RANGE)
    samples: int = option(1, help="k sampled responses per item and view (1 = greedy unless --temperature)", range=GE1)
    temperature: float | None = option(
        None, help="sampling temperature (omit it: greedy with --samples 1, else the task's)", range=GT0
    )
    batch_size: int = option(256, help="prompts per generation call", range=GE1)
    max_new_tokens: int | None = option(
        None, help="response cap per prompt (per move for games; omit it for the task's)", range=GE1
    )
    n_boot: int = option(1000, help="bootstrap resamples of the intervals (0: none)", range=GE0)
    engine: str = option(
        "auto",
        help="decoder: auto (lean where it can run, else hf), lean (Llama/Qwen2/Qwen3), hf (model(...) per step, any causal LM), vllm (the extra mechopd[vllm])",
        choices=DECODERS,
    )
    shared_prefix: str = option(
        "auto", help="a prompt prefix common to a batch is prefilled once (exact) | off", choices=PREFIX_MODES
    )
    thresholds: RegimeThresholds = field(default_factory=RegimeThresholds)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise TaskError(f"the evaluation set is empty (n={self.n}); pass --n 1 or more")
        if self.samples < 1:
            raise TaskError(f"samples={self.samples} must be >= 1")
        if self.engine not in DECODERS:
            raise TaskError(f"engine={self.engine!r} is unknown; choose one of {', '.join(DECODERS)}")
        if self.engine == "vllm":
            from mechopd.core.model_checks import require_vllm  # torch: kept off the CLI's start

            require_vllm("engine")
        check_temperature(self.temperature)  # omit it for greedy decoding
        if self.shared_prefix not in PREFIX_MODES:
            raise TaskError(f"shared_prefix={self.shared_prefix!r} is unknown; choose auto or off")
        check_fields(
            self, EVAL_FACTS
        )  # before the evaluation: the seed (the bootstrap seeds numpy with it), every declared range and choice (max_new_tokens, batch_size, n_boot, ...)

    def rollout(self) -> RolloutOptions:
        """The rollout section the evaluation samples under (`SamplingSettings.from_section`): its temperature,
        max_new_tokens and shared_prefix, its `engine` as the section's ``rollout_engine``. (Its batch_size, prompts
        per sampling call, is not the section's prompts per optimizer step: the caller passes it apart.)"""
        return RolloutOptions(
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            rollout_engine=self.engine,
            shared_prefix=self.shared_prefix,
        )


EVAL_FACTS = field_facts(EvalConfig)  # the declared fields: `mechopd eval`'s flags (cli/eval_cmd.py)
