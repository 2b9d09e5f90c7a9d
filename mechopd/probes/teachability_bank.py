"""The teachability probe's bank (`mechopd.probes.teachability`): frozen student rollouts (prompt x, context c,
response ids y) per sequence, with the tokenizer's fingerprint and the render spec, so that every model is rescored on
IDENTICAL ids; sampled once from θ0, saved and loaded as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from mechopd.config.sections import RolloutOptions
from mechopd.core.artifacts import write_json
from mechopd.core.errors import DataError
from mechopd.core.views import RenderSpec
from mechopd.probes.items import sample_responses

BANK_NAME = "bank.json"

BANK_BATCH = 16  # rows per sampling call when a bank is built (the ids do not depend on it)


@dataclass
class Bank:
    """Frozen student rollouts. prompts / contexts / uids: ``[n]``; responses: ``[n]`` lists of token ids.

    tokenizer_sha: fingerprint of the vocabulary the ids belong to; spec: how prompts are rendered; meta: provenance.
    """

    prompts: list[str]
    contexts: list[str]
    responses: list[list[int]]
    uids: list[str]
    tokenizer_sha: str
    spec: RenderSpec = field(default_factory=RenderSpec)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return sum(len(r) for r in self.responses)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short hash of the token -> id map (a bank is only valid for the vocabulary it was sampled with)."""
    items = sorted(tokenizer.get_vocab().items())
    return hashlib.sha1(json.dumps(items).encode()).hexdigest()[:16]


def build_bank(
    student: nn.Module,
    tokenizer: Any,
    task: Any,
    n: int,
    seed: int,
    spec: RenderSpec | None = None,
    temperature: float | None = None,
    *,
    split: str = "train",
    batch_size: int = BANK_BATCH,
) -> Bank:
    """Sample one response per task example from the student on the no-context view (the one sampler,
    `items.sample_responses`). temperature: None = the task's rollout temperature. Deterministic for (student, task,
    n, seed), whatever `batch_size`."""
    spec = spec or RenderSpec(placement=task.placement)
    temp = float(task.temperature if temperature is None else temperature)
    examples = task.examples(split, n, seed)
    rollout = RolloutOptions(temperature=temp)  # the response cap: the task's
    responses = sample_responses(
        student, tokenizer, task, examples, spec, seed=seed, batch_size=batch_size, rollout=rollout
    )
    return _bank_of(
        examples,
        responses,
        tokenizer,
        spec,
        {"task": getattr(task, "name", ""), "split": split, "n": n, "seed": seed, "temperature": temp},
    )


def _bank_of(
    examples: Sequence[Any], responses: list[list[int]], tokenizer: Any, spec: RenderSpec, meta: dict[str, Any]
) -> Bank:
    return Bank(
        [ex.prompt for ex in examples],
        [ex.context for ex in examples],
        responses,
        [ex.uid for ex in examples],
        tokenizer_fingerprint(tokenizer),
        spec,
        meta,
    )


def save_bank(bank: Bank, path: str | os.PathLike) -> Path:
    """Write the bank as JSON (no pickle), atomically."""
    p = Path(path)
    items = [
        {"uid": u, "prompt": x, "context": c, "response_ids": list(map(int, y))}
        for u, x, c, y in zip(bank.uids, bank.prompts, bank.contexts, bank.responses)
    ]
    doc = {
        "version": 1,
        "tokenizer_sha": bank.tokenizer_sha,
        "spec": asdict(bank.spec),
        "meta": bank.meta,
        "items": items,
    }
    return write_json(p, doc, indent=None)


def load_bank(path: str | os.PathLike) -> Bank:
    """Read a bank written by ``save_bank``. Missing, malformed or empty (no response token) -> ``DataError``."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"bank file {p} does not exist; build one with run_teachability (it writes {BANK_NAME})")
    try:
        doc = json.loads(p.read_text())
        items = doc["items"]
        prompts = [str(it["prompt"]) for it in items]
        contexts = [str(it["context"]) for it in items]
        responses = [[int(t) for t in it["response_ids"]] for it in items]
        uids = [str(it.get("uid", i)) for i, it in enumerate(items)]
        bank = Bank(
            prompts,
            contexts,
            responses,
            uids,
            str(doc["tokenizer_sha"]),
            RenderSpec(**doc.get("spec", {})),
            dict(doc.get("meta", {})),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise DataError(
            f"bank file {p} is malformed ({type(e).__name__}: {e}); it needs 'tokenizer_sha' and 'items' "
            "with prompt, context and response_ids; rebuild it"
        ) from None
    _check_nonempty(bank, str(p))
    return bank


def _check_nonempty(bank: Bank, where: str) -> None:
    if not bank.responses or bank.n_tokens == 0:
        raise DataError(
            f"the bank {where} is empty ({len(bank.responses)} sequences, 0 response tokens); "
            "build it with n >= 1 and a max_new_tokens >= 1"
        )
