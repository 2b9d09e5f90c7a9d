"""Which view moved: each trained model's KL to the base (its step-0 distribution), per view (issue 52, NCA's deafness).

Items: the setup's items with one response each (``--responses-from``; default the first trained model's no-context
reply), every model scored on the same token ids. At every scored position t (the position predicting y_t), for a
trained model q and the base q⁰ (the initial student: the step-0 distribution of both views), with logits / T:

    kl_x = mean_t KL(q_x ‖ q⁰_x),   kl_c = mean_t KL(q_c ‖ q⁰_c)      (token mean over the scored positions)

NCA's anchor KL(sg[q_x] ‖ q_c) can be lowered by moving q_c onto q_x (the context view goes deaf) or q_x onto q_c (OPD);
kl_c large with kl_x small says the context view moved. Files: ``drift.json`` (per model kl_x, kl_c, n_tokens),
``drift_items.jsonl`` (the items and responses, with each model's per-item means).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mechopd.core.errors import ConfigError
from mechopd.models import load_model
from mechopd.probes import causal_items as ci
from mechopd.probes.capture import forward
from mechopd.probes.options import Role, greedy_option, models_option
from mechopd.probes.registry import ProbeSpec, register_probe
from mechopd.probes.setup import BASE

VIEWS = ("x", "c")


def view_kl(model, base, batch, temperature: float) -> dict[str, torch.Tensor]:
    """Per view, ``[B, R]`` KL(q_view ‖ q⁰_view) at the predicting positions (float64; padded slots 0)."""
    batch = batch.to(next(model.parameters()).device)
    out = {}
    for view in VIEWS:
        q = ci.logp(forward(model, batch, view, positions="predict").logits, temperature)
        q0 = ci.logp(forward(base, batch, view, positions="predict").logits, temperature)
        out[view] = ci.kl_rows(q, q0) * batch.response_mask
    return out


@dataclass(frozen=True)
class DriftOptions:
    """`mechopd probe drift`'s options (`mechopd.probes.options`)."""

    models: list[Role] | None = models_option("trained models to compare with the base (default: every trained one)")
    greedy: bool = greedy_option()


def run_drift(setup: Any, out_dir: str | Path, opts: DriftOptions | None = None, *, device: str | None = None):
    """`mechopd probe drift`: writes drift.json / drift_items.jsonl; returns the lines it prints."""
    opts = opts or DriftOptions()
    run = ci.resolve(setup, opts.models, probe="drift", out=out_dir, greedy=opts.greedy, device=device)
    if BASE not in setup.models:
        raise ConfigError("probe drift: the setup has no 'base' model (the step-0 distribution); use --run RUN")
    trained = [label for label in run.models if label != BASE]
    if not trained:
        raise ConfigError("probe drift: no trained model to compare with the base; name one with --models")
    base = load_model(setup.models[BASE], dtype=run.dtype, device=run.device)
    summary: dict[str, Any] = {}
    out = Path(out_dir)
    per_item = [  # the runner's items (ids, saved by `resolve`): the per-item means join them
        json.loads(line) for line in (out / "drift_items.jsonl").read_text(encoding="utf-8").splitlines() if line
    ]
    for label in trained:
        model = run.load(label)
        sums, count, i = dict.fromkeys(VIEWS, 0.0), 0, 0
        for batch in run.items:
            kl = view_kl(model, base, batch, run.temperature)
            mask = batch.response_mask.to(kl["x"].device)
            for b in range(mask.shape[0]):
                n_b = int(mask[b].sum())
                for view in VIEWS:
                    per_item[i + b][f"{label}_kl_{view}"] = float(kl[view][b].sum()) / max(n_b, 1)
            for view in VIEWS:
                sums[view] += float(kl[view].sum())
            count += int(mask.sum())
            i += mask.shape[0]
        summary[label] = {"kl_x": sums["x"] / max(count, 1), "kl_c": sums["c"] / max(count, 1), "n_tokens": count}
        del model
    ci.save(out, "drift", run, run.settings(greedy=opts.greedy), {"models": summary}, records=per_item)
    return [f"drift: {out / 'drift.json'}"] + DriftSummary.load(out).lines()


class DriftSummary(ci.CausalSummary):
    """The drift probe's result (``summary`` of drift.json) and its report ``lines()``."""

    PROBE = "drift"

    @classmethod
    def load(cls, probes_dir):
        doc = ci.load_summary(Path(probes_dir), cls.PROBE)
        return None if doc is None else cls(doc, [])

    def lines(self) -> list[str]:
        models = self.summary.get("models") or {}
        if not models:
            return []
        parts = [f"{m} KL(q_x ‖ q⁰_x) {v['kl_x']:.3f}, KL(q_c ‖ q⁰_c) {v['kl_c']:.3f}" for m, v in models.items()]
        return [f"- **Which view moved** (KL to the base, nats per token, `probes/drift.json`): {'; '.join(parts)}"]


register_probe(
    ProbeSpec(
        "drift",
        "each trained model's KL to the base (its step-0 distribution) per view: which view moved",
        run_drift,
        options=DriftOptions,
        order=125,
        outputs=("drift.json", "drift_items.jsonl"),
        demo=None,  # on demand, and in a study that names it (smollm2-handbooks)
        role_options=("models",),
        summary=DriftSummary,
    )
)
