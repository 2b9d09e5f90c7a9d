"""The one probe runner: everything a probe reads, resolved ONCE from a `ProbeSetup`, so a probe is its quantity only.

    ctx = ProbeContext.prepare(setup, "gradients", out_dir, {"model": (model, "trained"), "teacher": (teacher,
                               "teacher")}, default_split="train")
    student = ctx.load("model")
    items = ctx.sample(student)          # responses from the student, no-context view; <probe>_items.jsonl written
    ...                                  # the probe's quantity on `items` (a re-iterable stream of TwoViewBatch)
    settings = ctx.settings(estimator="full")   # every resolved setting, every model's path, the items file

`prepare` resolves the models (labels of the setup or checkpoint dirs, `ProbeSetup.model` / `ProbeSetup.pick`),
refuses models whose tokenizers differ, loads the tokenizer, the task (with the setup's temperature and
max_new_tokens), the render spec, the split (the setup's, else the probe's default) and the items. `sample`,
`answers` and `given` attach one response per item (sampled through the one sampler, `items.sample_responses`) and
save the EXACT items the probe scored as ``<probe>_items.jsonl``: per item ``uid``, ``prompt_ids_x`` (no-context
view), ``prompt_ids_c`` (context view), ``response_ids``. `settings` is the record every probe writes into its JSON.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from mechopd.core.artifacts import write_jsonl
from mechopd.core.checks import check_response_ids, check_task_vocab
from mechopd.core.views import RenderSpec, render_prompt_ids
from mechopd.evaluation.pinning import check_fits, pin_render
from mechopd.models import check_same_tokenizer, load_model, load_tokenizer
from mechopd.probes.items import ProbeItems, answer_responses, read_responses, sample_responses
from mechopd.probes.setup import ProbeSetup

ITEMS_SUFFIX = "_items.jsonl"


def items_path(out_dir: str | os.PathLike, probe: str) -> Path:
    return Path(out_dir) / f"{probe}{ITEMS_SUFFIX}"


def write_items(
    path: str | os.PathLike,
    tokenizer: Any,
    spec: RenderSpec,
    uids: Sequence[str],
    prompts: Sequence[Any],
    contexts: Sequence[Any],
    responses: Sequence[Sequence[int]],
) -> Path:
    """One line per item: ``uid``, ``prompt_ids_x``, ``prompt_ids_c`` (both views rendered with ``spec``) and
    ``response_ids`` (the ids both views share)."""
    rows = (
        {
            "uid": u,
            "prompt_ids_x": render_prompt_ids(tokenizer, x, None, spec),
            "prompt_ids_c": render_prompt_ids(tokenizer, x, c, spec),
            "response_ids": [int(t) for t in r],
        }
        for u, x, c, r in zip(uids, prompts, contexts, responses)
    )
    return write_jsonl(path, rows)


@dataclass
class ProbeContext:
    """What one probe run reads (module docstring). models: slot -> (label, checkpoint dir)."""

    probe: str
    setup: ProbeSetup
    out: Path
    task: Any
    spec: RenderSpec
    split: str
    models: dict[str, tuple[str, str]]
    tokenizer: Any
    device: str
    examples: list = field(default_factory=list)
    items: ProbeItems | None = None

    @classmethod
    def prepare(
        cls,
        setup: ProbeSetup,
        probe: str,
        out_dir: str | os.PathLike,
        models: Mapping[str, tuple[str | None, str] | str],
        *,
        default_split: str = "test",
        with_items: bool = True,
        device: str | None = None,
    ) -> ProbeContext:
        """Resolve everything once. models: slot -> ``(ref, role)`` (a label / dir / None for the role's default,
        `ProbeSetup.model`) or a checkpoint dir already resolved (its label = the slot)."""
        resolved = {
            slot: (slot, str(ref)) if isinstance(ref, (str, os.PathLike)) else setup.model(*ref)
            for slot, ref in models.items()
        }
        tok = None
        for slot, (_label, path) in resolved.items():
            other = load_tokenizer(path)
            if tok is None:
                tok, first = other, slot
            else:
                check_same_tokenizer(tok, other, first, slot)
        task = setup.make_task()
        if with_items:
            check_task_vocab(tok, task)  # as eval and train: no scoring of <unk> ids (before any item is drawn)
        examples = setup.examples(task, default_split) if with_items else []
        spec = setup.spec(task)
        if examples:  # a date-reading template is pinned before anything is sampled or saved
            spec, _ = pin_render(tok, spec, examples[0].prompt, examples[0].context)
        return cls(
            probe,
            setup,
            Path(out_dir),
            task,
            spec,
            setup.split or default_split,
            resolved,
            tok,
            device or ("cuda" if torch.cuda.is_available() else "cpu"),
            examples,
        )

    # -- models ------------------------------------------------------------------------------------------------------
    def path(self, slot: str) -> str:
        return self.models[slot][1]

    def label(self, slot: str) -> str:
        return self.models[slot][0]

    def load(self, slot: str, dtype: Any = None) -> Any:
        """The model of ``slot`` on the context's device (eval mode)."""
        return load_model(self.path(slot), dtype=dtype, device=self.device)

    # -- items -------------------------------------------------------------------------------------------------------
    def sample(self, model: Any, *, greedy: bool = False, batch_size: int | None = None) -> ProbeItems:
        """One response per item from ``model`` on the no-context view (the setup's temperature, max_new_tokens and
        seed; ``greedy`` for argmax); ``batch_size``: rows per sampling call (default the setup's; the ids do not
        depend on it). The items are saved (`save_items`)."""
        check_fits(
            self.tokenizer,
            self.examples,
            self.spec,
            self.task.max_new_tokens,  # before sampling past the
            getattr(getattr(model, "config", None), "max_position_embeddings", None),
        )  # model's positions
        responses = sample_responses(
            model,
            self.tokenizer,
            self.task,  # the setup's temperature and max_new_tokens (`setup.TaskView`)
            self.examples,
            self.spec,
            seed=self.setup.seed,
            batch_size=batch_size or self.setup.batch_size,
            greedy=greedy,
        )
        max_length = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        return self._attach(responses, max_length)

    def answers(self) -> ProbeItems:
        """The task's reference answers (+ eos) as the responses."""
        return self._attach(answer_responses(self.tokenizer, self.examples))

    def given(self, responses: Sequence[Sequence[int]] | str | os.PathLike) -> ProbeItems:
        """Responses given as ids (one list per item) or a ``.jsonl`` of ``{"uid", "response_ids"}`` lines."""
        if isinstance(responses, (str, os.PathLike)):
            responses = read_responses(responses, self.examples)
        ids = [list(map(int, r)) for r in responses]
        check_response_ids(ids, self.tokenizer, "the given responses")  # ids of this tokenizer only
        return self._attach(ids)

    def _attach(self, responses: list[list[int]], max_length: int | None = None) -> ProbeItems:
        self.items = ProbeItems(
            self.tokenizer, self.examples, responses, self.spec, self.setup.batch_size, max_length=max_length
        )
        self.save_items()
        return self.items

    def save_items(self) -> Path:
        """``<probe>_items.jsonl``: the exact items scored (uid, prompt ids of both views, response ids)."""
        if self.items is None:
            raise RuntimeError("save_items before the responses were attached (sampled, answers or given)")
        exs = self.items.examples
        return write_items(
            items_path(self.out, self.probe),
            self.tokenizer,
            self.spec,
            [e.uid for e in exs],
            [e.prompt for e in exs],
            [e.context for e in exs],
            self.items.responses,
        )

    # -- the record -------------------------------------------------------------------------------------------------
    def settings(self, **extra: Any) -> dict[str, Any]:
        """Every resolved setting of this run (the probe's own in ``extra``; they win on a clash)."""
        s = self.setup
        out: dict[str, Any] = {
            "probe": self.probe,
            "task": s.task,
            "task_options": dict(s.task_options),
            "split": self.split,
            "n": len(self.examples),
            "seed": s.seed,
            "batch_size": s.batch_size,
            "spec": asdict(self.spec),
            "temperature": self.task.temperature,
            "max_new_tokens": self.task.max_new_tokens,
            "model_paths": {slot: path for slot, (_, path) in self.models.items()},
            "model_labels": {slot: label for slot, (label, _) in self.models.items()},
            "device": self.device,
            "run": s.run,
        }
        chosen = getattr(self.task, "chosen", None)  # a selected item set (`probes.informative`): which and why
        if chosen is not None:
            out["select"] = {k: chosen[k] for k in ("model", "eval_n", "learned", "harmed")}
        if self.items is not None:
            out["items_file"] = items_path(self.out, self.probe).name
        return {**out, **extra}
