"""Activation patching between the two views: which site and component carries the context's effect on the output
(docs/method.md, "Patching").

Positions: the scored positions (the last prompt token and every response token but the last; index t predicts
response token t and is the same token in both views: left padding, core/views.py). The two views have different prompt
lengths; only these response-aligned positions are patched, column for column, so the prompt positions of each view
keep their own states and attention still reads the recipient's own prompt.

For a site s and a component k (``resid``: the residual stream at s, i.e. the output of the embedding / decoder layer
i / final norm; ``attn`` / ``mlp``: the output of decoder layer i's attention / MLP block, site s =
``layers.{i}.resid_post`` naming the layer), with p_x, p_c the clean output distributions (logits / T) of the two
views and the donor's activation a_v(s, k, t):

    c_to_x:  p_x^{s,k} = output of the no-context view with a_x(s, k, t) := a_c(s, k, t) at every scored t
             recovered = 1 − Σ_t KL(p_c ‖ p_x^{s,k}) / Σ_t KL(p_c ‖ p_x)
    x_to_c:  p_c^{s,k} = output of the context view with a_c(s, k, t) := a_x(s, k, t)
             recovered = 1 − Σ_t KL(p_c^{s,k} ‖ p_x) / Σ_t KL(p_c ‖ p_x)

sums over every scored position of every item (token means over the same positions). 1: the patch carries the whole
difference between the views; 0: none of it; negative: the patch moves the output further away. Fixed points (tests):
``final_norm`` / resid / c_to_x gives exactly 1 (the output IS the patched value's head), ``embed`` / resid gives 0 when
the scored positions hold the same token ids in both views (they do: the response and the generation prompt's last
token). With ``window`` W, the resid patches are also applied to one window of W scored positions at a time (rows with
``window`` = "start-end", response indices), the KL still summed over all positions.

Streaming: per batch, the clean captures of both views at every requested site and component (``[B, R, d]`` each) and
the two clean output distributions; one patched forward per (site, component, direction[, window]). Kept across
batches: two float sums per row, and per-token patched KL for the first ``detail`` items (resid, c_to_x).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechopd.core.artifacts import write_csv, write_jsonl
from mechopd.core.errors import ConfigError
from mechopd.models import num_layers
from mechopd.probes import causal_items as ci
from mechopd.probes.capture import component_site, forward, resolve_sites, site_depth, site_layer
from mechopd.probes.options import Role, detail_option, greedy_option, models_option, option, site_list
from mechopd.probes.options import cross as two_models
from mechopd.probes.registry import ProbeSpec, register_probe
from mechopd.core.views import TwoViewBatch

COMPONENTS = ("resid", "attn", "mlp")
DIRECTIONS = ("c_to_x", "x_to_c")
COLUMNS = ("model", "site", "component", "direction", "window", "recovered", "kl_clean", "kl_patched", "depth",
           "layer", "hook", "n_items", "n_tokens")
DETAIL_ITEMS = 16


@dataclass(frozen=True)
class Patch:
    """One patched forward: residual `site`, `component`, the hooked module `hook`, `direction`, `window`."""

    site: str
    component: str
    hook: str
    direction: str
    window: tuple[int, int] | None = None


def plan(model: nn.Module, sites: Sequence[int | str] | None, components: Sequence[str],
         directions: Sequence[str] = DIRECTIONS) -> list[Patch]:
    """Every (site, component, direction) to patch: resid at each requested residual site, attn / mlp at each
    requested decoder layer (their ``layers.{i}.resid_post`` site)."""
    bad = [c for c in components if c not in COMPONENTS] + [d for d in directions if d not in DIRECTIONS]
    if bad:
        raise ConfigError(f"patching: {', '.join(bad)} unknown; components are {', '.join(COMPONENTS)}, directions "
                          f"{', '.join(DIRECTIONS)}")
    out = []
    for site in resolve_sites(model, sites):
        layer = site_layer(site)
        for comp in components:
            if comp == "resid":
                out += [Patch(site, comp, site, d) for d in directions]
            elif layer is not None:
                out += [Patch(site, comp, component_site(layer, comp), d) for d in directions]
    return out


def windows(patches: Sequence[Patch], width: int | None, length: int) -> list[Patch]:
    """The resid patches again, one per window of `width` scored positions covering ``0..length-1``."""
    if width is None:
        return []
    if width < 1:
        raise ConfigError(f"window {width} is invalid: pass a number of positions >= 1")
    return [Patch(p.site, p.component, p.hook, p.direction, (a, min(a + width, length)))
            for p in patches if p.component == "resid" for a in range(0, length, width)]


@dataclass
class PatchResult:
    """``rows`` (one per patch, `COLUMNS`) and ``tokens`` (per detail item: per-token clean / patched KL)."""

    rows: list[dict[str, Any]]
    tokens: list[dict[str, Any]] = field(default_factory=list)


class PatchAccumulator:
    """Running sums of one model's patching experiment (module docstring)."""

    def __init__(self, model: nn.Module, patches: Sequence[Patch], temperature: float, *, window: int | None = None,
                 detail: int = DETAIL_ITEMS) -> None:
        self.model, self.patches, self.T, self.window, self.detail = model, list(patches), temperature, window, detail
        self.hooks = list(dict.fromkeys(p.hook for p in self.patches))
        self.clean = 0.0
        self.n = self.items = 0
        self.sums: dict[Patch, float] = defaultdict(float)
        self.tokens: list[dict[str, Any]] = []

    def add(self, batch: TwoViewBatch) -> None:
        batch = batch.to(next(self.model.parameters()).device)
        mask = batch.response_mask
        fx = forward(self.model, batch, "x", capture=self.hooks, positions="predict")
        fc = forward(self.model, batch, "c", capture=self.hooks, positions="predict")
        lp = {"x": ci.logp(fx.logits, self.T), "c": ci.logp(fc.logits, self.T)}
        caps = {"x": fx, "c": fc}
        kl0 = ci.kl_rows(lp["c"], lp["x"])  # [B, R]
        clean = float(kl0[mask].double().sum())
        keep = max(0, min(batch.batch_size, self.detail - self.items))
        detail = [{"item": self.items + j, "kl": _round(kl0[j][mask[j]]), "kl_patched": {}} for j in range(keep)]
        here = [*self.patches, *windows(self.patches, self.window, mask.shape[1])]
        for p in here:
            if p not in self.sums:  # a window first seen now: in earlier (shorter) batches it patched nothing
                self.sums[p] = self.clean if p.window is not None else 0.0
            kl = self._patched(batch, p, caps, lp)
            self.sums[p] += float(kl[mask].double().sum())
            if p.component == "resid" and p.direction == "c_to_x" and p.window is None:
                for j, d in enumerate(detail):
                    d["kl_patched"][p.site] = _round(kl[j][mask[j]])
        for p in set(self.sums) - set(here):  # a window past this batch's responses patches nothing
            self.sums[p] += clean
        self.clean += clean
        self.tokens += detail
        self.n += int(mask.sum())
        self.items += batch.batch_size

    def _patched(self, batch: TwoViewBatch, p: Patch, caps: dict, lp: dict) -> torch.Tensor:
        """``[B, R]`` KL of the patched view against the other view's clean distribution."""
        recipient, donor = ("x", "c") if p.direction == "c_to_x" else ("c", "x")
        mask = batch.response_mask
        if p.window is not None:
            cols = torch.arange(mask.shape[1], device=mask.device)
            mask = mask & (cols >= p.window[0]) & (cols < p.window[1])
        out = forward(self.model, batch, recipient, edit={p.hook: caps[donor][p.hook]}, positions="predict",
                      mask=mask)
        patched = ci.logp(out.logits, self.T)
        return ci.kl_rows(lp["c"], patched) if recipient == "x" else ci.kl_rows(patched, lp["x"])

    def result(self, label: str, n_layers: int) -> PatchResult:
        rows = []
        for p in self.sums:  # first-seen order: the plan, then its windows
            kl0, kl1 = self.clean / max(self.n, 1), self.sums[p] / max(self.n, 1)
            rows.append({"model": label, "site": p.site, "component": p.component, "direction": p.direction,
                         "window": "all" if p.window is None else f"{p.window[0]}-{p.window[1] - 1}",
                         "recovered": 1.0 - self.sums[p] / self.clean if self.clean > 0 else float("nan"),
                         "kl_clean": kl0, "kl_patched": kl1, "depth": site_depth(p.site, n_layers),
                         "layer": site_layer(p.site), "hook": p.hook, "n_items": self.items, "n_tokens": self.n})
        return PatchResult(rows, [{**d, "model": label} for d in self.tokens])


def _round(t: torch.Tensor) -> list[float]:
    return [float(f"{float(v):.7g}") for v in t]  # 7 significant digits


def patching(model: nn.Module, batches: Iterable[TwoViewBatch], *, temperature: float,
             sites: Sequence[int | str] | None = None, components: Sequence[str] = COMPONENTS,
             directions: Sequence[str] = DIRECTIONS, window: int | None = None, label: str = "model",
             detail: int = DETAIL_ITEMS) -> PatchResult:
    """Two-view patching of one model over a stream of batches (module docstring): a pure function of both."""
    model.eval()
    acc = PatchAccumulator(model, plan(model, sites, components, directions), temperature, window=window,
                           detail=detail)
    for batch in batches:
        acc.add(batch)
    return acc.result(label, num_layers(model))


# -------------------------------------------------------------------------------------- `mechopd probe patching`

@dataclass(frozen=True)
class PatchingOptions:
    """`mechopd probe patching`'s options (`mechopd.probes.options`)."""

    models: list[Role] | None = models_option()
    layers: str | None = option(None, "comma-separated decoder layers or site names (default: every residual site)")
    components: str = option(",".join(COMPONENTS), "comma-separated of resid,attn,mlp")
    window: int | None = option(None, "also patch the residual one window of W scored positions at a time",
                                metavar="W", range=(1, None))
    cross: str | None = option(None, "patch DONOR's context-view residual into RECIPIENT's, e.g. nca,opd",
                               metavar="DONOR,RECIPIENT")
    cross_sites: str | None = option(None, "sites of --cross: comma-separated decoder layers or site names (default: "
                                      "every residual site)")
    greedy: bool = greedy_option()
    detail: int = detail_option(DETAIL_ITEMS)


def run_patching(setup: Any, out_dir: str | Path, *, models: Sequence[str] | Mapping[str, str] | None = None,
                 layers: Sequence[int | str] | None = None, components: Sequence[str] = COMPONENTS,
                 window: int | None = None, cross: tuple[str, str] | None = None,
                 cross_sites: Sequence[int | str] | None = None, greedy: bool = False, detail: int = DETAIL_ITEMS,
                 device: str | None = None, dtype: torch.dtype | None = None) -> Path:
    """Every model on the same items; writes patching.csv, patching_tokens.jsonl, patching_items.jsonl,
    patching.json, and with ``cross=(donor, recipient)`` patching_cross.csv (`mechopd.probes.crosspatch`)."""
    run = ci.resolve(setup, models, probe="patching", out=out_dir, greedy=greedy, device=device,
                     dtype=dtype)
    out = Path(out_dir)
    results = {label: patching(model, run.items, temperature=run.temperature, sites=layers, components=components,
                               window=window, label=label, detail=detail)
               for label, model in run.each_model()}
    rows = [r for res in results.values() for r in res.rows]
    write_csv(out / "patching.csv", rows, COLUMNS)
    write_jsonl(out / "patching_tokens.jsonl",
                [{**t, "uid": run.items.examples[t["item"]].uid} for res in results.values() for t in res.tokens])
    summary: dict[str, Any] = {"models": list(results), "best": _best(rows)}
    if cross is not None:
        from mechopd.probes.crosspatch import run_cross

        summary["cross"] = run_cross(run, out, cross, cross_sites)
    settings = run.settings(components=list(components), window=window, cross=list(cross) if cross else None,
                            greedy=greedy, detail_items=detail)
    ci.save(out, "patching", run, settings, summary)
    return out / "patching.csv"


def _best(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per model: the shallowest decoder-layer resid site whose c_to_x patch recovers >= half of the output KL."""
    out = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        resid = [r for r in rows if r["model"] == model and r["component"] == "resid" and r["direction"] == "c_to_x"
                 and r["window"] == "all" and r["layer"] is not None]
        half = next((r for r in sorted(resid, key=lambda r: r["depth"]) if r["recovered"] >= 0.5), None)
        comp = [r for r in rows if r["model"] == model and r["component"] != "resid" and r["direction"] == "c_to_x"
                and r["window"] == "all"]
        top = max(comp, key=lambda r: r["recovered"], default=None)
        out[model] = {"half_site": half["site"] if half else None,
                      "top_component": f"{top['component']} of layer {top['layer']}" if top else None,
                      "top_component_recovered": top["recovered"] if top else None}
    return out


class PatchingSummary(ci.CausalSummary):
    """The patching probe's result: ``recovered(model, site, component, direction)`` and the report's ``lines()``."""

    PROBE = "patching"

    def recovered(self, model: str, site: str, component: str = "resid", direction: str = "c_to_x") -> float | None:
        from mechopd.core.artifacts import read_float

        row = next((r for r in self.rows if (r["model"], r["site"], r["component"], r["direction"], r["window"]) ==
                    (model, site, component, direction, "all")), None)
        return None if row is None else read_float(row["recovered"])

    def lines(self) -> list[str]:
        s = self.summary
        parts = [f"{m}: half the output KL recovered at {b['half_site'] or 'no decoder layer'}, top component "
                 f"{b['top_component']} ({_f(b['top_component_recovered'])})"
                 for m, b in s["best"].items() if b["top_component"] is not None]
        lines = ["- Activation patching c→x (`probes/patching.csv`): " + "; ".join(parts)] if parts else []
        for c in s.get("cross", {}).get("rows", [])[:1]:
            lines.append(f"- Cross-checkpoint patch {c['donor']}→{c['recipient']} (context view, {c['site']}): "
                         f"Δ answer log-prob {_f(c['dlogp'], '+.3f')}, Harm {_f(c['harm'])} → "
                         f"{_f(c['harm_patched'])} (`probes/patching_cross.csv`)")
        return lines


def report(probes_dir: Path) -> list[str]:
    result = PatchingSummary.load(probes_dir)
    return result.lines() if result is not None else []


def _f(v: float | None, spec: str = ".2f") -> str:
    """A summary number for a report line (null / NaN: "n/a")."""
    return "n/a" if v is None or v != v else format(v, spec)


def cli_run(setup: Any, out: Path, *, models: list[str] | None, layers: str | None, components: str,
            window: int | None, cross: str | None, cross_sites: str | None, greedy: bool, detail: int) -> list[str]:
    """`mechopd probe patching`: run, then the lines to print."""
    path = run_patching(setup, out, models=models, layers=site_list(layers, "--layers"),
                        components=site_list(components, "--components") or [], window=window,
                        cross=two_models(cross), cross_sites=site_list(cross_sites, "--cross-sites"), greedy=greedy,
                        detail=detail)
    return [f"patching table: {path}"] + report(out)


register_probe(ProbeSpec(
    "patching", "activation patching between the views (sites x components) and between checkpoints", cli_run,
    options=PatchingOptions, order=60,
    outputs=("patching.csv", "patching.json", "patching_items.jsonl", "patching_tokens.jsonl"),
    demo={"models": ["base", "opd", "nca"], "cross": "nca,opd"}, role_options=("models", "cross"),
    summary=PatchingSummary,
))
