"""`SamplingSettings`: how responses are sampled, one frozen object every generation call takes.

The sampler (`sampler.sample`, `sample_rows`, `play_games`), the rollout engines (`engines.RolloutEngine`, vLLM) and
every caller (the trainer's rollout, evaluation, the probes) pass this one object instead of a dozen loose keywords
(as vLLM's ``SamplingParams`` and TRL's generation configs do). Row seeds are not in it: they are per-row data, passed
next to the prompts (``item_seed`` / `stable_seed` of a row's identity).

``vocab`` is the number of ids that may be drawn: ids ``>= vocab`` are masked out of every draw, greedy included
(docs/method.md, "Sampled ids"). `for_model` sets it to `known_vocab`: the ids the tokenizer knows, cut to the
smallest LM head of the models involved (a student head larger than its teacher's samples only the common ids; head
rows past the tokenizer — the padding of real checkpoints — are never drawn).

`from_section` builds the settings from the rollout section (`config.sections.RolloutOptions`): every caller (the
trainer, the evaluation, the probes) hands over its section rather than spelling its fields, and a field of the
section that names a field here reaches the sampler by being declared there (`NOT_SAMPLING`: the section's fields
that are not how a batch is sampled; a test keeps the two lists whole).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from mechopd.config.sections import RolloutOptions
from mechopd.core.views import pad_id

BUILTIN_ENGINES = ("auto", "lean", "hf")  # run by the sampler itself; any other engine is a `RolloutEngine` object
# RolloutOptions' fields that `from_section` does not copy: the trainer's (batch_size: prompts per optimizer step, not
# per sampling call; pool_size), the engine's (rollout_engine: `from_section` maps it to ``engine``; vllm_options:
# the keywords `train.engine` builds the vLLM engine with), and the two it resolves against the task
NOT_SAMPLING = frozenset({"batch_size", "pool_size", "rollout_engine", "vllm_options", "rollout_dtype"})  # dtype: WHICH
# model samples (`train.rollcopy`), not how
TASK_DEFAULTS = ("temperature", "max_new_tokens")  # None in the section: the task's


def task_default(rollout: RolloutOptions, task: Any, name: str) -> Any:
    """The rollout section's `name` (one of `TASK_DEFAULTS`), None = the task's (a length check before any model
    loads reads the response cap here, as `SamplingSettings.from_section` does)."""
    value = getattr(rollout, name)
    return getattr(task, name) if value is None else value


def stop_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """Token ids that end a response: the tokenizer's eos, the chat end-of-turn token, the model's eos ids."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for t in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"):
        if t in vocab:
            ids.add(int(tokenizer.convert_tokens_to_ids(t)))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update(int(i) for i in ([gen_eos] if isinstance(gen_eos, int) else gen_eos))
    return sorted(ids)


def head_rows(model: Any) -> int:
    """Rows of `model`'s LM head (the ids its logits cover)."""
    return int(model.get_output_embeddings().weight.shape[0])


def known_vocab(tokenizer: Any, *models: Any) -> int:
    """The ids that may be sampled, scored as targets or fed to a teacher: ``[0, n)`` with
    ``n = min(1 + max id the tokenizer knows, rows of every model's head)``."""
    n = 1 + max(int(i) for i in tokenizer.get_vocab().values())
    return min([n] + [head_rows(m) for m in models if m is not None])


def check_known_ids(ids: Any, mask: Any, vocab: int) -> None:
    """Refuse response ids outside ``[0, vocab)`` at the real positions (`mask`) of ``ids [batch, R]``: they would be
    scored as targets the distributions do not cover, or index past a teacher's embedding."""
    real = ids[mask.bool()]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab):
        bad = int(real.max()) if int(real.max()) >= vocab else int(real.min())
        raise ValueError(
            f"response id {bad} is outside the scored vocabulary [0, {vocab}) (ids the tokenizer and "
            "every model's head know); sample with SamplingSettings.for_model(..., others=(teacher,))"
        )


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """How one batch of responses is sampled.

    max_new_tokens: the response cap. stop: ids that end a response (kept at its end). pad_id: the left-pad id.
    vocab: ids ``>= vocab`` are never drawn (None: the model's whole head; library callers use `for_model`).
    temperature: divides the logits (ignored when greedy). greedy: argmax (over ``[0, vocab)``).
    engine: "auto" (lean where it can run, else hf, said once in the log), "lean" (`lean.LeanDecoder`: Llama, Qwen2,
    Qwen3), "hf" (``model(...)`` with transformers' cache every
    step: any causal LM), or a `engines.RolloutEngine` object (`vllm_engine.VllmEngine`: its own seeds, so only
    greedy ids equal the others').
    shared_prefix: "auto" prefills a token prefix common to every prompt once at batch 1 (generate/prefix.py,
    exact); "off": in full; an int: exactly that many leading tokens (`sample_rows` decides once for all chunks).
    batch_size: prompts per `sample` call in `sample_rows` (any value gives the same ids: per-row seeds).
    """

    max_new_tokens: int
    stop: tuple[int, ...]
    pad_id: int
    vocab: int | None = None
    temperature: float = 1.0
    greedy: bool = False
    engine: Any = "auto"
    shared_prefix: str | int = RolloutOptions.shared_prefix
    batch_size: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(int(s) for s in self.stop))
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size!r}")
        if self.vocab is not None and not (isinstance(self.vocab, int) and self.vocab >= 1):
            raise ValueError(f"vocab must be None or an integer >= 1, got {self.vocab!r}")
        if not self.greedy and not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be finite and > 0 unless greedy, got {self.temperature!r}")
        if isinstance(self.engine, str) and self.engine not in BUILTIN_ENGINES:
            hint = (
                " (vLLM: pass the engine itself, SamplingSettings(engine=VllmEngine(model_dir)))"
                if self.engine == "vllm"
                else ""
            )
            raise ValueError(
                f"engine must be one of {', '.join(BUILTIN_ENGINES)} or a RolloutEngine object, "
                f"got {self.engine!r}{hint}"
            )
        if not isinstance(self.engine, str) and not callable(getattr(self.engine, "sample", None)):
            raise ValueError(f"engine {self.engine!r} has no sample(prompt_ids, settings, row_seeds)")
        sp = self.shared_prefix
        if not (sp in ("auto", "off") or (isinstance(sp, int) and not isinstance(sp, bool) and sp >= 0)):
            raise ValueError(f"shared_prefix must be 'auto', 'off' or a length >= 0, got {sp!r}")

    def replace(self, **changes: Any) -> SamplingSettings:
        return dataclasses.replace(self, **changes)

    @classmethod
    def for_model(
        cls, tokenizer: Any, model: Any, *, max_new_tokens: int, others: Sequence[Any] = (), **kw: Any
    ) -> SamplingSettings:
        """Settings for sampling from `model` with `tokenizer`: its stop ids, the pad id (`views.pad_id`: eos when
        the tokenizer has none), ``vocab = known_vocab(tokenizer, model, *others)`` (`others`: e.g. the teacher that
        will score the responses). `kw`: the remaining fields."""
        return cls(
            max_new_tokens=max_new_tokens,
            stop=tuple(stop_ids(tokenizer, model)),
            pad_id=pad_id(tokenizer),
            vocab=known_vocab(tokenizer, model, *others),
            **kw,
        )

    @classmethod
    def from_section(
        cls,
        rollout: RolloutOptions,
        task: Any,
        tokenizer: Any,
        model: Any,
        *,
        others: Sequence[Any] = (),
        engine: Any = None,
        **kw: Any,
    ) -> SamplingSettings:
        """The settings of the rollout section `rollout` for sampling `task`'s responses from `model` (`for_model`:
        stop ids, pad id, ``vocab`` over `model` and `others`). temperature / max_new_tokens: the section's, None =
        the task's; engine: the section's ``rollout_engine``, or `engine` (the object built for it, e.g. vLLM);
        every other field of the section that names a field here (shared_prefix, ...) as the section says. `kw`:
        the caller's own fields (greedy, batch_size)."""
        names = {f.name for f in dataclasses.fields(cls)}
        carried = {
            f.name: getattr(rollout, f.name)
            for f in dataclasses.fields(rollout)
            if f.name in names and f.name not in NOT_SAMPLING and f.name not in TASK_DEFAULTS
        }
        carried.update({name: task_default(rollout, task, name) for name in TASK_DEFAULTS})
        carried["engine"] = rollout.rollout_engine if engine is None else engine
        return cls.for_model(tokenizer, model, others=others, **{**carried, **kw})
