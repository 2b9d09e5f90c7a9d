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

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mechopd.core.artifacts import read_float, write_csv, write_jsonl
from mechopd.core.errors import ConfigError
from mechopd.core.options import GE1, option
from mechopd.probes import causal_items as ci
from mechopd.probes.crosspatch import run_cross
from mechopd.probes.options import Role, detail_option, greedy_option, models_option, normalise, site_list
from mechopd.probes.options import cross as two_models
from mechopd.probes.patch_views import COLUMNS, COMPONENTS, DETAIL_ITEMS, patching
from mechopd.probes.registry import ProbeSpec, register_probe

# -------------------------------------------------------------------------------------- `mechopd probe patching`


@dataclass(frozen=True)
class PatchingOptions:
    """`mechopd probe patching`'s options (`mechopd.probes.options`)."""

    models: list[Role] | None = models_option()
    layers: Sequence[int | str] | None = option(
        None, "comma-separated decoder layers or site names (default: every residual site)"
    )
    components: Sequence[str] = option(COMPONENTS, "comma-separated of resid,attn,mlp")
    window: int | None = option(
        None, "also patch the residual one window of W scored positions at a time", metavar="W", range=GE1
    )
    cross: Sequence[str] | None = option(
        None, "patch DONOR's context-view residual into RECIPIENT's, e.g. nca,opd", metavar="DONOR,RECIPIENT"
    )
    cross_sites: Sequence[int | str] | None = option(
        None, "sites of --cross: comma-separated decoder layers or site names (default: every residual site)"
    )
    greedy: bool = greedy_option()
    detail: int = detail_option(DETAIL_ITEMS)

    def __post_init__(self) -> None:  # the lists' syntax and the components' names before any model loads
        text = self.components if isinstance(self.components, str) else ",".join(self.components)
        normalise(self, layers=site_list, cross_sites=site_list, cross=two_models, components=site_list)
        bad = [c for c in self.components if c not in COMPONENTS]
        if bad:
            raise ConfigError(f"--components {text!r}: {bad[0]!r} is unknown; use {', '.join(COMPONENTS)}")


def run_patching(
    setup: Any,
    out_dir: str | Path,
    opts: PatchingOptions | None = None,
    *,
    device: str | None = None,
    dtype: torch.dtype | None = None,
) -> list[str]:
    """Every model on the same items; writes patching.csv, patching_tokens.jsonl, patching_items.jsonl,
    patching.json, and with ``opts.cross=(donor, recipient)`` patching_cross.csv (`mechopd.probes.crosspatch`);
    returns the lines `mechopd probe patching` prints."""
    opts = opts or PatchingOptions()
    components, window, cross, greedy, detail = opts.components, opts.window, opts.cross, opts.greedy, opts.detail
    run = ci.resolve(setup, opts.models, probe="patching", out=out_dir, greedy=greedy, device=device, dtype=dtype)
    out = Path(out_dir)
    results = {
        label: patching(
            model,
            run.items,
            temperature=run.temperature,
            sites=opts.layers,
            components=components,
            window=window,
            label=label,
            detail=detail,
        )
        for label, model in run.each_model()
    }
    rows = [r for res in results.values() for r in res.rows]
    write_csv(out / "patching.csv", rows, COLUMNS)
    write_jsonl(
        out / "patching_tokens.jsonl",
        [{**t, "uid": run.items.examples[t["item"]].uid} for res in results.values() for t in res.tokens],
    )
    summary: dict[str, Any] = {"models": list(results), "best": _best(rows)}
    if cross is not None:
        summary["cross"] = run_cross(run, out, (cross[0], cross[1]), opts.cross_sites)
    settings = run.settings(
        components=list(components),
        window=window,
        cross=list(cross) if cross else None,
        greedy=greedy,
        detail_items=detail,
    )
    ci.save(out, "patching", run, settings, summary)
    return [f"patching table: {out / 'patching.csv'}"] + report(out)


def _best(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per model: the shallowest decoder-layer resid site whose c_to_x patch recovers >= half of the output KL."""
    out = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        resid = [
            r
            for r in rows
            if r["model"] == model
            and r["component"] == "resid"
            and r["direction"] == "c_to_x"
            and r["window"] == "all"
            and r["layer"] is not None
        ]
        half = next((r for r in sorted(resid, key=lambda r: r["depth"]) if r["recovered"] >= 0.5), None)
        comp = [
            r
            for r in rows
            if r["model"] == model and r["component"] != "resid" and r["direction"] == "c_to_x" and r["window"] == "all"
        ]
        top = max(comp, key=lambda r: r["recovered"], default=None)
        out[model] = {
            "half_site": half["site"] if half else None,
            "top_component": f"{top['component']} of layer {top['layer']}" if top else None,
            "top_component_recovered": top["recovered"] if top else None,
        }
    return out


class PatchingSummary(ci.CausalSummary):
    """The patching probe's result: ``recovered(model, site, component, direction)`` and the report's ``lines()``."""

    PROBE = "patching"

    def recovered(self, model: str, site: str, component: str = "resid", direction: str = "c_to_x") -> float | None:

        row = next(
            (
                r
                for r in self.rows
                if (r["model"], r["site"], r["component"], r["direction"], r["window"])
                == (model, site, component, direction, "all")
            ),
            None,
        )
        return None if row is None else read_float(row["recovered"])

    def lines(self) -> list[str]:
        s = self.summary
        parts = [
            f"{m}: half the output KL recovered at {b['half_site'] or 'no decoder layer'}, top component "
            f"{b['top_component']} ({_f(b['top_component_recovered'])})"
            for m, b in s["best"].items()
            if b["top_component"] is not None
        ]
        lines = ["- Activation patching c→x (`probes/patching.csv`): " + "; ".join(parts)] if parts else []
        for c in s.get("cross", {}).get("rows", [])[:1]:
            lines.append(
                f"- Cross-checkpoint patch {c['donor']}→{c['recipient']} (context view, {c['site']}): "
                f"Δ answer log-prob {_f(c['dlogp'], '+.3f')}, Harm {_f(c['harm'])} → "
                f"{_f(c['harm_patched'])} (`probes/patching_cross.csv`)"
            )
        return lines


def report(probes_dir: Path) -> list[str]:
    result = PatchingSummary.load(probes_dir)
    return result.lines() if result is not None else []


def _f(v: float | None, spec: str = ".2f") -> str:
    """A summary number for a report line (null / NaN: "n/a")."""
    return "n/a" if v is None or v != v else format(v, spec)


register_probe(
    ProbeSpec(
        "patching",
        "activation patching between the views (sites x components) and between checkpoints",
        run_patching,
        options=PatchingOptions,
        order=60,
        outputs=("patching.csv", "patching.json", "patching_items.jsonl", "patching_tokens.jsonl"),
        demo={"models": ["base", "opd", "nca"], "cross": "nca,opd"},
        role_options=("models", "cross"),
        summary=PatchingSummary,
    )
)
