"""The localization curve: at which depth does a donor's residual stream remove the harm from the context view?
(docs/method.md "Interventions and update geometry").

Items: the held-out items with the model's (OPD's) own greedy no-context reply y (`ProbeContext.sample`, greedy); the
items it answers right without c (``task.score``) are the ones Harm conditions on. On the context view fed y (teacher
forcing), the model's greedy choice at response position t is argmax p_c(· | c, x, y<t); the item FLIPS when that
choice differs from y_t at some response position (the greedy decode with c would leave the correct reply):

    Harm_tf        = (1/|R|) Σ_{i ∈ R} 1[item i flips],   R = items right without c
    Harm_tf(s)     = the same with the residual stream at site s (``layers.{i}.resid_post``; ``embed``, ``final_norm``)
                     replaced, at every scored position (the last prompt token and every response token but the
                     last, the positions that predict y), by the donor's:
                       donor "x":    the model's own no-context view on the same tokens (fixed point: at
                                     final_norm the context view's output IS the no-context view's, Harm_tf(s) = 0)
                       donor LABEL:  that model's (e.g. NCA's) context view on the same tokens
    removed_at     = the shallowest site with Harm_tf(s) ≤ (1 − removed_share) · Harm_tf (default: 90 % removed)

Harm_tf is Harm with the decode pinned to y: a flip is a reply that leaves the correct one; it counts a reply that
leaves y and still reaches the right answer as harmed (an upper bound of the generated Harm on the same items; both
are in the table). Intervals: percentile bootstrap over the items of R. Several seeds: `localization_seeds` (seed
mean, Student-t interval per site).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mechopd.core.artifacts import read_float, write_csv
from mechopd.core.errors import ConfigError
from mechopd.core.options import GE0, UNIT, option
from mechopd.core.sites import site_depth, site_layer
from mechopd.evaluation.removability import resample_blocks
from mechopd.models import num_layers
from mechopd.probes import causal_items as ci
from mechopd.probes.capture import forward, resolve_sites
from mechopd.probes.options import Role, normalise, site_list
from mechopd.probes.registry import ProbeSpec, register_probe

SELF = "x"
COLUMNS = (
    "model",
    "donor",
    "site",
    "layer",
    "depth",
    "harm",
    "harm_low",
    "harm_high",
    "harm_clean",
    "n_right",
    "n_items",
    "flip_all",
)


def _flips(logits: torch.Tensor, batch) -> torch.Tensor:
    """``[B]`` bool: the greedy choice differs from the response token at some response position."""
    wrong = (logits.argmax(-1) != batch.response_ids.to(logits.device)) & batch.response_mask.to(logits.device)
    return wrong.any(-1).cpu()


def localize(model, batches, sites: Sequence[str], donor_model=None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(clean flips [n], site -> patched flips [n]) over a stream of batches; donor_model None: the model's own
    no-context view is the donor, else ``donor_model``'s context view."""
    clean: list[torch.Tensor] = []
    patched: dict[str, list[torch.Tensor]] = {s: [] for s in sites}
    for batch in batches:
        batch = batch.to(next(model.parameters()).device)
        if donor_model is None:
            donor = forward(model, batch, "x", capture=sites, positions="predict", head=False)
        else:
            donor = forward(donor_model, batch, "c", capture=sites, positions="predict", head=False)
        clean.append(_flips(forward(model, batch, "c", positions="predict").logits, batch))
        for s in sites:
            out = forward(model, batch, "c", edit={s: donor[s]}, positions="predict", mask=batch.response_mask)
            patched[s].append(_flips(out.logits, batch))
    return torch.cat(clean).numpy(), {s: torch.cat(v).numpy() for s, v in patched.items()}


def _interval(flips: np.ndarray, n_boot: int, seed: int) -> tuple[float | None, float | None]:
    if len(flips) == 0 or n_boot == 0:
        return None, None
    boots = np.concatenate([flips[idx].mean(1) for idx in resample_blocks(len(flips), n_boot, seed)])
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return float(lo), float(hi)


def curve_rows(
    label: str,
    donor: str,
    right: np.ndarray,
    clean: np.ndarray,
    patched: dict[str, np.ndarray],
    n_layers: int,
    n_boot: int,
    seed: int,
) -> list[dict[str, Any]]:
    base = clean[right]
    rows = []
    for s, flips in patched.items():
        f = flips[right]
        lo, hi = _interval(f, n_boot, seed)
        rows.append(
            {
                "model": label,
                "donor": donor,
                "site": s,
                "layer": site_layer(s),
                "depth": site_depth(s, n_layers),
                "harm": float(f.mean()) if len(f) else None,
                "harm_low": lo,
                "harm_high": hi,
                "harm_clean": float(base.mean()) if len(base) else None,
                "n_right": int(right.sum()),
                "n_items": len(right),
                "flip_all": float(flips.mean()),
            }
        )
    return rows


def removed_at(rows: Sequence[dict[str, Any]], removed_share: float) -> str | None:
    """The shallowest site whose patched Harm_tf ≤ (1 − removed_share) · clean Harm_tf (None: no site; clean 0)."""
    for r in sorted(rows, key=lambda r: r["depth"]):
        clean, harm = _float(r["harm_clean"]), _float(r["harm"])
        if clean and harm is not None and harm <= (1 - removed_share) * clean + 1e-12:
            return r["site"]
    return None


def _right(run) -> np.ndarray:
    tok, task = run.tokenizer, run.task
    return np.array(
        [
            bool(task.score(ex, tok.decode(r, skip_special_tokens=True)))
            for ex, r in zip(run.items.examples, run.items.responses)
        ]
    )


@dataclass(frozen=True)
class LocalizationOptions:
    """`mechopd probe localization`'s options (`mechopd.probes.options`)."""

    model: Role | None = option(
        None, "the model whose harm is localized: a label or dir (default: the first trained model)"
    )
    donor: Role = option(
        SELF,
        "x: the model's own no-context view (default), or a label / dir whose context view is the donor (e.g. nca)",
    )
    layers: Sequence[int | str] | None = option(
        None, "comma-separated decoder layers or site names (default: every residual site)"
    )
    removed_share: float = option(0.9, "share of the harm a site must remove to count", range=UNIT)
    n_boot: int = option(1000, "item bootstrap resamples", range=GE0)

    def __post_init__(self) -> None:  # the list's syntax before any model loads
        normalise(self, layers=site_list)


def run_localization(
    setup: Any, out_dir: str | Path, opts: LocalizationOptions | None = None, *, device: str | None = None
) -> list[str]:
    """`mechopd probe localization`: writes localization.csv / .json / _items.jsonl; returns the lines it prints."""
    opts = opts or LocalizationOptions()
    donor, removed_share, n_boot = opts.donor, opts.removed_share, opts.n_boot
    if not 0 < removed_share <= 1:
        raise ConfigError(f"--removed-share {removed_share} must lie in (0, 1]")
    label, path = setup.model(opts.model, "trained")
    models = {label: path}
    if donor != SELF:
        models[donor] = setup.model(donor, "trained")[1]
    run = ci.resolve(
        setup.replace(responses_from=label), models, probe="localization", out=out_dir, greedy=True, device=device
    )
    recipient = run.load(label)
    sites = resolve_sites(recipient, opts.layers)
    donor_model = None if donor == SELF else run.load(donor)
    clean, patched = localize(recipient, run.items, sites, donor_model)
    right = _right(run)
    rows = curve_rows(label, donor, right, clean, patched, num_layers(recipient), n_boot, setup.seed)
    out = Path(out_dir)
    write_csv(out / "localization.csv", rows, COLUMNS)
    summary = {
        "model": label,
        "donor": donor,
        "harm_clean": rows[0]["harm_clean"] if rows else None,
        "n_right": int(right.sum()),
        "removed_share": removed_share,
        "removed_at": removed_at(rows, removed_share),
    }
    records = ci.item_records(
        run,
        right_x=[bool(v) for v in right],
        flips_clean=[bool(v) for v in clean],
        flips=[{s: bool(f[i]) for s, f in patched.items()} for i in range(len(right))],
    )
    ci.save(
        out,
        "localization",
        run,
        run.settings(
            donor=donor,
            removed_share=removed_share,
            n_boot=n_boot,
            decode="greedy y from the model's no-context view; teacher-forced context view",
        ),
        summary,
        records,
    )
    return [f"localization table: {out / 'localization.csv'}"] + LocalizationSummary.load(out).lines()


def _float(v: Any) -> float | None:
    x = read_float(v) if isinstance(v, str) else v
    return None if x is None or x != x else float(x)


class LocalizationSummary(ci.CausalSummary):
    """The localization curve of one run: ``curve()`` (site, depth, harm) and ``removed_at``; ``lines()``."""

    PROBE = "localization"

    def curve(self) -> list[tuple[str, int, float | None]]:
        return [(r["site"], int(r["depth"]), _float(r["harm"])) for r in self.rows]

    def lines(self) -> list[str]:
        s = self.summary
        donor = "its own no-context view" if s["donor"] == SELF else f"{s['donor']}'s context view"
        clean = "n/a" if s["harm_clean"] is None else f"{s['harm_clean']:.3f}"
        where = s["removed_at"] or "no site"
        if not s["harm_clean"]:
            return [
                f"- **Localization** {s['model']} (`probes/localization.csv`): teacher-forced Harm {clean} on "
                f"{s['n_right']} items right without c: no harm to localize"
            ]
        return [
            f"- **Localization** {s['model']} (`probes/localization.csv`): the residual of {donor} patched into "
            f"the context view at every response position; teacher-forced Harm {clean} on {s['n_right']} items "
            f"right without c; {int(100 * s['removed_share'])} % of it removed from {where} on"
        ]


register_probe(
    ProbeSpec(
        "localization",
        "the depth at which a donor's residual removes the harm from the context view",
        run_localization,
        options=LocalizationOptions,
        order=100,
        outputs=("localization.csv", "localization.json", "localization_items.jsonl"),
        demo={"model": "opd", "donor": "x"},
        role_options=("model",),
        summary=LocalizationSummary,
    )
)
