"""`mechopd probe cache`: write both views' activations at the response positions to an activation store, once, for
every later probe that reads ``--cache DIR`` (similarity, lens) instead of running the models again.

Items: the causal probes' (`causal_items.resolve`: the setup's examples, ``--n``, ``--seed``, ``--split``, one response
per item from ``--responses-from``, default the first trained model), saved as ``cache_items.jsonl``. Models: every
model of the run but the teacher (``--models``), one resident at a time. Sites: ``--sites`` names of `mechopd.core.sites`
(residual sites ``embed``, ``layers.{i}.resid_post``, ``final_norm``; components ``layers.{i}.self_attn``,
``layers.{i}.mlp``), default every residual site. Per batch, each view runs once (no grad, no KV cache, unshared
prefix: the lens's forward), one hook per site at the ``"predict_stop"`` positions: each item keeps its n + 1 rows
(`store` module docstring). Shards close at ``--shard-mb``; the manifest
records the items, sites, dtype, every model's path and the sha256 of its weight files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechopd.core.errors import ConfigError
from mechopd.core.options import option
from mechopd.core.sites import sites_for
from mechopd.core.views import TwoViewBatch
from mechopd.models import num_layers
from mechopd.probes import causal_items as ci
from mechopd.probes.capture import Trace, decoder_stack, site_module
from mechopd.probes.options import Role, greedy_option, models_option, normalise, site_list
from mechopd.probes.registry import ProbeSpec, register_probe
from mechopd.probes.store import VIEWS, StoreWriter, weight_hashes, write_manifest

SHARD_MB = 256


def resolve_cache_sites(model: nn.Module, sites: Sequence[int | str] | None) -> list[str]:
    """Residual sites (all by default) or any hookable site name, checked against the model, deduplicated."""
    n = num_layers(model)
    if not sites:
        return sites_for(n)
    out = []
    for s in dict.fromkeys(sites):
        if isinstance(s, int) or str(s).lstrip("-").isdigit():
            s = sites_for(n, [int(s)])[0]  # a decoder layer: its resid_post
        site_module(model, s)  # ConfigError / ModelError naming the site
        out.append(s)
    return out


def capture_items(model: nn.Module, batch: TwoViewBatch, sites: Sequence[str]) -> list[dict]:
    """Per item of `batch`: ``{(site, view): [n + 1, d]}``, the ``"predict_stop"`` positions (capture.py): row 0 the
    last prompt token, then the response tokens' own states."""
    batch = batch.to(next(model.parameters()).device)
    n = batch.response_mask.sum(1).tolist()
    per_view: dict[str, Trace] = {}
    for which in VIEWS:
        tr = Trace(model, batch, which, capture=sites, positions="predict_stop", stop_after_last=True)
        with torch.inference_mode(), tr:
            decoder_stack(model)(**batch.view(which), use_cache=False)
        per_view[which] = tr
    return [
        {(s, v): per_view[v][s][j, : n[j] + 1].clone() for s in sites for v in VIEWS} for j in range(batch.batch_size)
    ]


@dataclass(frozen=True)
class CacheOptions:
    """`mechopd probe cache`'s options (`mechopd.probes.options`)."""

    models: list[Role] | None = models_option()
    sites: Sequence[int | str] | None = option(
        None, "comma-separated site names of mechopd.core.sites or decoder layers (default: every residual site)"
    )
    shard_mb: float = option(float(SHARD_MB), "megabytes per shard (memory is bounded by one shard)", metavar="MB")
    greedy: bool = greedy_option()

    def __post_init__(self) -> None:  # the list's syntax before any model loads
        normalise(self, sites=site_list)


def run_cache(
    setup,
    out_dir: str | Path,
    opts: CacheOptions | None = None,
    *,
    device: str | None = None,
    dtype: torch.dtype | None = None,
) -> list[str]:
    """Write the store into `out_dir` (see the module docstring); returns the line `mechopd probe cache` prints."""
    opts = opts or CacheOptions()
    sites, shard_mb, greedy = opts.sites, opts.shard_mb, opts.greedy
    if not shard_mb > 0:
        raise ConfigError(f"--shard-mb {shard_mb} must be > 0 (megabytes per shard, e.g. 256)")
    out = Path(out_dir)
    run = ci.resolve(setup, opts.models, probe="cache", out=out, greedy=greedy, device=device, dtype=dtype)
    records: dict[str, dict[str, Any]] = {}
    picked: list[str] | None = None
    for label, model in run.each_model():
        model.eval()
        picked = picked or resolve_cache_sites(model, sites)
        writer = StoreWriter(out, label, picked, int(shard_mb * 2**20))
        for batch in run.items:
            for acts in capture_items(model, batch, picked):
                writer.add(acts)
        records[label] = {
            "path": run.models[label],
            "sha256": weight_hashes(run.models[label]),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "shards": writer.close(),
        }
    if picked is None:
        raise ConfigError("the cache probe got no model to run; name at least one with --models")
    dtypes = {str(r["dtype"]) for r in records.values()}
    path = write_manifest(
        out,
        picked,
        ",".join(sorted(dtypes)),
        records,
        len(run.items.examples),
        run.settings(sites=picked, shard_mb=shard_mb, greedy=greedy),
    )
    return [f"activation store: {path} (read it with: mechopd probe similarity|lens --cache {out})"]


register_probe(
    ProbeSpec(
        "cache",
        "activation store: both views' activations at the response positions, per model, in safetensors shards",
        run_cache,
        options=CacheOptions,
        order=80,
        outputs=("cache_manifest.json", "cache_items.jsonl"),
        demo=None,
    )
)
