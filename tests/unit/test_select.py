"""mechopd.objectives.select (TA-OPD and baselines) against slow explicit references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mechopd.core.errors import ConfigError
from mechopd.objectives import normalize, signals
from mechopd.objectives import select as S

B, T, V = 3, 5, 11
DT = torch.float64


def make_logp(seed: int, shape=(B, T, V), scale: float = 2.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(scale * torch.randn(shape, generator=g, dtype=DT), -1)


def make_mask(lengths: list[int], seq: int = T) -> torch.Tensor:
    return torch.tensor([[t < n for t in range(seq)] for n in lengths])


MASK = make_mask([5, 3, 1])


# ---------------------------------------------------------------------------------------------------------------------
# Slow references: Python sets and loops over positions and vocabulary
# ---------------------------------------------------------------------------------------------------------------------


def ref_position(ls: list[float], lt: list[float], k: int) -> dict[str, float]:
    """All signals at one position from plain Python lists of log-probs."""
    ps, pt = [math.exp(x) for x in ls], [math.exp(x) for x in lt]
    kk = min(k, len(ps))
    s_ids = sorted(range(len(ps)), key=lambda v: -ps[v])[:kk]
    t_ids = sorted(range(len(pt)), key=lambda v: -pt[v])[:kk]
    union = set(s_ids) | set(t_ids)
    zs, zt = sum(ps[v] for v in union), sum(pt[v] for v in union)
    d_union = sum(pt[v] / zt * math.log((pt[v] / zt) / (ps[v] / zs)) for v in union)
    own_s, own_t = sum(ps[v] for v in s_ids), sum(pt[v] for v in t_ids)
    d_floor = 0.0
    for v in union:  # the released code's loop
        qs = max(ps[v] / own_s if v in s_ids else 0.0, 1e-12)
        qt = max(pt[v] / own_t if v in t_ids else 0.0, 1e-12)
        d_floor += qt * (math.log(qt) - math.log(qs))
    h = -sum(ps[v] / own_s * math.log(ps[v] / own_s) for v in s_ids)
    return {
        "C_exact": sum(pt[v] for v in s_ids),
        "C_lower_bound": sum(pt[v] for v in s_ids if v in t_ids),
        "D_union": d_union,
        "D_floored": d_floor,
        "H": h,
        "kl_full": sum(pt[v] * (lt[v] - ls[v]) for v in range(len(ps))),
    }


def ref_stats(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, k: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[b, t]:
                continue
            row = ref_position(student[b, t].tolist(), teacher[b, t].tolist(), k)
            for key, value in row.items():
                out.setdefault(key, np.zeros(tuple(mask.shape)))[b, t] = value
    return out


def ref_norm(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    lo, hi = np.quantile(z[mask], [0.05, 0.95])
    if hi - lo < 1e-12:
        return np.zeros_like(z)
    return np.where(mask, np.clip((z - lo) / (hi - lo), 0, 1), 0.0)


def ref_select(score: np.ndarray, mask: np.ndarray, rho: float, tie_break: str, min_one: bool) -> np.ndarray:
    """Sort valid positions by (−score, tie key); take ⌈ρN⌉; then top up starved responses."""
    valid = [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]
    tie = (lambda bt: (bt[1], bt[0])) if tie_break == "position" else (lambda bt: bt)
    order = sorted(valid, key=lambda bt: (-score[bt], *tie(bt)))
    budget = math.ceil(round(rho * len(valid), 9))
    keep = np.zeros(mask.shape, dtype=bool)
    for bt in order[:budget]:
        keep[bt] = True
    if min_one:
        for b in range(mask.shape[0]):
            cands = [t for t in range(mask.shape[1]) if mask[b, t]]
            if cands and not keep[b].any():
                keep[b, max(cands, key=lambda t: (score[b, t], -t))] = True
    return keep


# ---------------------------------------------------------------------------------------------------------------------
# Signals
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, V, V + 4])
def test_teachability_stats_match_loop_reference(k):
    student, teacher = make_logp(0), make_logp(1)
    ref = ref_stats(student, teacher, MASK, k)
    for c_mode in signals.C_MODES:
        for d_mode in signals.D_MODES:
            stats = signals.teachability_stats(student, teacher, MASK, k, c_mode, d_mode)
            np.testing.assert_allclose(stats.C.numpy(), ref[f"C_{c_mode}"], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(stats.D.numpy(), ref[f"D_{d_mode}"], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(stats.H.numpy(), ref["H"], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(stats.kl_full.numpy(), ref["kl_full"], rtol=1e-9, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, V))
def test_compat_lower_bound_never_exceeds_exact_and_union_kl_is_nonnegative(seed, k):
    student, teacher = make_logp(seed, scale=3.0), make_logp(seed + 1, scale=3.0)
    exact = signals.teachability_stats(student, teacher, MASK, k, "exact")
    lower = signals.teachability_stats(student, teacher, MASK, k, "lower_bound")
    assert (lower.C <= exact.C + 1e-12).all()
    assert ((exact.C >= 0) & (exact.C <= 1)).all()
    assert (exact.D >= -1e-12).all()
    if k == V:  # T_t covers the vocabulary: the bound is exact
        torch.testing.assert_close(lower.C, exact.C)


def test_identical_models_have_zero_divergence_and_full_compatibility_at_full_k():
    student = make_logp(2)
    stats = signals.teachability_stats(student, student.clone(), MASK, k=V)
    assert stats.D.abs().max() < 1e-12 and stats.kl_full.abs().max() < 1e-12
    torch.testing.assert_close(stats.C, MASK.to(DT))


def test_stats_are_zero_off_mask_and_carry_no_gradient():
    logits = torch.randn(B, T, V, dtype=DT, requires_grad=True)
    stats = signals.teachability_stats(torch.log_softmax(logits, -1), make_logp(3), MASK)
    for field in ("C", "D", "H", "kl_full"):
        value = getattr(stats, field)
        assert not value.requires_grad
        assert (value[~MASK] == 0).all()


@pytest.mark.parametrize("bad", [{"k": 0}, {"c_mode": "upper"}, {"d_mode": "clipped"}])
def test_stats_reject_bad_options(bad):
    with pytest.raises(ConfigError):
        signals.teachability_stats(make_logp(0), make_logp(1), MASK, **bad)


# ---------------------------------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=B * T, max_size=B * T))
def test_quantile_norm_matches_numpy(values):
    z = torch.tensor(values, dtype=DT).view(B, T)
    out = normalize.quantile_norm(z, MASK).numpy()
    np.testing.assert_allclose(out, ref_norm(z.numpy(), MASK.numpy()), rtol=1e-5, atol=1e-6)


def test_quantile_norm_ignores_invalid_positions_and_handles_flat_signals():
    z = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [1e9, -1e9, 7.0, 7.0, 7.0]], dtype=DT)
    mask = torch.tensor([[True] * 5, [False, False, False, False, False]])
    np.testing.assert_allclose(normalize.quantile_norm(z, mask)[0].numpy(), [0, 2 / 9, 1 / 2, 7 / 9, 1], atol=1e-12)
    assert (normalize.quantile_norm(z, mask)[1] == 0).all()
    assert (normalize.quantile_norm(torch.full((2, 5), 3.0), torch.ones(2, 5, dtype=torch.bool)) == 0).all()
    assert (normalize.quantile_norm(z, torch.zeros(2, 5, dtype=torch.bool)) == 0).all()
    with pytest.raises(ValueError, match="non-finite"):
        normalize.quantile_norm(torch.tensor([[float("nan"), 1.0]]), torch.ones(1, 2, dtype=torch.bool))


def test_normalized_decomposition_and_selector_scores():
    stats = signals.teachability_stats(make_logp(4), make_logp(5), MASK)
    n = normalize.normalize_stats(stats, MASK)
    m = MASK.numpy()
    for field in ("H", "D", "C"):
        np.testing.assert_allclose(getattr(n, field).numpy(), ref_norm(getattr(stats, field).numpy(), m), atol=1e-9)
    torch.testing.assert_close(n.DL + n.DI, n.D)
    torch.testing.assert_close(n.DL, n.D * n.C)
    expected = {
        "entropy": n.H,
        "divergence": n.D,
        "tip": n.H + n.D - n.H * n.D,
        "compat": n.C,
        "ta_opd": n.D * n.C,
        "ta_opd_ent": n.H + n.D * n.C - n.H * n.D * n.C,
    }
    for name, value in expected.items():
        torch.testing.assert_close(S.selector_score(name, n), value)


# ---------------------------------------------------------------------------------------------------------------------
# Budgeted selection
# ---------------------------------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    lengths=st.lists(st.integers(0, T), min_size=1, max_size=4),
    rho=st.floats(0.01, 1.0),
    tie_break=st.sampled_from(S.TIE_BREAKS),
    min_one=st.booleans(),
    quantize=st.booleans(),
)
def test_select_top_budget_matches_reference(seed, lengths, rho, tie_break, min_one, quantize):
    mask = make_mask(lengths)
    score = torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=DT)
    if quantize:  # many ties
        score = (score * 3).floor()
    keep = S.select_top_budget(score, mask, rho, tie_break, min_one)
    expected = ref_select(score.numpy(), mask.numpy(), rho, tie_break, min_one)
    np.testing.assert_array_equal(keep.numpy(), expected)
    assert not (keep & ~mask).any()
    n = int(mask.sum())
    budget = math.ceil(round(rho * n, 9))
    if min_one:
        assert budget <= int(keep.sum()) <= budget + len(lengths)
        assert (keep.any(-1) == mask.any(-1)).all()
    else:
        assert int(keep.sum()) == budget


def test_ties_go_to_the_earliest_position_then_sequence():
    mask = make_mask([5, 5, 5])
    flat = torch.zeros(B, T)
    keep = S.select_top_budget(flat, mask, rho=0.4, min_one_per_response=False)  # ⌈0.4·15⌉ = 6
    expected = torch.zeros(B, T, dtype=torch.bool)
    expected[:, :2] = True  # positions 0 and 1 of every sequence
    assert torch.equal(keep, expected)
    keep_seq = S.select_top_budget(flat, mask, rho=0.4, tie_break="sequence", min_one_per_response=False)
    expected_seq = torch.zeros(B, T, dtype=torch.bool)
    expected_seq[0, :] = True
    expected_seq[1, :1] = True  # sequence 0 whole, then sequence 1's first position
    assert torch.equal(keep_seq, expected_seq)


def test_budget_is_exact_ceil_without_float_drift():
    assert S.budget_size(0.1, 30) == 3  # 0.1 * 30 = 3.0000000000000004 in floats
    assert S.budget_size(0.1, 31) == 4
    assert S.budget_size(1.0, 7) == 7
    assert S.budget_size(0.05, 1) == 1
    assert S.budget_size(0.5, 0) == 0


def test_at_least_one_per_response_is_added_on_top_of_the_budget():
    mask = make_mask([5, 2, 1])
    score = torch.tensor([[9.0, 8, 7, 6, 5], [1, 3, 0, 0, 0], [2, 0, 0, 0, 0]])
    keep = S.select_top_budget(score, mask, rho=0.2, min_one_per_response=True)  # ⌈0.2·8⌉ = 2: both from seq 0
    assert keep[0].tolist() == [True, True, False, False, False]
    assert keep[1].tolist() == [False, True, False, False, False]  # its best position, not its first
    assert keep[2].tolist() == [True, False, False, False, False]
    assert int(keep.sum()) == 4


def test_default_keeps_exactly_the_budget_as_the_paper_says():
    mask = make_mask([5, 2, 1])
    score = torch.tensor([[9.0, 8, 7, 6, 5], [1, 3, 0, 0, 0], [2, 0, 0, 0, 0]])
    keep = S.select_top_budget(score, mask, rho=0.2)  # the paper's text: exactly ⌈0.2·8⌉ = 2, nothing added
    assert keep[0].tolist() == [True, True, False, False, False] and not keep[1:].any()
    sel = S.make_selector("ta_opd")
    assert sel.selection.min_one_per_response is False
    out = S.make_selector("random").from_stats(None, mask, 0.2, torch.Generator().manual_seed(0))
    assert int(out.keep.sum()) == 2 and out.kept_fraction == 2 / 8


def test_one_token_responses_and_batch_of_one():
    single = make_mask([1, 1, 1])
    keep = S.select_top_budget(
        torch.tensor([[0.1] * T, [0.9] * T, [0.5] * T]), single, rho=0.1, min_one_per_response=True
    )
    assert torch.equal(keep, single)  # budget 1 plus one per response
    one = make_mask([4], seq=4)
    keep = S.select_top_budget(torch.tensor([[0.2, 0.7, 0.7, 0.1]]), one, rho=0.5)
    assert keep.tolist() == [[False, True, True, False]]
    assert not S.select_top_budget(torch.zeros(1, 4), torch.zeros(1, 4, dtype=torch.bool), rho=0.5).any()


@pytest.mark.parametrize("rho", [0.0, -0.1, 1.01, float("nan"), float("inf")])
def test_rho_outside_unit_interval_is_a_config_error(rho):
    with pytest.raises(ConfigError, match="rho"):
        S.select_top_budget(torch.zeros(B, T), MASK, rho)
    with pytest.raises(ConfigError, match="rho"):
        S.select("ta_opd", make_logp(0), make_logp(1), MASK, rho)


# ---------------------------------------------------------------------------------------------------------------------
# Selectors
# ---------------------------------------------------------------------------------------------------------------------


def test_full_keeps_every_valid_position():
    sel = S.select("full", None, None, MASK, rho=0.1)
    assert torch.equal(sel.keep, MASK) and sel.budget == int(MASK.sum()) and sel.kept_fraction == 1.0


@pytest.mark.parametrize("name", [n for n in S.SELECTORS if n != "random"])
def test_rho_one_keeps_every_valid_position(name):
    sel = S.select(name, make_logp(6), make_logp(7), MASK, rho=1.0)
    assert torch.equal(sel.keep, S.select("full", None, None, MASK, rho=1.0).keep)


@pytest.mark.parametrize("min_one", [False, True])
@pytest.mark.parametrize("d_mode", signals.D_MODES)
@pytest.mark.parametrize("name", ["entropy", "divergence", "tip", "compat", "ta_opd", "ta_opd_ent"])
def test_score_selectors_end_to_end_match_reference(name, d_mode, min_one):
    student, teacher = make_logp(8, (4, 6, V)), make_logp(9, (4, 6, V))
    mask = make_mask([6, 4, 1, 3], seq=6)
    sel = S.select(
        name, student, teacher, mask, rho=0.3, d_mode=d_mode, c_mode="lower_bound", k=4, min_one_per_response=min_one
    )
    ref = ref_stats(student, teacher, mask, 4)
    m = mask.numpy()
    h, d, c = (ref_norm(ref[key], m) for key in ("H", f"D_{d_mode}", "C_lower_bound"))
    score = {
        "entropy": h,
        "divergence": d,
        "tip": h + d - h * d,
        "compat": c,
        "ta_opd": d * c,
        "ta_opd_ent": h + d * c - h * d * c,
    }[name]
    np.testing.assert_allclose(sel.score.numpy(), score, atol=1e-9)
    np.testing.assert_array_equal(sel.keep.numpy(), ref_select(sel.score.numpy(), m, 0.3, "position", min_one))
    if not min_one:
        assert int(sel.keep.sum()) == sel.budget and sel.kept_fraction == sel.budget / 14
    assert sel.budget == math.ceil(0.3 * 14) and sel.normed is not None


def test_random_selector_is_reproducible_and_respects_the_budget():
    mask = make_mask([5, 5, 5])

    def run(seed):
        return S.select("random", None, None, mask, 0.4, torch.Generator().manual_seed(seed)).keep

    assert torch.equal(run(1), run(1))
    assert any(not torch.equal(run(1), run(s)) for s in range(2, 6))
    assert 6 <= int(run(3).sum()) <= 6 + B
    with pytest.raises(ValueError, match="Generator"):
        S.select("random", None, None, mask, 0.4)


def test_make_selector_validates_names_and_options():
    with pytest.raises(ConfigError, match="full, random, entropy, divergence, tip, compat, ta_opd, ta_opd_ent"):
        S.make_selector("greedy")
    bad_options = (
        {"k": 0},
        {"k": -3},
        {"c_mode": "x"},
        {"d_mode": "x"},
        {"tie_break": "x"},
        {"q_low": 0.96},
        {"q_high": 1.5},
    )
    for bad in bad_options:
        with pytest.raises(ConfigError):
            S.make_selector("ta_opd", **bad)
    assert not S.make_selector("full").needs_stats and not S.make_selector("random").needs_stats
    assert S.make_selector("ta_opd").needs_stats


def test_selector_from_precomputed_stats_equals_direct_call():
    student, teacher = make_logp(10), make_logp(11)
    selector = S.make_selector("ta_opd_ent", k=4)
    stats = signals.teachability_stats(student, teacher, MASK, k=4)
    assert torch.equal(selector.from_stats(stats, MASK, 0.25).keep, selector(student, teacher, MASK, 0.25).keep)
