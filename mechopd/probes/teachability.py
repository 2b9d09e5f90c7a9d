"""Token teachability: the fixed-context diagnostic of TA-OPD (docs/method.md §3, "Not All Disagreement Is Learnable").

A BANK freezes student rollouts: (prompt x, context c, response ids y) per sequence; every response position t with
its prefix (x, y<t) is one fixed context. The initial student θ0 and the trained student θ1 are rescored on the
no-context view, the teacher on the context view, on IDENTICAL ids (the bank stores response ids, the tokenizer's
fingerprint and the render spec; prompts are re-rendered deterministically). Per response token (all at the bank's
temperature, distributions of θ0 unless said otherwise):

    H        top-K entropy of p_θ0 (nats)                       D        KL(p̄_T ‖ p̄_θ0) on U = S ∪ T (union KL)
    kl_full  KL(p_T ‖ p_θ0), full vocabulary (= kl0)            C_exact  Σ_{v∈S} p_T(v);   C_lower  Σ_{v∈S∩T} p_T(v)
    H_norm, D_norm, C_norm   quantile_norm over the WHOLE bank (Q05/Q95; C_norm from C_exact or C_lower, `c_mode`)
    DL = D_norm · C_norm (learnable),  DI = D_norm · (1 − C_norm) (incompatible)
    kl0 = KL(p_T ‖ p_θ0),  kl1 = KL(p_T ‖ p_θ1)
    gain_abs = kl0 − kl1 (the paper's G_t),  gain_rel = (kl0 − kl1) / max(kl0, 1e-8) (the released code's)

The signals come from ``signals.teachability_stats`` (θ0 vs teacher) and ``normalize.normalize_stats``; nothing is
recomputed here. Rescoring streams over the bank in batches: only per-token scalars are kept, never ``[N, R, V]``.

Analyses (``summarize``):
  * ``quartile_buckets``: quartiles of a signal (C_norm, DL, DI, kl_full) by value: Q1 = x ≤ q25, Q2 = q25 < x ≤ q50,
    Q3 = q50 < x ≤ q75, Q4 = x > q75 (numpy "linear" quantiles; ties never straddle a boundary, so a signal with a
    heavy point mass, e.g. C_norm clipped at 1, can leave a bucket empty: n = 0, mean NaN).
  * ``high_support_gap``: inside the "Q3" cell of the entropy × divergence median split (H ≤ median(H), D > median(D)),
    mean gain of the high-C tercile (C > q⅔) minus the low-C tercile (C ≤ q⅓), C = raw C_exact; a 95 % CI from a
    bootstrap over WHOLE sequences (sequences resampled with replacement, medians and terciles recomputed each time).
  * ``standardized_regression``: OLS of z(G) on z(H), z(DL), z(DI) with an intercept; a constant predictor gets
    coefficient NaN and is left out of the fit.
  * ``degeneracy``: when the diagnostic cannot speak (docs/method.md §8): C carries no information (fewer than
    `C_LOW_SHARE_MIN` of the bank's tokens have C_exact < `C_LOW`), or the rescored model has converged (mean kl1 / mean kl0 <
    `CONVERGED_RATIO`, or corr(gain_abs, kl0) > `GAIN_KL0_CORR`: the gain is the initial KL, every fit on it trivial).
  * ``informative_checkpoint``: which saved step of a run to rescore (moved, not converged).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

from mechopd.config.terms import SignalOptions
from mechopd.core.artifacts import Summary, read_float
from mechopd.core.options import GE0, option
from mechopd.probes.options import MODEL_HELP, Role
from mechopd.probes.registry import ProbeSpec, register_probe
from mechopd.probes.runner import ProbeContext, items_path, write_items
from mechopd.probes.setup import BASE, TEACHER, ProbeSetup
from mechopd.probes.teachability_analysis import summarize
from mechopd.probes.teachability_bank import (
    BANK_BATCH,
    BANK_NAME,
    Bank,
    _bank_of,
    _check_nonempty,
    load_bank,
    save_bank,
)
from mechopd.probes.teachability_limits import informative_checkpoint
from mechopd.probes.teachability_rescore import rescore, write_table

TOKENS_NAME = "teachability_tokens.csv"
SUMMARY_NAME = "teachability_summary.json"


@dataclass
class TeachabilitySummary(Summary):
    """Token teachability (``teachability_summary.json``): means, quartile buckets, the high-support gap per gain
    (``estimate``, ``ci_low``, ``ci_high``, ``ci``, ...: `probes.teachability_analysis.high_support_gap`), the regression."""

    FILE: ClassVar[str] = SUMMARY_NAME
    PROBE: ClassVar[str] = "teachability"

    n_tokens: int
    n_sequences: int
    means: dict[str, float]
    buckets: dict[str, list[dict[str, Any]]]
    gap: dict[str, dict[str, Any]]
    regression: dict[str, dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    degeneracy: dict[str, Any] = field(default_factory=dict)  # `teachability_limits.degeneracy`

    def gap_interval(self, gain: str = "gain_abs") -> tuple[float, float, float]:
        """(estimate, ci_low, ci_high) of the high-support gap for ``gain``; NaN where undefined."""
        g = self.gap.get(gain) or {}
        return read_float(g.get("estimate")), read_float(g.get("ci_low")), read_float(g.get("ci_high"))

    def lines(self) -> list[str]:
        if self.degeneracy.get("reasons"):
            return ["- **Teachability: not measurable here**: " + "; ".join(self.degeneracy["reasons"]) + "."]
        est, lo, hi = self.gap_interval("gain_abs")
        if math.isnan(est):
            return [
                "- **High-support gain gap**: undefined (the low-entropy / high-divergence cell has an empty tercile)."
            ]
        ci = self.gap["gain_abs"].get("ci") or 0.95
        interval = (
            f"[{lo:.4f}, {hi:.4f}] ({ci:.0%} sequence bootstrap)"
            if math.isfinite(lo) and math.isfinite(hi)
            else "(interval undefined: too few tokens in the cell for the sequence bootstrap)"
        )
        return [
            f"- **High-support gain gap** (Q3: low entropy, high divergence; high-C − low-C tercile): "
            f"{est:.4f} {interval}."
        ]

    def quartile_spread(self, signal: str, gain: str = "gain_abs") -> float | None:
        """Mean ``gain`` in the top quartile of ``signal`` minus the bottom quartile (None when undefined)."""
        by_q = {b["quartile"]: b.get(f"mean_{gain}") for b in self.buckets.get(signal) or []}
        top, bottom = by_q.get(4), by_q.get(1)
        return None if top is None or bottom is None else top - bottom


@dataclass(frozen=True)
class TeachabilityOptions:
    """`mechopd probe teachability`'s options (`mechopd.probes.options`)."""

    student: Role | None = option(None, f"the initial student θ0: {MODEL_HELP} (default: base)")
    trained: Role | None = option(None, f"the trained student θ1: {MODEL_HELP} (default: first trained)")
    teacher: Role | None = option(None, f"teacher: {MODEL_HELP} (default: the run's teacher, else base)")
    bank: str | None = option(None, "an existing bank.json (default: sample one from θ0)")
    n_boot: int = option(1000, "sequence-bootstrap resamples", range=GE0)


def run_teachability(
    setup: ProbeSetup,
    out_dir: str | os.PathLike,
    opts: TeachabilityOptions | None = None,
    *,
    k: int = SignalOptions.k,
    d_mode: str = SignalOptions.d_mode,
    c_mode: str = SignalOptions.c_mode,
    device: str | None = None,
) -> list[str]:
    """Build (or load) the bank from θ0, rescore, analyse; write ``bank.json`` (when built), the token table,
    ``teachability_items.jsonl`` (the runner's exact items) and ``teachability_summary.json`` (`TeachabilitySummary`)
    into ``out_dir``; returns the lines `mechopd probe teachability` prints (the result: `TeachabilitySummary.load`).

    opts.student / trained / teacher: setup labels or checkpoint dirs; None = base / the first trained model / the
    setup's teacher (else base). opts.bank: None = sample ``setup.n_for`` items (split default "train") with the
    setup's seed, temperature, max_new_tokens and render spec; a path (or a `Bank`) = reuse it. Tokenizers differ ->
    ``ModelError``.
    """
    opts = opts or TeachabilityOptions()
    out, bank, n_boot = Path(out_dir), cast("Bank | str | None", opts.bank), opts.n_boot
    if isinstance(bank, (str, os.PathLike)):
        bank = load_bank(bank)  # a bad path fails before any model is loaded
    ctx = ProbeContext.prepare(
        setup,
        "teachability",
        out,
        {"student": (opts.student, BASE), "trained": (opts.trained, "trained"), "teacher": (opts.teacher, TEACHER)},
        default_split="train",
        with_items=bank is None,
        device=device,
    )
    student0 = ctx.load("student")
    bank = _bank_for(ctx, setup, out, student0, bank)
    student1, teacher_model = ctx.load("trained"), ctx.load("teacher")
    table = rescore(
        bank,
        student0,
        student1,
        teacher_model,
        ctx.tokenizer,
        k=k,
        d_mode=d_mode,
        c_mode=c_mode,
        temperature=setup.temperature,
        batch_size=setup.batch_size,
    )
    write_table(table, out / TOKENS_NAME)
    summary = summarize(table, n_boot, setup.seed)
    summary["settings"] = _settings(ctx, setup, out, bank, k=k, d_mode=d_mode, c_mode=c_mode, n_boot=n_boot)
    TeachabilitySummary.from_dict(summary).save(out)
    loaded = TeachabilitySummary.load(out)  # just written
    return [f"teachability: {out / TeachabilitySummary.FILE}"] + (loaded.lines() if loaded is not None else [])


def _bank_for(ctx: ProbeContext, setup: ProbeSetup, out: Path, student0: Any, bank: Bank | None) -> Bank:
    """The bank to rescore: sampled from θ0 and saved as ``bank.json`` when none is given; a given bank's items are
    written as the runner's items file."""
    if bank is None:
        items = ctx.sample(student0, batch_size=BANK_BATCH)
        bank = _bank_of(
            items.examples,
            items.responses,
            ctx.tokenizer,
            ctx.spec,
            {
                "task": getattr(ctx.task, "name", ""),
                "split": ctx.split,
                "n": len(items.examples),
                "seed": setup.seed,
                "temperature": float(ctx.task.temperature),
            },
        )
        _check_nonempty(bank, "just sampled")
        save_bank(bank, out / BANK_NAME)
    else:
        write_items(
            items_path(out, "teachability"),
            ctx.tokenizer,
            bank.spec,
            bank.uids,
            bank.prompts,
            bank.contexts,
            bank.responses,
        )
    return bank


def _settings(
    ctx: ProbeContext, setup: ProbeSetup, out: Path, bank: Bank, *, k: int, d_mode: str, c_mode: str, n_boot: int
) -> dict[str, Any]:
    """The summary's ``settings``: the three checkpoints, the signals' options, the bank's provenance."""
    return ctx.settings(
        student=ctx.path("student"),
        trained=ctx.path("trained"),
        teacher=ctx.path("teacher"),
        k=k,
        d_mode=d_mode,
        c_mode=c_mode,
        n_boot=n_boot,
        bank=bank.meta,
        spec=asdict(bank.spec),
        temperature=setup.temperature,
        items_file=items_path(out, "teachability").name,
    )


register_probe(
    ProbeSpec(
        "teachability",
        "fixed-context token teachability diagnostic (TA-OPD)",
        run_teachability,
        options=TeachabilityOptions,
        order=40,
        outputs=("teachability_summary.json", "teachability_tokens.csv", "bank.json"),
        demo={"trained": "ta_opd"},
        role_options=("trained",),
        summary=TeachabilitySummary,
        checkpoint=informative_checkpoint,  # a run's step that moved, not converged (docs/method.md §8)
    )
)
