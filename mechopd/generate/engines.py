"""What a rollout engine is: the `RolloutEngine` protocol, the `Generation` it returns, and `cut_at_stop`.

A leaf of `mechopd.generate` (it imports nothing from mechopd): the sampler dispatches to an engine object it finds in
its `SamplingSettings` (``settings.engine``), and an engine (e.g. `vllm_engine.VllmEngine`) implements this protocol
and builds its `Generation` with `cut_at_stop`, so neither module imports the other and no module-global table maps
models to engines. The built-in engines "auto", "lean" and "hf" are names the sampler runs itself (`config.sections.DECODERS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class Generation:
    """Responses of one batch: ids without padding (each ends with the stop token if one was produced)."""

    responses: list[list[int]]
    finished: list[bool]
    shared_prefix: int = 0  # prompt tokens prefilled once for all rows (0: the unshared prefill ran)


@runtime_checkable
class RolloutEngine(Protocol):
    """An external sampler (vLLM): one response per prompt under `settings` (a `settings.SamplingSettings`).

    The contract is the lean path's: prompt ids ``[batch]`` in, response ids out cut after the first stop id (kept),
    at most ``settings.max_new_tokens``, temperature dividing the logits, greedy when ``settings.greedy``, one seed
    per row (a row's draw does not depend on its batch), no id at or beyond ``settings.vocab`` ever drawn."""

    name: str

    def sample(
        self, prompt_ids: Sequence[Sequence[int]], settings: Any, row_seeds: Sequence[int] | None
    ) -> Generation: ...


def cut_at_stop(rows: list[list[int]], stop: Sequence[int], shared: int = 0) -> Generation:
    """Each row cut after its first stop token (the stop kept); `shared`: the prefix length the prefill shared."""
    stops = set(int(s) for s in stop)
    responses, finished = [], []
    for row in rows:
        cut = next((i for i, t in enumerate(row) if t in stops), None)
        responses.append(row[: cut + 1] if cut is not None else row)
        finished.append(cut is not None)
    return Generation(responses, finished, shared)
