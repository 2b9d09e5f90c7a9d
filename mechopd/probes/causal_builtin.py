"""Registrations of the causal probes (lens, patching, attention): flags, run adapters, demo options, figures,
report lines. Like `mechopd.probes.builtin`, this imports no probe or plotting module (callables as strings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechopd.errors import ConfigError
from mechopd.probes.registry import Arg, FigureSpec, ProbeSpec, register_probe

DEMO_MODELS = ["base", "opd", "nca"]
MODELS = Arg(("--models",), dict(nargs="+", default=None, metavar="LABEL|NAME=DIR",
                                 help="models to compare (default: every model of the run but the teacher)"))
GREEDY = Arg(("--greedy",), dict(action="store_true", help="argmax responses instead of sampled ones"))
DETAIL = Arg(("--detail-items",), dict(dest="detail", type=int, default=16, metavar="N",
                                       help="items whose per-token values are kept for `mechopd explore` (default 16)"))
CACHE = Arg(("--cache",), dict(default=None, metavar="DIR", help="an activation store written by `mechopd probe "
                                 "cache`: its items, responses and activations instead of forwards (same numbers)"))
SITES_HELP = "comma-separated decoder layers or site names (default: every residual site)"


def _list(text: str | None, flag: str) -> list[Any] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ConfigError(f"{flag} {text!r} names nothing; e.g. {flag} 0,1,final_norm")
    return [int(t) if t.lstrip("-").isdigit() else t for t in items]


def _cross(text: str | None) -> tuple[str, str] | None:
    parts = _list(text, "--cross")
    if parts is not None and (len(parts) != 2 or not all(isinstance(p, str) for p in parts)):
        raise ConfigError(f"--cross {text!r} must name two models, donor then recipient, e.g. --cross nca,opd")
    if parts is not None and parts[0] == parts[1]:
        raise ConfigError(f"--cross {text!r} names one model twice; cross-model patching needs two different models, "
                          "donor then recipient, e.g. --cross nca,opd")
    return None if parts is None else (parts[0], parts[1])


def _detail(n: int) -> int:
    if n < 0:
        raise ConfigError(f"--detail-items {n} is invalid: pass 0 or more")
    return n


def lens(setup: Any, out: Path, *, models: list[str] | None, layers: str | None, greedy: bool,
         detail: int, cache: str | None) -> list[str]:
    from mechopd.probes.lens import report, run_lens

    path = run_lens(setup, out, models=models, layers=_list(layers, "--layers"), greedy=greedy, detail=_detail(detail),
                    cache=cache)
    return [f"lens table: {path}"] + report(out)


def cache(setup: Any, out: Path, *, models: list[str] | None, sites: str | None, shard_mb: float,
          greedy: bool) -> list[str]:
    from mechopd.probes.cache import run_cache

    path = run_cache(setup, out, models=models, sites=_list(sites, "--sites"), shard_mb=shard_mb, greedy=greedy)
    return [f"activation store: {path} (read it with: mechopd probe similarity|lens --cache {out})"]


def patching(setup: Any, out: Path, *, models: list[str] | None, layers: str | None, components: str,
             window: int | None, cross: str | None, cross_sites: str | None, greedy: bool, detail: int) -> list[str]:
    from mechopd.probes.patching import report, run_patching

    comps = _list(components, "--components") or []
    path = run_patching(setup, out, models=models, layers=_list(layers, "--layers"), components=comps,
                        window=window, cross=_cross(cross), cross_sites=_list(cross_sites, "--cross-sites"),
                        greedy=greedy, detail=_detail(detail))
    return [f"patching table: {path}"] + report(out)


def attention(setup: Any, out: Path, *, models: list[str] | None, greedy: bool, detail: int) -> list[str]:
    from mechopd.probes.attention import report, run_attention

    path = run_attention(setup, out, models=models, greedy=greedy, detail=_detail(detail))
    return [f"attention table: {path}"] + report(out)


register_probe(ProbeSpec(
    "lens", "logit lens per view: KL between the views' decoded residual at every depth", lens,
    arguments=(MODELS, Arg(("--layers",), dict(default=None, help=SITES_HELP)), GREEDY, DETAIL, CACHE),
    outputs=("lens.csv", "lens.json", "lens_items.jsonl", "lens_tokens.jsonl", "lens_examples.csv"),
    demo={"models": DEMO_MODELS}, role_options=("models",), summary="mechopd.probes.lens:LensSummary",
    figures=(FigureSpec(
        "lens_kl", "Logit lens: KL between the views by depth",
        "Mean over the scored positions (the last prompt token and every response token but the last) of "
        "KL(p_c ‖ p_x) between the context and no-context views' distributions, the residual at each site decoded "
        "through the model's final norm and LM head (at the final norm: the output); one line per model.",
        "mechopd.plots.causal:plot_lens_kl"),),
))

register_probe(ProbeSpec(
    "patching", "activation patching between the views (sites x components) and between checkpoints", patching,
    arguments=(MODELS, Arg(("--layers",), dict(default=None, help=SITES_HELP)),
               Arg(("--components",), dict(default="resid,attn,mlp", help="comma-separated of resid,attn,mlp")),
               Arg(("--window",), dict(type=int, default=None, metavar="W",
                                       help="also patch the residual one window of W scored positions at a time")),
               Arg(("--cross",), dict(default=None, metavar="DONOR,RECIPIENT",
                                      help="patch DONOR's context-view residual into RECIPIENT's, e.g. nca,opd")),
               Arg(("--cross-sites",), dict(dest="cross_sites", default=None, help=f"sites of --cross: {SITES_HELP}")),
               GREEDY, DETAIL),
    outputs=("patching.csv", "patching.json", "patching_items.jsonl", "patching_tokens.jsonl"),
    demo={"models": DEMO_MODELS, "cross": "nca,opd"}, role_options=("models", "cross"),
    summary="mechopd.probes.patching:PatchingSummary",
    figures=(FigureSpec(
        "patching", "Activation patching between the views",
        "Recovered share of the output KL between the views when the no-context view's activation at the scored "
        "positions is replaced by the context view's (c→x): 1 − KL(p_c ‖ p_x patched)/KL(p_c ‖ p_x), per site and "
        "component (resid: the residual stream at the site; attn / mlp: that layer's attention / MLP output); one "
        "panel per model.", "mechopd.plots.causal:plot_patching"),),
))

register_probe(ProbeSpec(
    "attention", "attention mass on the context span per layer x head (context view, eager attention)", attention,
    arguments=(MODELS, GREEDY, DETAIL),
    outputs=("attention.csv", "attention.json", "attention_items.jsonl", "attention_tokens.jsonl"),
    demo={"models": DEMO_MODELS}, role_options=("models",), summary="mechopd.probes.attention:AttentionSummary",
    figures=(FigureSpec(
        "attention_context", "Attention on the context per layer and head",
        "In the context view, mean attention weight the scored positions put on the context's tokens, per decoder "
        "layer and head, one panel per model, and the NCA − OPD difference (blue: NCA attends less to the context).",
        "mechopd.plots.causal:plot_attention_context"),),
))

register_probe(ProbeSpec(
    "cache", "activation store: both views' activations at the response positions, per model, in safetensors shards",
    cache,
    arguments=(MODELS, Arg(("--sites",), dict(default=None, help="comma-separated site names of mechopd.sites or "
                                              "decoder layers (default: every residual site)")),
               Arg(("--shard-mb",), dict(dest="shard_mb", type=float, default=256.0, metavar="MB",
                                         help="megabytes per shard (default 256; memory is bounded by one shard)")),
               GREEDY),
    outputs=("cache_manifest.json", "cache_items.jsonl"), demo=None,
))
