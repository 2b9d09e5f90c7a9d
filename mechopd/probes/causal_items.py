"""What the causal probes (lens, patching, attention) share: models resolved once, one item set with one response per
item for every model, the items and resolved settings saved next to the tables, the scored positions' distributions.

Items: the setup's examples (``--split``, default test) with the responses of ``--responses-from`` (a model label:
sampled from it on the no-context view with the setup's temperature and seed; ``answers``; or a ``.jsonl`` of response
ids), default the first trained model of the comparison, else the first model. Every model is scored on the SAME
token ids, so a difference between models is a difference between models.

Files (``out/``): ``<probe>_items.jsonl`` (per item: ``uid``, ``prompt_ids_x``, ``prompt_ids_c``, ``response_ids``;
the exact ids every number was computed from: `assemble_two_views` rebuilds the batches) and ``<probe>.json``
(``settings``: every model's path, task, options, render spec, n, seed, temperature, batch size, device, dtype,
responses source; ``summary``: the probe's own). A probe's QUANTITY is a pure function of (model, batch stream);
this module only feeds it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechopd.core.artifacts import read_csv, read_json, write_json, write_jsonl
from mechopd.core.errors import ConfigError, DataError
from mechopd.core.views import TwoViewBatch, assemble_two_views, render_prompt_ids
from mechopd.models import load_model
from mechopd.probes.items import ProbeItems
from mechopd.probes.runner import ProbeContext
from mechopd.probes.setup import TEACHER, ProbeSetup


def kl_rows(logp_p: torch.Tensor, logp_q: torch.Tensor) -> torch.Tensor:
    """``[..., V]`` x ``[..., V]`` log-probs -> ``[...]`` KL(p ‖ q) = Σ_v p(v) (log p(v) − log q(v))."""
    return (logp_p.exp() * (logp_p - logp_q)).sum(-1)


def logp(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) in float64 (docs/method.md: every distribution is computed from logits / T).

    float64, not the scorer's float32: a KL between two nearly equal views is a difference of two log-softmaxes, and
    float32's relative error per log-prob is then no longer small next to the KL itself. The ``[B, R, V]`` float64
    temporaries live for one site at a time."""
    return torch.log_softmax(logits.double() / temperature, dim=-1)


@dataclass
class CausalRun:
    """The resolved inputs of one causal probe: models (label -> dir), tokenizer, task, items, device, dtype."""

    setup: ProbeSetup
    models: dict[str, str]
    tokenizer: Any
    task: Any
    items: ProbeItems
    source: str
    device: str
    dtype: torch.dtype | None = None
    context: Any = None  # the runner's ProbeContext (mechopd.probes.runner)

    @property
    def temperature(self) -> float:
        return float(self.task.temperature)

    def load(self, label: str) -> nn.Module:
        return load_model(self.models[label], dtype=self.dtype, device=self.device)

    def each_model(self) -> Iterator[tuple[str, nn.Module]]:
        """(label, model) one at a time (only one model is resident)."""
        for label in self.models:
            model = self.load(label)
            yield label, model
            del model

    def settings(self, **extra: Any) -> dict[str, Any]:
        """The runner's record (every model's path, task, spec, split, n, seed, ...) plus the causal probes' own."""
        return self.context.settings(
            models=dict(self.models),
            responses_from=self.source,
            dtype=str(self.dtype or torch.float32),
            positions="predict: the last prompt token and every response token but the last",
            **extra,
        )


def resolve(
    setup: ProbeSetup,
    models: Sequence[str] | Mapping[str, str] | None = None,
    *,
    probe: str,
    out: str | os.PathLike,
    greedy: bool = False,
    device: str | None = None,
    dtype: torch.dtype | None = None,
) -> CausalRun:
    """Models (default every model of the setup but the teacher), resolved by the one probe runner
    (`ProbeContext`: one tokenizer for all, task, render spec, items saved as ``<probe>_items.jsonl``), and the items
    with one response each."""
    picked = setup.pick(models, [k for k in setup.models if k != TEACHER])
    labels = list(picked)
    ctx = ProbeContext.prepare(setup, probe, out, dict(picked), default_split="test", device=device)
    src = setup.responses_from or next((k for k in labels if k in setup.trained), labels[0])
    if src in picked or src in setup.models:
        sampler = load_model(picked.get(src) or setup.models[src], dtype=dtype, device=ctx.device)
        items = ctx.sample(sampler, greedy=greedy)
        del sampler
    elif src == "answers":
        items = ctx.answers()
    elif src.endswith(".jsonl") and Path(src).is_file():
        items = ctx.given(src)
    else:
        raise ConfigError(
            f"--responses-from {src!r} is not a model label ({', '.join(picked)}), 'answers' or an "
            "existing .jsonl file of response ids"
        )
    return CausalRun(setup, picked, ctx.tokenizer, ctx.task, items, src, ctx.device, dtype, ctx)


def item_records(run: CausalRun, **per_item: Sequence[Any]) -> list[dict[str, Any]]:
    """One record per item: uid, prompt_ids_x, prompt_ids_c, response_ids (+ ``per_item`` columns, one per item)."""
    tok, spec = run.tokenizer, run.items.spec
    out = []
    for i, (ex, resp) in enumerate(zip(run.items.examples, run.items.responses)):
        rec = {
            "uid": ex.uid,
            "prompt_ids_x": render_prompt_ids(tok, ex.prompt, None, spec),
            "prompt_ids_c": render_prompt_ids(tok, ex.prompt, ex.context, spec),
            "response_ids": [int(t) for t in resp],
        }
        rec.update({k: v[i] for k, v in per_item.items()})
        out.append(rec)
    return out


def save(
    out: Path,
    probe: str,
    run: CausalRun,
    settings: dict[str, Any],
    summary: dict[str, Any],
    records: list[dict[str, Any]] | None = None,
) -> Path:
    """``out/<probe>.json`` (settings + summary), and ``out/<probe>_items.jsonl`` again when ``records`` add columns
    to the runner's items (which `resolve` already saved). Returns the JSON's path."""
    if records is not None:
        write_jsonl(out / f"{probe}_items.jsonl", records)
    return write_json(out / f"{probe}.json", {"probe": probe, "settings": settings, "summary": summary})


def read_items(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``<probe>_items.jsonl`` (DataError naming the file and line when malformed)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} does not exist; run the probe that writes it (mechopd probe ...)")
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
            [rec[k] for k in ("prompt_ids_x", "prompt_ids_c", "response_ids")]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise DataError(f"{p} line {i}: expected prompt_ids_x, prompt_ids_c and response_ids") from None
        out.append(rec)
    return out


def batches_of(
    records: Sequence[Mapping[str, Any]], pad: int, batch_size: int = ProbeSetup.batch_size
) -> Iterator[TwoViewBatch]:
    """The saved items as `TwoViewBatch`es (left layout), in file order: the exact ids the probe scored."""
    for i in range(0, len(records), batch_size):
        chunk = records[i : i + batch_size]
        yield assemble_two_views(
            [r["prompt_ids_x"] for r in chunk],
            [r["prompt_ids_c"] for r in chunk],
            [r["response_ids"] for r in chunk],
            pad,
        )


def load_summary(probes_dir: Path, probe: str) -> dict[str, Any] | None:
    """``<probe>.json`` of a probes dir (None when the probe did not run)."""
    path = Path(probes_dir) / f"{probe}.json"
    return read_json(path) if path.is_file() else None


class CausalSummary:
    """A causal probe's typed result in a probes dir: ``settings`` and ``summary`` of ``<PROBE>.json`` and the rows of
    ``<PROBE>.csv`` (cells as text). Subclasses name ``PROBE`` and give ``lines()`` (the report's bullets)."""

    PROBE = ""

    def __init__(self, doc: Mapping[str, Any], rows: list[dict[str, str]]) -> None:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("summary"), Mapping):
            raise DataError(f"{self.PROBE}.json has no 'summary' object; rerun mechopd probe {self.PROBE}")
        self.settings, self.summary, self.rows = dict(doc.get("settings") or {}), dict(doc["summary"]), rows

    @classmethod
    def load(cls, probes_dir: str | os.PathLike) -> Any:
        """The result in ``probes_dir``; None when the probe did not run there."""
        doc = load_summary(Path(probes_dir), cls.PROBE)
        return None if doc is None else cls(doc, read_csv(Path(probes_dir) / f"{cls.PROBE}.csv"))

    def lines(self) -> list[str]:
        raise NotImplementedError


__all__ = [
    "CausalRun",
    "CausalSummary",
    "batches_of",
    "item_records",
    "kl_rows",
    "load_summary",
    "logp",
    "read_items",
    "resolve",
    "save",
]
