"""The teachability probe's per-token table (`mechopd.probes.teachability`, whose docstring has the signals): the bank
rescored by θ0, θ1 (no-context view) and the teacher (context view) on identical ids, normalised over the whole bank,
and written as CSV.

    kl0 = KL(p_T ‖ p_θ0),  kl1 = KL(p_T ‖ p_θ1),  gain_abs = kl0 − kl1,  gain_rel = (kl0 − kl1) / max(kl0, 1e-8)
    DL = D_norm · C_norm (learnable),  DI = D_norm · (1 − C_norm) (incompatible)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechopd.config.terms import SignalOptions
from mechopd.core.artifacts import write_csv
from mechopd.core.checks import check_response_ids
from mechopd.core.errors import ConfigError, DataError
from mechopd.core.views import build_two_view_batch
from mechopd.generate.scorer import common_vocab_size, score_views
from mechopd.objectives.divergences import reverse_kl_full
from mechopd.objectives.normalize import normalize_stats
from mechopd.objectives.signals import TeachabilityStats, teachability_stats
from mechopd.probes.setup import ProbeSetup
from mechopd.probes.teachability_analysis import Table
from mechopd.probes.teachability_bank import Bank, _check_nonempty, tokenizer_fingerprint

COLUMNS = (
    "seq",
    "pos",
    "token",
    "H",
    "D",
    "kl_full",
    "C_exact",
    "C_lower",
    "H_norm",
    "D_norm",
    "C_norm",
    "DL",
    "DI",
    "kl0",
    "kl1",
    "gain_abs",
    "gain_rel",
)
REL_EPS = 1e-8


def _response_logprobs(
    models: Sequence[nn.Module], views: Sequence[str], batch: Any, temperature: float
) -> list[torch.Tensor]:
    """Each model on its view -> aligned ``[batch, R, V]`` log-probabilities over the common vocabulary (the one
    scorer, ``generate.scorer.score_views``, without grad)."""
    vocab = common_vocab_size(*models)
    return [
        score_views(m, batch, (v,), temperature=temperature, vocab=vocab, grad=False)[v] for m, v in zip(models, views)
    ]


def _score_chunk(
    batch: Any, student0: nn.Module, student1: nn.Module, teacher: nn.Module, k: int, d_mode: str, temperature: float
) -> dict[str, torch.Tensor]:
    """Raw per-position signals of one batch, flattened to the valid positions ``[n_valid]`` (row-major)."""
    l0, l1, lt = _response_logprobs((student0, student1, teacher), ("x", "x", "c"), batch, temperature)
    mask = batch.response_mask
    exact = teachability_stats(l0, lt, mask, k, "exact", d_mode)
    lower = teachability_stats(l0, lt, mask, k, "lower_bound", d_mode)
    with torch.inference_mode():
        kl1 = reverse_kl_full(lt, l1)  # KL(p_T ‖ p_θ1) = Σ p_T (log p_T − log p_θ1)
    cols = {
        "H": exact.H,
        "D": exact.D,
        "kl_full": exact.kl_full,
        "C_exact": exact.C,
        "C_lower": lower.C,
        "kl1": kl1,
        "pos": torch.arange(mask.shape[1], device=mask.device).expand_as(mask),
        "token": batch.response_ids,
    }
    return {name: v[mask].detach().cpu() for name, v in cols.items()}


def _check_bank_ids(bank: Bank, tokenizer: Any) -> None:
    sha = tokenizer_fingerprint(tokenizer)
    if sha != bank.tokenizer_sha:
        raise DataError(
            f"the bank was sampled with another tokenizer (fingerprint {bank.tokenizer_sha} != {sha}); "
            "rebuild the bank with the student's tokenizer"
        )
    check_response_ids(bank.responses, tokenizer, "the bank")


def rescore(
    bank: Bank,
    student0: nn.Module,
    student1: nn.Module,
    teacher: nn.Module,
    tokenizer: Any,
    *,
    k: int = SignalOptions.k,
    d_mode: str = SignalOptions.d_mode,
    c_mode: str = SignalOptions.c_mode,
    temperature: float | None = None,
    batch_size: int = ProbeSetup.batch_size,
    q_low: float = SignalOptions.q_low,
    q_high: float = SignalOptions.q_high,
) -> Table:
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
        batch = build_two_view_batch(
            tokenizer,
            [bank.prompts[i] for i in idx],
            [bank.contexts[i] for i in idx],
            [bank.responses[i] for i in idx],
            bank.spec,
            max_length=max_len,
        ).to(device)
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
    cols = {
        **raw,
        "H_norm": normed.H[0],
        "D_norm": normed.D[0],
        "C_norm": normed.C[0],
        "DL": normed.DL[0],
        "DI": normed.DI[0],
        "kl0": raw["kl_full"],
        "gain_abs": gain,
        "gain_rel": gain / kl0.clamp_min(REL_EPS),
    }
    return {name: cols[name].numpy() for name in COLUMNS}


def write_table(table: Table, path: str | os.PathLike) -> Path:
    """The per-token table as CSV (COLUMNS order), atomically (`artifacts.write_csv`)."""
    return write_csv(path, (dict(zip(COLUMNS, row)) for row in zip(*(table[c].tolist() for c in COLUMNS))), COLUMNS)
