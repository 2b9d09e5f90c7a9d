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

The signals come from ``select.teachability_stats`` (θ0 vs teacher) and ``select.normalize_stats``; nothing is
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

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from collections.abc import Sequence

import torch
from torch import nn

from mechopd.core.artifacts import Summary, read_float, write_csv, write_json
from mechopd.core.checks import check_response_ids
from mechopd.core.errors import ConfigError, DataError
from mechopd.generate.scorer import common_vocab_size, score_views
from mechopd.objectives.losses import reverse_kl_full
from mechopd.objectives.select import TeachabilityStats, normalize_stats, teachability_stats
from mechopd.probes.items import sample_responses
from mechopd.probes.options import MODEL_HELP, Role, option
from mechopd.probes.registry import ProbeSpec, register_probe
from mechopd.probes.runner import ProbeContext, items_path, write_items
from mechopd.probes.setup import BASE, TEACHER, ProbeSetup
from mechopd.probes.teachability_analysis import (  # noqa: F401
    BUCKET_SIGNALS,
    GAINS,
    Table,
    high_support_gap,
    quartile_buckets,
    standardized_regression,
    summarize,
)
from mechopd.probes.teachability_limits import degeneracy, informative_checkpoint  # noqa: F401  (re-exported)
from mechopd.core.views import RenderSpec, build_two_view_batch

BANK_NAME = "bank.json"
TOKENS_NAME = "teachability_tokens.csv"
SUMMARY_NAME = "teachability_summary.json"
COLUMNS = ("seq", "pos", "token", "H", "D", "kl_full", "C_exact", "C_lower", "H_norm", "D_norm", "C_norm", "DL", "DI",
           "kl0", "kl1", "gain_abs", "gain_rel")
REL_EPS = 1e-8
BANK_BATCH = 16  # rows per sampling call when a bank is built (the ids do not depend on it)


@dataclass
class TeachabilitySummary(Summary):
    """Token teachability (``teachability_summary.json``): means, quartile buckets, the high-support gap per gain
    (``estimate``, ``ci_low``, ``ci_high``, ``ci``, ...: `probes.teachability.high_support_gap`), the regression."""

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
            return ["- **High-support gain gap**: undefined (the low-entropy / high-divergence cell has an empty "
                    "tercile)."]
        ci = self.gap["gain_abs"].get("ci") or 0.95
        interval = (f"[{lo:.4f}, {hi:.4f}] ({ci:.0%} sequence bootstrap)" if math.isfinite(lo) and math.isfinite(hi)
                    else "(interval undefined: too few tokens in the cell for the sequence bootstrap)")
        return [f"- **High-support gain gap** (Q3: low entropy, high divergence; high-C − low-C tercile): "
                f"{est:.4f} {interval}."]

    def quartile_spread(self, signal: str, gain: str = "gain_abs") -> float | None:
        """Mean ``gain`` in the top quartile of ``signal`` minus the bottom quartile (None when undefined)."""
        by_q = {b["quartile"]: b.get(f"mean_{gain}") for b in self.buckets.get(signal) or []}
        top, bottom = by_q.get(4), by_q.get(1)
        return None if top is None or bottom is None else top - bottom


# ---------------------------------------------------------------------------------------------------------------------
# The bank
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Bank:
    """Frozen student rollouts. prompts / contexts / uids: ``[n]``; responses: ``[n]`` lists of token ids.

    tokenizer_sha: fingerprint of the vocabulary the ids belong to; spec: how prompts are rendered; meta: provenance.
    """

    prompts: list[str]
    contexts: list[str]
    responses: list[list[int]]
    uids: list[str]
    tokenizer_sha: str
    spec: RenderSpec = field(default_factory=RenderSpec)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return sum(len(r) for r in self.responses)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short hash of the token -> id map (a bank is only valid for the vocabulary it was sampled with)."""
    items = sorted(tokenizer.get_vocab().items())
    return hashlib.sha1(json.dumps(items).encode()).hexdigest()[:16]


def build_bank(student: nn.Module, tokenizer: Any, task: Any, n: int, seed: int, spec: RenderSpec | None = None,
               temperature: float | None = None, *, split: str = "train", batch_size: int = BANK_BATCH) -> Bank:
    """Sample one response per task example from the student on the no-context view (the one sampler,
    `items.sample_responses`). temperature: None = the task's rollout temperature. Deterministic for (student, task,
    n, seed), whatever `batch_size`."""
    spec = spec or RenderSpec(placement=task.placement)
    temp = float(task.temperature if temperature is None else temperature)
    examples = task.examples(split, n, seed)
    responses = sample_responses(student, tokenizer, examples, spec, max_new_tokens=task.max_new_tokens,
                                 temperature=temp, seed=seed, batch_size=batch_size)
    return _bank_of(examples, responses, tokenizer, spec, {"task": getattr(task, "name", ""), "split": split, "n": n,
                                                           "seed": seed, "temperature": temp})


def _bank_of(examples: Sequence[Any], responses: list[list[int]], tokenizer: Any, spec: RenderSpec,
             meta: dict[str, Any]) -> Bank:
    return Bank([ex.prompt for ex in examples], [ex.context for ex in examples], responses,
                [ex.uid for ex in examples], tokenizer_fingerprint(tokenizer), spec, meta)


def save_bank(bank: Bank, path: str | os.PathLike) -> Path:
    """Write the bank as JSON (no pickle), atomically."""
    p = Path(path)
    items = [{"uid": u, "prompt": x, "context": c, "response_ids": list(map(int, y))}
             for u, x, c, y in zip(bank.uids, bank.prompts, bank.contexts, bank.responses)]
    doc = {"version": 1, "tokenizer_sha": bank.tokenizer_sha, "spec": asdict(bank.spec), "meta": bank.meta,
           "items": items}
    return write_json(p, doc, indent=None)


def load_bank(path: str | os.PathLike) -> Bank:
    """Read a bank written by ``save_bank``. Missing, malformed or empty (no response token) -> ``DataError``."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"bank file {p} does not exist; build one with run_teachability (it writes {BANK_NAME})")
    try:
        doc = json.loads(p.read_text())
        items = doc["items"]
        prompts = [str(it["prompt"]) for it in items]
        contexts = [str(it["context"]) for it in items]
        responses = [[int(t) for t in it["response_ids"]] for it in items]
        uids = [str(it.get("uid", i)) for i, it in enumerate(items)]
        bank = Bank(prompts, contexts, responses, uids, str(doc["tokenizer_sha"]), RenderSpec(**doc.get("spec", {})),
                    dict(doc.get("meta", {})))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise DataError(f"bank file {p} is malformed ({type(e).__name__}: {e}); it needs 'tokenizer_sha' and 'items' "
                        "with prompt, context and response_ids; rebuild it") from None
    _check_nonempty(bank, str(p))
    return bank


def _check_nonempty(bank: Bank, where: str) -> None:
    if not bank.responses or bank.n_tokens == 0:
        raise DataError(f"the bank {where} is empty ({len(bank.responses)} sequences, 0 response tokens); "
                        "build it with n >= 1 and a max_new_tokens >= 1")


# ---------------------------------------------------------------------------------------------------------------------
# Rescoring
# ---------------------------------------------------------------------------------------------------------------------


def _response_logprobs(models: Sequence[nn.Module], views: Sequence[str], batch: Any,
                       temperature: float) -> list[torch.Tensor]:
    """Each model on its view -> aligned ``[batch, R, V]`` log-probabilities over the common vocabulary (the one
    scorer, ``generate.scorer.score_views``, without grad)."""
    vocab = common_vocab_size(*models)
    return [score_views(m, batch, (v,), temperature=temperature, vocab=vocab, grad=False)[v]
            for m, v in zip(models, views)]


def _score_chunk(batch: Any, student0: nn.Module, student1: nn.Module, teacher: nn.Module, k: int, d_mode: str,
                 temperature: float) -> dict[str, torch.Tensor]:
    """Raw per-position signals of one batch, flattened to the valid positions ``[n_valid]`` (row-major)."""
    l0, l1, lt = _response_logprobs((student0, student1, teacher), ("x", "x", "c"), batch, temperature)
    mask = batch.response_mask
    exact = teachability_stats(l0, lt, mask, k, "exact", d_mode)
    lower = teachability_stats(l0, lt, mask, k, "lower_bound", d_mode)
    with torch.inference_mode():
        kl1 = reverse_kl_full(lt, l1)  # KL(p_T ‖ p_θ1) = Σ p_T (log p_T − log p_θ1)
    cols = {"H": exact.H, "D": exact.D, "kl_full": exact.kl_full, "C_exact": exact.C, "C_lower": lower.C,
            "kl1": kl1, "pos": torch.arange(mask.shape[1], device=mask.device).expand_as(mask),
            "token": batch.response_ids}
    return {name: v[mask].detach().cpu() for name, v in cols.items()}


def _check_bank_ids(bank: Bank, tokenizer: Any) -> None:
    sha = tokenizer_fingerprint(tokenizer)
    if sha != bank.tokenizer_sha:
        raise DataError(f"the bank was sampled with another tokenizer (fingerprint {bank.tokenizer_sha} != {sha}); "
                        "rebuild the bank with the student's tokenizer")
    check_response_ids(bank.responses, tokenizer, "the bank")


def rescore(bank: Bank, student0: nn.Module, student1: nn.Module, teacher: nn.Module, tokenizer: Any, *,
            k: int = 16, d_mode: str = "union", c_mode: str = "exact", temperature: float | None = None,
            batch_size: int = 8, q_low: float = 0.05, q_high: float = 0.95) -> Table:
    """Per-token table (COLUMNS, one entry per response token of the bank, sequence-major) — see the module docstring.

    student0 / student1: initial / trained student (no-context view); teacher: context view. temperature: None = the
    bank's sampling temperature. c_mode picks which C is normalised into C_norm ("exact" or "lower_bound").
    """
    from tqdm.auto import tqdm

    _check_nonempty(bank, "given to rescore")
    _check_bank_ids(bank, tokenizer)
    if c_mode not in ("exact", "lower_bound"):
        raise ConfigError(f"c_mode={c_mode!r} is unknown: use exact or lower_bound")
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} is invalid: it must be >= 1")
    temp = float(bank.meta.get("temperature", 1.0) if temperature is None else temperature)
    device = next(student0.parameters()).device
    max_len = getattr(getattr(teacher, "config", None), "max_position_embeddings", None)
    parts: list[dict[str, torch.Tensor]] = []
    keep = [i for i, r in enumerate(bank.responses) if r]  # sequences with at least one token
    for s in tqdm(range(0, len(keep), batch_size), desc="rescore", leave=False, disable=len(keep) <= batch_size):
        idx = keep[s : s + batch_size]
        batch = build_two_view_batch(tokenizer, [bank.prompts[i] for i in idx], [bank.contexts[i] for i in idx],
                                     [bank.responses[i] for i in idx], bank.spec, max_length=max_len).to(device)
        chunk = _score_chunk(batch, student0, student1, teacher, k, d_mode, temp)
        chunk["seq"] = torch.tensor(idx).repeat_interleave(batch.response_mask.sum(-1).cpu())
        parts.append(chunk)
    raw = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
    return _finish_table(raw, c_mode, q_low, q_high)


def _finish_table(raw: dict[str, torch.Tensor], c_mode: str, q_low: float, q_high: float) -> Table:
    """Normalise over the whole bank, form D^L / D^I and the gains; -> numpy columns in COLUMNS order."""
    C = raw["C_exact"] if c_mode == "exact" else raw["C_lower"]
    stats = TeachabilityStats(C=C[None], D=raw["D"][None], H=raw["H"][None], kl_full=raw["kl_full"][None])
    normed = normalize_stats(stats, torch.ones_like(C[None], dtype=torch.bool), q_low, q_high)
    kl0, kl1 = raw["kl_full"].double(), raw["kl1"].double()
    gain = kl0 - kl1
    cols = {**raw, "H_norm": normed.H[0], "D_norm": normed.D[0], "C_norm": normed.C[0], "DL": normed.DL[0],
            "DI": normed.DI[0], "kl0": raw["kl_full"], "gain_abs": gain, "gain_rel": gain / kl0.clamp_min(REL_EPS)}
    return {name: cols[name].numpy() for name in COLUMNS}


# ---------------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------------


def write_table(table: Table, path: str | os.PathLike) -> Path:
    """The per-token table as CSV (COLUMNS order), atomically (`artifacts.write_csv`)."""
    return write_csv(path, (dict(zip(COLUMNS, row)) for row in zip(*(table[c].tolist() for c in COLUMNS))), COLUMNS)



@dataclass(frozen=True)
class TeachabilityOptions:
    """`mechopd probe teachability`'s options (`mechopd.probes.options`)."""

    student: Role | None = option(None, f"the initial student θ0: {MODEL_HELP} (default: base)")
    trained: Role | None = option(None, f"the trained student θ1: {MODEL_HELP} (default: first trained)")
    teacher: Role | None = option(None, f"teacher: {MODEL_HELP} (default: the run's teacher, else base)")
    bank: str | None = option(None, "an existing bank.json (default: sample one from θ0)")
    n_boot: int = option(1000, "sequence-bootstrap resamples", range=(0, None))


def run_teachability(setup: ProbeSetup, out_dir: str | os.PathLike, *, student: str | None = None,
                     trained: str | None = None, teacher: str | None = None,
                     bank: Bank | str | os.PathLike | None = None, k: int = 16, d_mode: str = "union",
                     c_mode: str = "exact", n_boot: int = TeachabilityOptions.n_boot,
                     device: str | None = None) -> dict[str, Any]:
    """Build (or load) the bank from θ0, rescore, analyse; write ``bank.json`` (when built), the token table,
    ``teachability_items.jsonl`` (the runner's exact items) and ``teachability_summary.json`` (`TeachabilitySummary`)
    into ``out_dir``; returns the summary dict.

    student / trained / teacher: setup labels or checkpoint dirs; None = base / the first trained model / the setup's
    teacher (else base). bank: None = sample ``setup.n_for`` items (split default "train") with the setup's seed,
    temperature, max_new_tokens and render spec; a path or a `Bank` = reuse it. Tokenizers differ -> ``ModelError``.
    """
    out = Path(out_dir)
    if isinstance(bank, (str, os.PathLike)):
        bank = load_bank(bank)  # a bad path fails before any model is loaded
    ctx = ProbeContext.prepare(setup, "teachability", out, {"student": (student, BASE), "trained": (trained, "trained"),
                                                            "teacher": (teacher, TEACHER)},
                               default_split="train", with_items=bank is None, device=device)
    student0 = ctx.load("student")
    if bank is None:
        items = ctx.sample(student0, batch_size=BANK_BATCH)
        bank = _bank_of(items.examples, items.responses, ctx.tokenizer, ctx.spec, {
            "task": getattr(ctx.task, "name", ""), "split": ctx.split, "n": len(items.examples), "seed": setup.seed,
            "temperature": float(ctx.task.temperature)})
        _check_nonempty(bank, "just sampled")
        save_bank(bank, out / BANK_NAME)
    else:
        write_items(items_path(out, "teachability"), ctx.tokenizer, bank.spec, bank.uids, bank.prompts, bank.contexts,
                    bank.responses)
    student1, teacher_model = ctx.load("trained"), ctx.load("teacher")
    table = rescore(bank, student0, student1, teacher_model, ctx.tokenizer, k=k, d_mode=d_mode, c_mode=c_mode,
                    temperature=setup.temperature, batch_size=setup.batch_size)
    write_table(table, out / TOKENS_NAME)
    summary = summarize(table, n_boot, setup.seed)
    summary["settings"] = ctx.settings(student=ctx.path("student"), trained=ctx.path("trained"),
                                       teacher=ctx.path("teacher"), k=k, d_mode=d_mode, c_mode=c_mode, n_boot=n_boot,
                                       bank=bank.meta, spec=asdict(bank.spec), temperature=setup.temperature,
                                       items_file=items_path(out, "teachability").name)
    TeachabilitySummary.from_dict(summary).save(out)
    return summary


def cli_run(setup: ProbeSetup, out: Path, *, student: str | None, trained: str | None, teacher: str | None,
            bank: str | None, n_boot: int) -> list[str]:
    """`mechopd probe teachability`: run, then the lines to print."""
    run_teachability(setup, out, student=student, trained=trained, teacher=teacher, bank=bank, n_boot=n_boot)
    summary = TeachabilitySummary.load(out)  # just written by run_teachability
    return [f"teachability: {out / TeachabilitySummary.FILE}"] + (summary.lines() if summary is not None else [])


register_probe(ProbeSpec(
    "teachability", "fixed-context token teachability diagnostic (TA-OPD)", cli_run, options=TeachabilityOptions,
    order=40, outputs=("teachability_summary.json", "teachability_tokens.csv", "bank.json"),
    demo={"trained": "ta_opd"}, role_options=("trained",), summary=TeachabilitySummary,
    checkpoint=informative_checkpoint,  # a run's step that moved, not converged (docs/method.md §8)
))
