"""Teachability probe: bank I/O, rescoring vs direct teachability_stats, gains, analyses vs numpy references."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from mechopd.core.errors import DataError, ModelError
from mechopd.core.views import build_two_view_batch
from mechopd.evaluation.removability import resample_blocks
from mechopd.objectives.normalize import normalize_stats
from mechopd.objectives.signals import teachability_stats
from mechopd.organisms.tokenizer import build_tokenizer
from mechopd.probes import teachability as T
from mechopd.probes import teachability_analysis, teachability_bank, teachability_rescore
from mechopd.probes.setup import ProbeSetup
from mechopd.tasks.base import get_task

TASK = get_task("rules")
TOK = build_tokenizer(TASK.vocab())


def tiny(seed: int, tok=TOK) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.3,
    )
    return Qwen3ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def models():
    return tiny(0), tiny(2), tiny(1)  # initial student, trained student, teacher


@pytest.fixture(scope="module")
def bank(models):
    return teachability_bank.build_bank(models[0], TOK, TASK, 5, 0, temperature=0.8, batch_size=2)


# ---------------------------------------------------------------------------------------------------- the bank
def test_bank_roundtrip_and_determinism(bank, models, tmp_path):
    assert len(bank.responses) == 5 and bank.n_tokens > 0 and bank.meta["temperature"] == 0.8
    path = teachability_bank.save_bank(bank, tmp_path / "bank.json")
    loaded = teachability_bank.load_bank(path)
    assert loaded.responses == bank.responses and loaded.prompts == bank.prompts
    assert loaded.contexts == bank.contexts and loaded.spec == bank.spec and loaded.tokenizer_sha == bank.tokenizer_sha
    again = teachability_bank.build_bank(models[0], TOK, TASK, 5, 0, temperature=0.8, batch_size=2)
    assert again.responses == bank.responses


@pytest.mark.parametrize("content", [None, "not json", '{"items": []}', "EMPTY_ITEMS", "EMPTY_RESPONSES"])
def test_empty_or_bad_bank_is_a_data_error(bank, tmp_path, content):
    path = tmp_path / "bank.json"
    if content == "EMPTY_ITEMS":
        teachability_bank.save_bank(teachability_bank.Bank([], [], [], [], bank.tokenizer_sha), path)
    elif content == "EMPTY_RESPONSES":
        teachability_bank.save_bank(
            teachability_bank.Bank(
                bank.prompts, bank.contexts, [[] for _ in bank.prompts], bank.uids, bank.tokenizer_sha
            ),
            path,
        )
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match="bank"):
        teachability_bank.load_bank(path)


def test_rescore_refuses_other_tokenizer(bank, models):
    other = build_tokenizer(TASK.vocab() + ["extra"])
    with pytest.raises(DataError, match="another tokenizer"):
        teachability_rescore.rescore(bank, *models, other)


# ---------------------------------------------------------------------------------------------------- rescoring
def _direct(bank, student0, student1, teacher, temperature):
    """The whole bank as ONE batch: direct teachability_stats / normalize_stats calls."""
    batch = build_two_view_batch(TOK, bank.prompts, bank.contexts, bank.responses, bank.spec, layout="right")
    with torch.no_grad():
        lp = [
            torch.log_softmax(batch.response_logits(m(**batch.view(v)).logits, v) / temperature, -1)
            for m, v in ((student0, "x"), (student1, "x"), (teacher, "c"))
        ]
    mask = batch.response_mask
    exact = teachability_stats(lp[0], lp[2], mask, 16, "exact")
    lower = teachability_stats(lp[0], lp[2], mask, 16, "lower_bound")
    normed = normalize_stats(exact, mask)
    kl1 = teachability_stats(lp[1], lp[2], mask).kl_full
    return mask, exact, lower, normed, kl1


def test_rescore_equals_direct_stats(bank, models):
    table = teachability_rescore.rescore(bank, *models, TOK, batch_size=2)  # streamed in 3 batches, left layout
    mask, exact, lower, normed, kl1 = _direct(bank, *models, 0.8)
    assert len(table["seq"]) == int(mask.sum()) == bank.n_tokens
    seq, pos = mask.nonzero(as_tuple=True)
    np.testing.assert_array_equal(table["seq"], seq.numpy())
    np.testing.assert_array_equal(table["pos"], pos.numpy())
    np.testing.assert_array_equal(table["token"], [bank.responses[s][p] for s, p in zip(seq.tolist(), pos.tolist())])
    pairs = {
        "H": exact.H,
        "D": exact.D,
        "kl_full": exact.kl_full,
        "kl0": exact.kl_full,
        "C_exact": exact.C,
        "C_lower": lower.C,
        "H_norm": normed.H,
        "D_norm": normed.D,
        "C_norm": normed.C,
        "DL": normed.DL,
        "DI": normed.DI,
        "kl1": kl1,
    }
    for name, ref in pairs.items():
        np.testing.assert_allclose(table[name], ref[mask].numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(table["gain_abs"], table["kl0"].astype(float) - table["kl1"], rtol=1e-6)
    assert (table["C_lower"] <= table["C_exact"] + 1e-6).all()
    assert np.abs(table["gain_abs"]).max() > 1e-3  # the trained model really differs


def test_gain_is_zero_when_trained_equals_initial(bank, models):
    student0, _, teacher = models
    table = teachability_rescore.rescore(bank, student0, student0, teacher, TOK, batch_size=4)
    assert (table["kl0"] > 0).all()
    np.testing.assert_array_equal(table["gain_abs"], 0.0)
    np.testing.assert_array_equal(table["gain_rel"], 0.0)


# ---------------------------------------------------------------------------------------------------- analyses
def synthetic(n_seq: int = 40, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, n_seq)
    seq = np.repeat(np.arange(n_seq), lengths)
    n = len(seq)
    cols = {
        "seq": seq,
        "H": rng.random(n),
        "D": rng.random(n),
        "C_exact": rng.random(n),
        "DL": rng.random(n),
        "DI": rng.random(n),
        "kl_full": rng.gamma(2.0, size=n),
        "C_norm": np.clip(rng.random(n) * 1.5, 0, 1),
    }
    cols["gain_abs"] = 0.5 * cols["C_exact"] + rng.normal(0, 0.3, n)
    cols["gain_rel"] = cols["gain_abs"] / (1 + cols["kl_full"])
    return cols


@pytest.mark.parametrize("signal", ["C_norm", "DL", "kl_full"])  # C_norm: point mass at 1 (ties)
def test_quartile_buckets_vs_numpy(signal):
    t = synthetic()
    x, g = t[signal], t["gain_abs"]
    q1, q2, q3 = np.percentile(x, [25, 50, 75])
    ref_masks = [x <= q1, (x > q1) & (x <= q2), (x > q2) & (x <= q3), x > q3]
    got = teachability_analysis.quartile_buckets(t, signal)
    assert [b["quartile"] for b in got] == [1, 2, 3, 4]
    assert sum(b["n"] for b in got) == len(x)
    for b, m in zip(got, ref_masks):
        assert b["n"] == int(m.sum())
        if m.any():
            assert b["mean_gain_abs"] == pytest.approx(g[m].mean())
        else:
            assert np.isnan(b["mean_gain_abs"])


def _slow_gap(H, D, C, G):
    medH, medD = np.median(H), np.median(D)
    cell = [i for i in range(len(H)) if H[i] <= medH and D[i] > medD]
    c = np.array([C[i] for i in cell])
    lo, hi = np.percentile(c, [100 / 3, 200 / 3])
    high = [G[i] for i in cell if C[i] > hi]
    low = [G[i] for i in cell if C[i] <= lo]
    return sum(high) / len(high) - sum(low) / len(low)


def test_high_support_gap_vs_slow_reference_and_seeded():
    t = synthetic()
    out = teachability_analysis.high_support_gap(t, n_boot=60, seed=3)
    assert out["estimate"] == pytest.approx(_slow_gap(t["H"], t["D"], t["C_exact"], t["gain_abs"]))
    assert out["estimate"] > 0  # gain grows with C by construction
    # bootstrap over WHOLE sequences: rebuild each replicate by hand from the same resampled sequence ids
    seqs = np.unique(t["seq"])
    boots = []
    for block in resample_blocks(len(seqs), 60, 3):
        for picks in block:
            idx = np.concatenate([np.flatnonzero(t["seq"] == seqs[s]) for s in picks])
            boots.append(_slow_gap(t["H"][idx], t["D"][idx], t["C_exact"][idx], t["gain_abs"][idx]))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    assert out["n_boot_valid"] == 60
    assert (out["ci_low"], out["ci_high"]) == pytest.approx((lo, hi))
    assert teachability_analysis.high_support_gap(t, n_boot=60, seed=3) == out
    assert teachability_analysis.high_support_gap(t, n_boot=60, seed=4)["ci_low"] != out["ci_low"]


def test_standardized_regression_recovers_coefficients():
    rng = np.random.default_rng(1)
    n = 500
    t = {"H": rng.normal(2, 3, n), "DL": rng.random(n), "DI": rng.gamma(2.0, size=n)}
    t["gain_abs"] = 0.7 * t["H"] - 4.0 * t["DL"] + 1.5 * t["DI"] + 0.2
    out = teachability_analysis.standardized_regression(t)
    sd_g = t["gain_abs"].std()
    expected = {"H": 0.7 * t["H"].std() / sd_g, "DL": -4.0 * t["DL"].std() / sd_g, "DI": 1.5 * t["DI"].std() / sd_g}
    for name, value in expected.items():
        assert out["coef"][name] == pytest.approx(value, rel=1e-8)
    assert out["r2"] == pytest.approx(1.0) and out["intercept"] == pytest.approx(0.0, abs=1e-10)
    noisy = dict(t, gain_abs=t["gain_abs"] + rng.normal(0, 3, n), DI=np.zeros(n))
    out = teachability_analysis.standardized_regression(noisy)
    assert np.isnan(out["coef"]["DI"]) and 0 < out["r2"] < 1
    assert out["coef"]["H"] > 0 > out["coef"]["DL"]


# ---------------------------------------------------------------------------------------------------- end to end
def _save(model, tok, path):
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_run_teachability_end_to_end(models, tmp_path):
    dirs = [_save(m, TOK, tmp_path / name) for m, name in zip(models, ("s0", "s1", "teacher"))]
    setup = ProbeSetup(task="rules", n=4, seed=0, models=dict(zip(("base", "ta_opd", "teacher"), map(str, dirs))))
    T.run_teachability(setup, tmp_path / "out", T.TeachabilityOptions(n_boot=20))
    out = tmp_path / "out"
    summary = json.loads((out / T.SUMMARY_NAME).read_text())
    with (out / T.TOKENS_NAME).open() as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == teachability_rescore.COLUMNS and len(rows) == summary["n_tokens"] > 0
    saved = json.loads((out / T.SUMMARY_NAME).read_text())
    assert (
        set(saved["buckets"]) == set(teachability_analysis.BUCKET_SIGNALS) and saved["gap"]["gain_abs"]["n_boot"] == 20
    )
    T.run_teachability(
        setup, tmp_path / "out2", T.TeachabilityOptions(bank=str(out / teachability_bank.BANK_NAME), n_boot=20)
    )
    again = json.loads((tmp_path / "out2" / T.SUMMARY_NAME).read_text())
    assert again["means"] == summary["means"]  # the same bank rescored: identical numbers


def test_run_teachability_refuses_other_teacher_tokenizer(models, tmp_path):
    other = build_tokenizer(["alpha", "beta"])
    s0 = _save(models[0], TOK, tmp_path / "s0")
    t = _save(tiny(1, tok=other), other, tmp_path / "t")
    with pytest.raises(ModelError, match="tokenizers differ"):
        T.run_teachability(
            ProbeSetup(task="rules", n=2),
            tmp_path / "out",
            T.TeachabilityOptions(student=str(s0), trained=str(s0), teacher=str(t)),
        )
