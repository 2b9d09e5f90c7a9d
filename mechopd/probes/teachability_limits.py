"""When the teachability diagnostic cannot speak, and which checkpoint lets it (docs/method.md §8).

On a small-vocabulary organism the student's top-K can cover the whole answer support, so that C ≈ 1 at nearly every
token and D^L = D̃·C̃ is D̃ times noise: C carries information only where some tokens sit well below 1 (the check
counts the share of tokens with C < `C_LOW`; a spread of quantiles was a knife edge: on the demo's organism
q95 − q05 was 0.0002–0.998 across seeds while 3–6 % of the tokens had C < 0.5); a rescored "trained" student that has converged (KL after ≈ 0) makes the gain equal the
initial KL, and every regression on it trivial (R² = 1). `degeneracy` says so with its numbers;
`informative_checkpoint` picks a saved step that has moved but not converged.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

Table = dict[str, np.ndarray]  # column -> [n_tokens] (probes.teachability's token table)

C_LOW = 0.5  # a token whose compatibility mass C_exact is below this: C says something there
# fewer than 1/16 of the tokens below C_LOW: C carries no information the quartile comparison can see. The row compares
# D^L's top-minus-bottom quartile spread with raw KL's; D^L = D̃·C̃ reorders a quartile only through the tokens where C
# is low, so they must fill at least a quarter of one quartile (1/4 · 1/4 of the bank). The previous guard, 1 %, let
# the default run decide on 5–10 such tokens per seed (#44): a handful of tokens moved, the rest is D̃ itself.
C_LOW_SHARE_MIN = 1 / 16
CONVERGED_RATIO = 0.01  # mean kl1 / mean kl0 below this: the rescored model has converged
GAIN_KL0_CORR = 0.999  # corr(gain, kl0) above this: the gain is the initial KL
INFORMATIVE = (0.1, 0.9)  # informative checkpoint: KL(q_x ‖ f) at the step over the first step's, in this range


def degeneracy(table: Table) -> dict[str, Any]:
    """``{"measurable", "reasons", "c_quantiles" (q05, q50, q95 of C_exact), "c_spread", "c_low_share", "kl_ratio",
    "corr_gain_kl0", "thresholds"}``; ``reasons`` lists every check that failed, in words with its numbers."""
    C = np.asarray(table["C_exact"], float)
    q05, q50, q95 = (float(v) for v in np.quantile(C, [0.05, 0.5, 0.95]))
    low = float(np.mean(C < C_LOW)) if len(C) else 0.0
    kl0, gain = np.asarray(table["kl0"], float), np.asarray(table["gain_abs"], float)
    ratio = float(np.mean(table["kl1"]) / np.mean(kl0)) if np.mean(kl0) > 0 else math.nan
    corr = float(np.corrcoef(gain, kl0)[0, 1]) if len(kl0) > 1 and gain.std() > 0 and kl0.std() > 0 else math.nan
    reasons = []
    if low < C_LOW_SHARE_MIN:
        reasons.append(
            f"C carries no information: {100 * low:.2f} % of the tokens have C_exact < {C_LOW} (< "
            f"{100 * C_LOW_SHARE_MIN:.2f} %, a quarter of a quartile; {int(np.sum(C < C_LOW))} tokens; q05/q50/q95 = {q05:.5f}/{q50:.5f}/{q95:.5f})"
        )
    if math.isfinite(ratio) and ratio < CONVERGED_RATIO:
        reasons.append(
            f"the rescored model has converged: mean KL after / before = {ratio:.4f} < {CONVERGED_RATIO}"
            " (the gain is the initial KL)"
        )
    elif math.isfinite(corr) and corr > GAIN_KL0_CORR:
        reasons.append(f"the gain is the initial KL: corr(gain, KL before) = {corr:.5f} > {GAIN_KL0_CORR}")
    return {
        "measurable": not reasons,
        "reasons": reasons,
        "c_quantiles": [q05, q50, q95],
        "c_spread": q95 - q05,
        "c_low_share": low,
        "kl_ratio": ratio,
        "corr_gain_kl0": corr,
        "thresholds": {
            "c_low": C_LOW,
            "c_low_share_min": C_LOW_SHARE_MIN,
            "converged_ratio": CONVERGED_RATIO,
            "gain_kl0_corr": GAIN_KL0_CORR,
        },
    }


def informative_checkpoint(run_dir: str | os.PathLike) -> tuple[Path, str]:
    """(checkpoint to rescore, why): the earliest ``checkpoints/step-N`` whose training KL(q_x ‖ f) at step N over
    that of step 1 (``kl/teacher_student`` in metrics.jsonl) lies in `INFORMATIVE`; else ``final`` (say so)."""
    run = Path(run_dir)
    kl = {}
    if (run / "metrics.jsonl").is_file():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line) if line.strip() else {}
            if "kl/teacher_student" in rec:
                kl[int(rec["step"])] = float(rec["kl/teacher_student"])
    steps = (
        sorted(
            int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*") if p.name.split("-")[1].isdigit()
        )
        if (run / "checkpoints").is_dir()
        else []
    )
    first = kl.get(min(kl)) if kl else None
    for step in steps:
        if first and step in kl and INFORMATIVE[0] <= kl[step] / first <= INFORMATIVE[1]:
            return run / "checkpoints" / f"step-{step}", (
                f"step {step}: training KL {kl[step]:.4f} / step-1 KL {first:.4f} = {kl[step] / first:.3f} in "
                f"[{INFORMATIVE[0]}, {INFORMATIVE[1]}], the earliest saved step that moved but did not converge"
            )
    ratios = ", ".join(f"step {s}: {kl[s] / first:.3f}" for s in steps if first and s in kl) or "none saved"
    return run / "final", (
        f"no saved step has training KL / step-1 KL in [{INFORMATIVE[0]}, {INFORMATIVE[1]}] "
        f"({ratios}): the final model, so the degeneracy check decides"
    )
