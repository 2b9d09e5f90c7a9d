"""Probe items: examples with one response (token ids) each, and the one way probes get responses.

`sample_responses` is the only response sampler of the probes (no-context view, per-row seeds ``item_seed(seed,
uid)``: a response depends on (model, seed, example), never on the batch size); `make_batches` wraps examples and
responses into a re-iterable `ProbeItems`; `answer_responses` and `read_responses` are the other two sources.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from mechopd.config.sections import RolloutOptions
from mechopd.core.checks import check_response_ids, check_task_vocab
from mechopd.core.errors import ConfigError, DataError, TaskError
from mechopd.core.views import RenderSpec, TwoViewBatch, build_two_view_batch, render_prompt_ids
from mechopd.evaluation.pinning import check_fits, pin_render
from mechopd.generate.sampler import item_seed, sample_rows
from mechopd.generate.settings import SamplingSettings


@dataclass
class ProbeItems:
    """Examples with one response (token ids) each; iterating yields `TwoViewBatch`es built on the fly.

    Re-iterable, so several models can be run one after the other on identical batches; only the examples and the
    response ids are held (the batches are rebuilt per pass, rendering is cheap next to a forward).
    """

    tokenizer: object
    examples: list
    responses: list[list[int]]
    spec: RenderSpec
    batch_size: int  # the setup's (`ProbeSetup.batch_size`)
    layout: str = "left"
    max_length: int | None = None

    def __post_init__(self) -> None:
        if len(self.examples) != len(self.responses):
            raise DataError(f"{len(self.examples)} examples but {len(self.responses)} responses; give one per example")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        for ex, r in zip(self.examples, self.responses):
            if not r:
                raise DataError(f"the response of example {ex.uid!r} is empty; every example needs a response token")
        self.spec, _ = pin_render(self.tokenizer, self.spec, self.examples[0].prompt, self.examples[0].context)

    def check_lengths(self, max_length: int | None) -> None:
        """Every item's context view plus its response fits `max_length` (refused before any model loads)."""
        self.max_length = self.max_length or max_length
        for _ in self:  # `assemble_two_views` refuses an item that does not fit (rendering only, no model)
            pass

    @property
    def uids(self) -> list[str]:
        return [ex.uid for ex in self.examples]

    def __len__(self) -> int:
        return math.ceil(len(self.examples) / self.batch_size)

    def __iter__(self) -> Iterator[TwoViewBatch]:
        for i in range(0, len(self.examples), self.batch_size):
            exs = self.examples[i : i + self.batch_size]
            yield build_two_view_batch(
                self.tokenizer,
                [e.prompt for e in exs],
                [e.context for e in exs],
                self.responses[i : i + self.batch_size],
                self.spec,
                layout=self.layout,
                max_length=self.max_length,
            )


def answer_responses(tokenizer, examples: Sequence) -> list[list[int]]:
    """The task's reference answers as response ids: the answer's tokens plus the end-of-turn (eos) token."""
    out = []
    for ex in examples:
        if ex.answer is None:
            raise TaskError(
                f"example {ex.uid!r} has no reference answer (games have none); sample the responses "
                "from a model instead (responses_from=LABEL)"
            )
        ids = tokenizer(str(ex.answer), add_special_tokens=False)["input_ids"]
        out.append(list(ids) + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []))
    return out


def read_responses(path: str | os.PathLike, examples: Sequence) -> list[list[int]]:
    """Given responses: a JSONL file with one ``{"uid": ..., "response_ids": [...]}`` per line (the
    ``similarity_responses.jsonl`` a previous run wrote), matched to the examples by uid."""
    by_uid: dict[str, list[int]] = {}
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            by_uid[str(rec["uid"])] = [int(t) for t in rec["response_ids"]]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise DataError(
                f"{path} line {i}: expected a JSON object with 'uid' and 'response_ids' (token ids)"
            ) from None
    missing = [ex.uid for ex in examples if ex.uid not in by_uid]
    if missing:
        raise DataError(
            f"{path} has no response for {len(missing)} item(s) (first uid {missing[0]!r}); use the same "
            "task, n and seed as the run that wrote it"
        )
    return [by_uid[ex.uid] for ex in examples]


def sample_responses(
    model: nn.Module,
    tokenizer,
    task: Any,
    examples: Sequence,
    spec: RenderSpec,
    *,
    seed: int,
    batch_size: int,
    greedy: bool = False,
    rollout: RolloutOptions | None = None,
) -> list[list[int]]:
    """One response per example sampled from `model` on the NO-context view (as the student samples in OPD): the ONE
    response sampler of the probes (the runner, `gradients.sample_batch` and `teachability_bank.build_bank` call it).
    rollout: the sampling section (`SamplingSettings.from_section`; None = its defaults: `task`'s temperature and
    max_new_tokens, the probes' setup already in a `setup.TaskView`).

    Per-example seeds (``generate.sampler.sample_rows``, ``item_seed(seed, uid)``): a response depends on
    (seed, example), not on batch_size.
    """
    prompts = [render_prompt_ids(tokenizer, e.prompt, None, spec) for e in examples]
    seeds = [item_seed(seed, e.uid) for e in examples]
    settings = SamplingSettings.from_section(
        rollout or RolloutOptions(), task, tokenizer, model, greedy=greedy, batch_size=batch_size
    )
    return sample_rows(model, prompts, seeds, settings)


def make_batches(
    tokenizer,
    task,
    n: int,
    seed: int,
    batch_size: int,
    responses_from: nn.Module | str | Sequence[Sequence[int]],
    spec: RenderSpec | None = None,
    *,
    split: str = "test",
    greedy: bool = False,
    layout: str = "left",
) -> ProbeItems:
    """`n` items of `task` with one response each, as a re-iterable source of `TwoViewBatch`es.

    responses_from: a model (responses sampled from it on the no-context view with `rollout.sample`, the task's
    temperature and max_new_tokens; ``greedy`` for argmax), ``"answers"`` (the task's reference answers + eos), or the
    response ids themselves (one list per item). Games (``task.is_game``): the first move's prompt only.
    Sampled responses are a function of (seed, item): per-row seeds make them independent of batch_size (the ids are
    also written by `run_similarity` to ``similarity_responses.jsonl``, which ``responses_from`` accepts).
    spec: default ``RenderSpec(placement=task.placement)``.
    """
    spec = spec or RenderSpec(placement=task.placement)
    check_task_vocab(tokenizer, task)  # as eval and train: no scoring of <unk> ids
    examples = task.examples(split, n, seed)
    spec, _ = pin_render(tokenizer, spec, examples[0].prompt, examples[0].context)  # before any sampling
    if isinstance(responses_from, nn.Module):
        check_fits(
            tokenizer,
            examples,
            spec,
            task.max_new_tokens,  # before sampling past the model's positions
            getattr(responses_from.config, "max_position_embeddings", None),
        )
        responses = sample_responses(
            responses_from, tokenizer, task, examples, spec, seed=seed, batch_size=batch_size, greedy=greedy
        )
        max_length = getattr(responses_from.config, "max_position_embeddings", None)
    elif isinstance(responses_from, str):
        if responses_from != "answers":
            raise ConfigError(f"responses_from={responses_from!r}: pass a model, 'answers' or response ids")
        responses, max_length = answer_responses(tokenizer, examples), None
    else:
        responses, max_length = [list(r) for r in responses_from], None
        check_response_ids(responses, tokenizer, "the given responses")  # ids of this tokenizer only
    return ProbeItems(tokenizer, examples, responses, spec, batch_size, layout, max_length)
