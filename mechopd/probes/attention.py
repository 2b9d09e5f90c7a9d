"""Attention on the context: how much of each head's attention the scored positions put on the context's tokens
(docs/method.md, "Attention on the context").

In the CONTEXT view, for decoder layer l, head h and scored position t (the last prompt token and every response token
but the last; index t predicts response token t), with A_{l,h}(t, j) the softmax attention weight of query t on key
column j (eager attention, so the weights exist) and C the key columns of the context's token span:

    context_share(l, h) = mean_t Σ_{j ∈ C} A_{l,h}(t, j)        other_share(l, h) = mean_t Σ_{j ∉ C} A_{l,h}(t, j)

token mean over every scored position of every item. Each attention row sums to 1 (padding columns get weight 0), so
context_share + other_share = 1 per head: the probe computes both sums independently and the tests check it.

The context span: the tokens of the rendered context-view prompt whose character offsets overlap the context text
(found in the rendered text: inside the system message for ``system`` placement, at the head of the user turn for
``user`` placement), located with the tokenizer's offset mapping on exactly the ids the views use (checked).

Streaming: one hook per layer reduces ``[B, H, L, L]`` to ``[B, R, H]`` sums while the forward runs; the forward
stops after the last layer's attention. Kept: two ``[H]`` float64 sums per layer; for the first ``detail`` items
(``attention_tokens.jsonl``) the per-token share per layer (``ctx_share``, mean over heads) and per head
(``ctx_heads`` ``{layer: [R][H]}``), each head's attention on each context token averaged over the scored positions
(``ctx_keys`` ``{layer: [H][Lc]}``) and the context tokens' strings (``ctx_tokens``). Eager attention materialises ``[B, H, L, L]`` per layer: choose the batch size accordingly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechopd.core.artifacts import read_float, write_csv, write_jsonl
from mechopd.core.errors import DataError, ModelError
from mechopd.core.views import TwoViewBatch, render_prompt_ids, render_prompt_text
from mechopd.models import num_layers
from mechopd.probes import causal_items as ci
from mechopd.probes.capture import _gather, component_site, forward
from mechopd.probes.options import Role, detail_option, greedy_option, models_option
from mechopd.probes.registry import ProbeSpec, register_probe

COLUMNS = ("model", "layer", "head", "context_share", "other_share", "n_items", "n_tokens")
DETAIL_ITEMS = 16
TOP_HEADS = 5


def context_span(tokenizer: Any, prompt: str, context: str, spec: Any) -> tuple[int, int]:
    """``(start, end)`` token indices of the context inside the context view's prompt ids (`render_prompt_ids`)."""
    text = render_prompt_text(tokenizer, prompt, context, spec)
    enc = tokenizer(
        text, add_special_tokens=not bool(getattr(tokenizer, "chat_template", None)), return_offsets_mapping=True
    )
    if list(enc["input_ids"]) != render_prompt_ids(tokenizer, prompt, context, spec):
        raise DataError("the context view's ids differ when tokenized with offsets; use a fast tokenizer")
    a = text.find(context)
    if a < 0 or not context:
        raise DataError(f"the context {context[:40]!r} is not in the rendered context view; check the placement")
    b = a + len(context)
    toks = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if e > s and e > a and s < b]
    return toks[0], toks[-1] + 1


@contextmanager
def eager(model: nn.Module) -> Iterator[None]:
    """Eager attention while open (its attention blocks return the weights), the model's own afterwards."""
    hf: Any = model  # a transformers PreTrainedModel: its config and set_attn_implementation are untyped on nn.Module
    before = hf.config._attn_implementation
    hf.set_attn_implementation("eager")
    try:
        yield
    finally:
        hf.set_attn_implementation(before)


class AttentionAccumulator:
    """Running per-(layer, head) context / other attention sums of one model (module docstring)."""

    def __init__(self, model: nn.Module, detail: int = DETAIL_ITEMS) -> None:
        self.model, self.detail = model, detail
        cfg: Any = model.config  # a transformers config (nn.Module.__getattr__ is typed Tensor | Module)
        self.L, self.H = num_layers(model), int(cfg.num_attention_heads)
        self.ctx = torch.zeros(self.L, self.H, dtype=torch.float64)
        self.other = torch.zeros(self.L, self.H, dtype=torch.float64)
        self.n = self.items = 0
        self.tokens: list[dict[str, Any]] = []

    def add(self, batch: TwoViewBatch, spans: Sequence[tuple[int, int]]) -> None:
        """The context view of one batch; ``spans``: each row's context span in its prompt ids."""
        batch = batch.to(next(self.model.parameters()).device)
        mask = batch.response_mask  # [B, R]
        keys = self._context_columns(batch, spans)  # [B, Lc] bool
        keep = max(0, min(batch.batch_size, self.detail - self.items))
        detail: list[dict[str, Any]] = [
            {"item": self.items + j, "ctx_share": {}, "ctx_heads": {}, "ctx_keys": {}} for j in range(keep)
        ]
        sites = [component_site(i, "attn") for i in range(self.L)]

        def on_output(site: str, output: Any, cols: torch.Tensor) -> None:
            w = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if w is None:
                raise ModelError("the attention block returned no weights; the probe needs eager attention")
            layer = int(site.split(".")[1])
            wq = _gather(w.permute(0, 2, 1, 3), cols, batch.layout).float()  # [B, R, H, Lk]
            k = keys[:, None, None, : wq.shape[-1]].to(wq.dtype)
            ctx, other = (wq * k).sum(-1), (wq * (1 - k)).sum(-1)  # [B, R, H]
            self.ctx[layer] += ctx[mask].double().sum(0).cpu()
            self.other[layer] += other[mask].double().sum(0).cpu()
            for j, d in enumerate(detail):
                d["ctx_share"][str(layer)] = [round(float(v), 5) for v in ctx[j][mask[j]].mean(-1)]
                d["ctx_heads"][str(layer)] = [[round(float(v), 5) for v in t] for t in ctx[j][mask[j]]]  # [R, H]
                onto = wq[j][mask[j]][..., keys[j, : wq.shape[-1]]].mean(0)  # [H, Lc]: mean over scored positions
                d["ctx_keys"][str(layer)] = [[round(float(v), 5) for v in h] for h in onto]

        with eager(self.model):
            forward(self.model, batch, "c", head=False, extra=sites, positions="predict", on_output=on_output)
        self.tokens += detail
        self.n += int(mask.sum())
        self.items += batch.batch_size

    @staticmethod
    def _context_columns(batch: TwoViewBatch, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
        """``[B, Lc]`` True at each row's context key columns (left layout: the prompt ends at column P)."""
        P = int(batch.cols_c[0, 0])
        lens = batch.attention_mask_c[:, :P].sum(1)  # prompt length per row
        cols = torch.arange(batch.input_ids_c.shape[1], device=lens.device)[None]
        start = (P - lens)[:, None] + torch.tensor([s for s, _ in spans], device=lens.device)[:, None]
        end = (P - lens)[:, None] + torch.tensor([e for _, e in spans], device=lens.device)[:, None]
        return (cols >= start) & (cols < end)

    def rows(self, label: str) -> list[dict[str, Any]]:
        n = max(self.n, 1)
        return [
            {
                "model": label,
                "layer": layer,
                "head": h,
                "context_share": float(self.ctx[layer, h] / n),
                "other_share": float(self.other[layer, h] / n),
                "n_items": self.items,
                "n_tokens": self.n,
            }
            for layer in range(self.L)
            for h in range(self.H)
        ]


def attention(
    model: nn.Module,
    batches: Iterable[TwoViewBatch],
    spans: Sequence[tuple[int, int]],
    *,
    label: str = "model",
    detail: int = DETAIL_ITEMS,
) -> tuple[list[dict], list[dict]]:
    """(rows per layer x head, per-token detail) of one model over a batch stream; ``spans`` one per item in order."""
    acc = AttentionAccumulator(model.eval(), detail)
    i = 0
    for batch in batches:
        if batch.layout != "left":
            raise ModelError("the attention probe needs the left-padded layout (core/views.py)")
        acc.add(batch, spans[i : i + batch.batch_size])
        i += batch.batch_size
    return acc.rows(label), [{**d, "model": label} for d in acc.tokens]


def changed_heads(rows: Sequence[Mapping[str, Any]], a: str, b: str, k: int = TOP_HEADS) -> list[dict[str, Any]]:
    """The k heads whose context share changed most from model `a` to model `b` (|share_b − share_a|, largest first)."""
    share = {(r["model"], r["layer"], r["head"]): r["context_share"] for r in rows}
    diffs = [
        {
            "layer": l_,
            "head": h,
            a: share[(a, l_, h)],
            b: share[(b, l_, h)],
            "delta": share[(b, l_, h)] - share[(a, l_, h)],
        }
        for (m, l_, h) in share
        if m == a and (b, l_, h) in share
    ]
    return sorted(diffs, key=lambda d: -abs(d["delta"]))[:k]


# ------------------------------------------------------------------------------------- `mechopd probe attention`


@dataclass(frozen=True)
class AttentionOptions:
    """`mechopd probe attention`'s options (`mechopd.probes.options`)."""

    models: list[Role] | None = models_option()
    greedy: bool = greedy_option()
    detail: int = detail_option(DETAIL_ITEMS)


def run_attention(
    setup: Any,
    out_dir: str | Path,
    opts: AttentionOptions | None = None,
    *,
    device: str | None = None,
    dtype: torch.dtype | None = None,
) -> list[str]:
    """Every model on the same items; writes attention.csv, attention_tokens.jsonl, attention_items.jsonl (with each
    item's ``context_span``) and attention.json (the most-changed heads per model pair); returns the lines
    `mechopd probe attention` prints."""
    opts = opts or AttentionOptions()
    greedy, detail = opts.greedy, opts.detail
    run = ci.resolve(setup, opts.models, probe="attention", out=out_dir, greedy=greedy, device=device, dtype=dtype)
    spans = [context_span(run.tokenizer, ex.prompt, ex.context, run.items.spec) for ex in run.items.examples]
    rows: list[dict[str, Any]] = []
    tokens: list[dict[str, Any]] = []
    for label, model in run.each_model():
        r, t = attention(model, run.items, spans, label=label, detail=detail)
        rows, tokens = rows + r, tokens + t
    out = Path(out_dir)
    write_csv(out / "attention.csv", rows, COLUMNS)
    ctx_ids = [
        render_prompt_ids(run.tokenizer, ex.prompt, ex.context, run.items.spec)[a:b]
        for ex, (a, b) in zip(run.items.examples, spans)
    ]
    write_jsonl(
        out / "attention_tokens.jsonl",
        [
            {
                **t,
                "uid": run.items.examples[t["item"]].uid,
                "ctx_tokens": [run.tokenizer.decode([i]) for i in ctx_ids[t["item"]]],
            }
            for t in tokens
        ],
    )
    labels = list(run.models)
    pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :]]
    summary = {
        "models": labels,
        "changed": {f"{b}-{a}": changed_heads(rows, a, b) for a, b in pairs},
        "mean_share": {
            m: sum(r["context_share"] for r in rows if r["model"] == m)
            / max(1, sum(1 for r in rows if r["model"] == m))
            for m in labels
        },
    }
    records = ci.item_records(run, context_span=[list(s) for s in spans])
    ci.save(
        out, "attention", run, run.settings(greedy=greedy, detail_items=detail, attention="eager"), summary, records
    )
    return [f"attention table: {out / 'attention.csv'}"] + report(out)


class AttentionSummary(ci.CausalSummary):
    """The attention probe's result: ``share(model, layer, head)`` and the report's ``lines()``."""

    PROBE = "attention"

    def share(self, model: str, layer: int, head: int) -> float | None:

        row = next(
            (r for r in self.rows if (r["model"], int(r["layer"]), int(r["head"])) == (model, layer, head)), None
        )
        return None if row is None else read_float(row["context_share"])

    def lines(self) -> list[str]:
        s = self.summary
        mean = "; ".join(f"{m} {v:.3f}" for m, v in s["mean_share"].items())
        lines = [
            f"- Attention on the context (context view, mean over layers × heads): {mean} (`probes/attention.csv`)"
        ]
        for pair, heads in s["changed"].items():
            if heads:
                h = heads[0]
                lines.append(
                    f"- Head whose context share changed most, {pair}: layer {h['layer']} head {h['head']} "
                    f"(Δ {h['delta']:+.3f})"
                )
        return lines


def report(probes_dir: Path) -> list[str]:
    result = AttentionSummary.load(probes_dir)
    return result.lines() if result is not None else []


register_probe(
    ProbeSpec(
        "attention",
        "attention mass on the context span per layer x head (context view, eager attention)",
        run_attention,
        options=AttentionOptions,
        order=70,
        outputs=("attention.csv", "attention.json", "attention_items.jsonl", "attention_tokens.jsonl"),
        demo={"models": ["base", "opd", "nca"]},
        role_options=("models",),
        summary=AttentionSummary,
    )
)
