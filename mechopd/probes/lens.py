"""Logit lens per view: where in depth the context changes the next-token distribution (docs/method.md, "Lens").

Positions: the scored positions -- the last prompt token and every response token but the last, whose logits predict
response token t (``positions="predict"``; generate/scorer.py scores the same ones), index t the same token in both
views. At each residual site s (``embed``, ``layers.{i}.resid_post``, ``final_norm``) the residual h_s is decoded
through the model's own final norm and LM head (at ``final_norm`` the head only: that site is already normalised),
with the rollout temperature T:

    p_v^s(· | t) = softmax(W_U · norm(h_s(v, t)) / T),   v ∈ {x, c}

and per site, over all scored positions of all items (token mean):

    kl_c_x(s)     = mean_t KL(p_c^s ‖ p_x^s) = mean_t Σ_w p_c^s(w) (log p_c^s(w) − log p_x^s(w))
    top1_agree(s) = mean_t [argmax p_c^s = argmax p_x^s]
    gain_s(w)     = mean_t (p_c^s(w) − p_x^s(w))     the tokens the context promotes most (summary): the probability
                                                     mass moved to w, so only tokens either view makes likely rank
                                                     (a mean log-ratio over the vocabulary is won by rare tokens)

At ``final_norm`` the lens IS the model's output, so kl_c_x there is the output KL between the views.

Streaming: per batch, the no-context view's captures ``[B, R, d]`` per site are held until the context view's hook of
the same site decodes both (as the similarity probe does); decoded ``[B, R, V]`` tensors live for one site at a time.
Kept across batches per site: three scalars and one ``[V]`` float64 gain sum; per-token values only for the first
``detail`` items (for `mechopd explore`). Memory does not grow with the number of items.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechopd.core.artifacts import read_float, write_csv, write_jsonl
from mechopd.core.options import option
from mechopd.core.sites import site_depth, site_layer
from mechopd.core.views import TwoViewBatch
from mechopd.models import module_at, num_layers
from mechopd.models.arch import soft_cap
from mechopd.probes import causal_items as ci
from mechopd.probes.capture import forward, resolve_sites
from mechopd.probes.options import Role, cache_option, detail_option, greedy_option, models_option, normalise, site_list
from mechopd.probes.registry import ProbeSpec, register_probe
from mechopd.probes.store import ActivationStore

COLUMNS = ("model", "site", "depth", "layer", "n_items", "n_tokens", "kl_c_x", "top1_agree")
DETAIL_ITEMS = 16
TOP_K = 3
PROMOTED = 8


def lens_logits(model: nn.Module, site: str, h: torch.Tensor) -> torch.Tensor:
    """``[..., d]`` residual at `site` -> ``[..., V]`` logits: LM head of the final norm (the head only at final_norm).
    The modules' ``forward`` is called directly: no hook fires (this runs inside a traced forward)."""
    get_head: Any = model.get_output_embeddings  # transformers' PreTrainedModel API (untyped on nn.Module)
    head = get_head()
    logits = head.forward(h if site == "final_norm" else module_at(model, "final_norm").forward(h))
    return soft_cap(model, logits)


@dataclass
class _Site:
    kl: float = 0.0
    agree: float = 0.0
    n: int = 0
    gain: torch.Tensor | None = None  # [V] float64 sum of p_c - p_x (probability mass moved by the context)
    per_item: list[tuple[float, int]] = field(default_factory=list)  # per item: (KL summed over its tokens, tokens)


@dataclass
class LensResult:
    """``rows`` (one per site, `COLUMNS`), ``promoted`` {site: [(token id, mean probability moved)]}, ``tokens`` per detail item."""

    rows: list[dict[str, Any]]
    promoted: dict[str, list[tuple[int, float]]]
    tokens: list[dict[str, Any]] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)  # per (item, site): n_tokens, kl_sum (claims)


class LensAccumulator:
    """Running per-site lens statistics of one model (module docstring)."""

    def __init__(self, model: nn.Module, sites: Sequence[str], temperature: float, detail: int = DETAIL_ITEMS):
        self.model, self.sites, self.T, self.detail = model, list(sites), temperature, detail
        self.stats = {s: _Site() for s in self.sites}
        self.tokens: list[dict[str, Any]] = []
        self.items = 0

    def add(self, batch: TwoViewBatch) -> None:
        """Both views of one batch: the no-context captures held, decoded when the context view's hook fires."""
        batch = batch.to(next(self.model.parameters()).device)
        mask = batch.response_mask  # [B, R]: position t predicts a real token
        detail = self._detail(mask)
        self._decode_pair(batch, mask, detail)
        self._done(mask, detail)

    def add_captured(self, mask: torch.Tensor, pairs: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """A batch read from an activation store: ``{site: (h_x, h_c)}`` ``[B, R, d]`` at the predicting positions."""
        dev = next(self.model.parameters()).device
        mask, detail = mask.to(dev), self._detail(mask)
        with torch.inference_mode():
            for s in self.sites:
                lp_x, lp_c = (ci.logp(lens_logits(self.model, s, h.to(dev)), self.T) for h in pairs[s])
                self._accumulate(s, lp_x, lp_c, mask, detail)
        self._done(mask, detail)

    def _detail(self, mask: torch.Tensor) -> list[dict]:
        return [{"kl": {}} for _ in range(max(0, min(mask.shape[0], self.detail - self.items)))]

    def _done(self, mask: torch.Tensor, detail: list[dict]) -> None:
        for j, d in enumerate(detail):
            d.update(item=self.items + j, n=int(mask[j].sum()))
        self.tokens += detail
        self.items += mask.shape[0]

    def _decode_pair(self, batch: TwoViewBatch, mask: torch.Tensor, detail: list[dict]) -> None:
        xs = forward(self.model, batch, "x", head=False, capture=self.sites, positions="predict")

        def on_c(site: str, hc: torch.Tensor) -> None:
            lp_x = ci.logp(lens_logits(self.model, site, xs.pop(site)), self.T)  # [B, R, V]
            lp_c = ci.logp(lens_logits(self.model, site, hc), self.T)
            self._accumulate(site, lp_x, lp_c, mask, detail)

        forward(
            self.model, batch, "c", head=False, capture=self.sites, positions="predict", on_capture=on_c, copy=False
        )

    def _accumulate(
        self, site: str, lp_x: torch.Tensor, lp_c: torch.Tensor, mask: torch.Tensor, detail: list[dict]
    ) -> None:
        st = self.stats[site]
        kl = ci.kl_rows(lp_c, lp_x)  # [B, R]
        agree = lp_c.argmax(-1) == lp_x.argmax(-1)  # [B, R]
        st.kl += float(kl[mask].double().sum())
        st.agree += float(agree[mask].sum())
        st.n += int(mask.sum())
        st.per_item += [(float(v), int(c)) for v, c in zip((kl * mask).double().sum(1), mask.sum(1))]
        g = (lp_c.double().exp() - lp_x.double().exp())[mask].sum(0)  # [V]: mass moved, not a log-ratio
        st.gain = g if st.gain is None else st.gain + g
        for j, d in enumerate(detail):
            m = mask[j]
            d["kl"][site] = [float(f"{float(v):.7g}") for v in kl[j][m]]
            if site == "final_norm":
                d["top_x"], d["top_c"] = _top(lp_x[j][m]), _top(lp_c[j][m])

    def result(self, label: str, n_layers: int) -> LensResult:
        rows, promoted = [], {}
        for s in self.sites:
            st = self.stats[s]
            rows.append(
                {
                    "model": label,
                    "site": s,
                    "depth": site_depth(s, n_layers),
                    "layer": site_layer(s),
                    "n_items": self.items,
                    "n_tokens": st.n,
                    "kl_c_x": st.kl / st.n if st.n else float("nan"),
                    "top1_agree": st.agree / st.n if st.n else float("nan"),
                }
            )
            if st.gain is not None and st.n:
                vals, ids = (st.gain / st.n).topk(min(PROMOTED, st.gain.numel()))
                promoted[s] = [(int(i), float(v)) for i, v in zip(ids, vals)]
        examples = [
            {"model": label, "example": i, "site": s, "n_tokens": n, "kl_sum": v}
            for s in self.sites
            for i, (v, n) in enumerate(self.stats[s].per_item)
        ]
        return LensResult(rows, promoted, [{**d, "model": label} for d in self.tokens], examples)


def _top(lp: torch.Tensor, k: int = TOP_K) -> list[list[list[float]]]:
    """``[n, V]`` log-probs -> per position the top-k ``[token id, probability]`` pairs."""
    vals, ids = lp.topk(min(k, lp.shape[-1]), dim=-1)
    return [[[int(i), round(float(v), 5)] for i, v in zip(ii, vv)] for ii, vv in zip(ids, vals.exp())]


def lens(
    model: nn.Module,
    batches: Iterable[TwoViewBatch],
    *,
    temperature: float,
    sites: Sequence[int | str] | None = None,
    label: str = "model",
    detail: int = DETAIL_ITEMS,
    store: Any = None,
    progress: bool = False,
) -> LensResult:
    """The lens statistics of one model over a stream of batches (module docstring): a pure function of both.
    store: an activation store (`probes.store.ActivationStore`) holding `label`: its captures replace the forwards.
    progress: a bar over the batches (``lens LABEL``; minutes for a real model on a CPU)."""
    from tqdm.auto import tqdm

    model.eval()
    acc = LensAccumulator(model, resolve_sites(model, sites), temperature, detail)
    if store is not None:
        for mask, pairs in tqdm(
            store.batches(label, acc.sites, "predict"), desc=f"lens {label}", disable=not progress, leave=False
        ):
            acc.add_captured(mask, pairs)
    for batch in tqdm(batches if store is None else (), desc=f"lens {label}", disable=not progress, leave=False):
        acc.add(batch)
    return acc.result(label, num_layers(model))


# ------------------------------------------------------------------------------------------ `mechopd probe lens`


@dataclass(frozen=True)
class LensOptions:
    """`mechopd probe lens`'s options (`mechopd.probes.options`)."""

    models: list[Role] | None = models_option()
    layers: Sequence[int | str] | None = option(
        None, "comma-separated decoder layers or site names (default: every residual site)"
    )
    greedy: bool = greedy_option()
    detail: int = detail_option(DETAIL_ITEMS)
    cache: str | None = cache_option()

    def __post_init__(self) -> None:  # the list's syntax before any model loads
        normalise(self, layers=site_list)


def run_lens(
    setup: Any,
    out_dir: str | Path,
    opts: LensOptions | None = None,
    *,
    device: str | None = None,
    dtype: torch.dtype | None = None,
) -> list[str]:
    """Every model on the same items and responses; writes lens.csv, lens_tokens.jsonl, lens_items.jsonl, lens.json;
    returns the lines `mechopd probe lens` prints. opts.cache: an activation store (`mechopd probe cache`): its items,
    responses and residuals (the head still runs)."""
    opts = opts or LensOptions()
    store, setup = ActivationStore.open(opts.cache, setup)  # (None, setup) without a cache
    run = ci.resolve(setup, opts.models, probe="lens", out=out_dir, greedy=opts.greedy, device=device, dtype=dtype)
    out = Path(out_dir)
    if store is not None:
        store.check(list(run.models), [])
        store.check_models(run.models)
        store.check_items(out / "lens_items.jsonl")
    results = {
        label: lens(
            model,
            run.items,
            temperature=run.temperature,
            sites=opts.layers,
            label=label,
            detail=opts.detail,
            store=store,
            progress=True,
        )
        for label, model in run.each_model()
    }
    write_csv(out / "lens.csv", [r for res in results.values() for r in res.rows], COLUMNS)
    write_csv(
        out / "lens_examples.csv",
        [{**e, "uid": run.items.examples[e["example"]].uid} for res in results.values() for e in res.examples],
        ["model", "example", "uid", "site", "n_tokens", "kl_sum"],
    )  # per item: the claims' item bootstrap
    tok = run.tokenizer
    write_jsonl(out / "lens_tokens.jsonl", _token_records(results, run))
    summary = {
        "models": list(results),
        "output_kl": {m: _at(r.rows, "final_norm") for m, r in results.items()},
        "promoted": {
            m: {s: [[tok.decode([i]), g] for i, g in v] for s, v in r.promoted.items()} for m, r in results.items()
        },
    }
    ci.save(
        out,
        "lens",
        run,
        run.settings(
            sites=[r["site"] for r in next(iter(results.values())).rows], greedy=opts.greedy, detail_items=opts.detail
        ),
        summary,
    )
    return [f"lens table: {out / 'lens.csv'}"] + report(out)


def _token_records(results: Mapping[str, LensResult], run: Any) -> list[dict[str, Any]]:
    """The detail items' per-token records of ``lens_tokens.jsonl``: tokens and top-k pairs decoded."""
    tok = run.tokenizer
    return [
        {
            **t,
            "uid": run.items.examples[t["item"]].uid,
            "tokens": [tok.decode([i]) for i in run.items.responses[t["item"]]],
            **{k: [[[tok.decode([i]), p] for i, p in pos] for pos in t[k]] for k in ("top_x", "top_c") if k in t},
        }
        for res in results.values()
        for t in res.tokens
    ]


def _at(rows: list[dict], site: str) -> float | None:
    return next((r["kl_c_x"] for r in rows if r["site"] == site), None)


class LensSummary(ci.CausalSummary):
    """The lens probe's result: ``kl_by_depth(model)`` (the claims read it) and the report's ``lines()``."""

    PROBE = "lens"

    def kl_by_depth(self, model: str) -> list[float]:
        """kl_c_x after each decoder layer and at the output, in depth order (embed left out: 0 by construction)."""
        rows = [r for r in self.rows if r["model"] == model and r["site"] != "embed"]
        return [read_float(r["kl_c_x"]) for r in sorted(rows, key=lambda r: int(r["depth"]))]

    def lines(self) -> list[str]:
        s = self.summary
        parts = [f"{m} {v:.4f}" for m, v in s["output_kl"].items() if v is not None]
        top = {m: ", ".join(repr(t) for t, _ in v.get("final_norm", [])[:3]) for m, v in s["promoted"].items()}
        return [
            f"- Logit lens: output KL(p_c ‖ p_x) between views {'; '.join(parts)} (`probes/lens.csv`, per "
            "depth); tokens the context promotes most: " + "; ".join(f"{m}: {t}" for m, t in top.items())
        ]


def report(probes_dir: Path) -> list[str]:
    """Report lines: the output KL between views per model and the tokens the context promotes most."""
    result = LensSummary.load(probes_dir)
    return result.lines() if result is not None else []


register_probe(
    ProbeSpec(
        "lens",
        "logit lens per view: KL between the views' decoded residual at every depth",
        run_lens,
        options=LensOptions,
        order=50,
        outputs=("lens.csv", "lens.json", "lens_items.jsonl", "lens_tokens.jsonl", "lens_examples.csv"),
        demo={"models": ["base", "opd", "nca"]},
        role_options=("models",),
        reads_teacher=True,  # forward only: the study's teacher, of any depth and width, among the models
        summary=LensSummary,
    )
)
