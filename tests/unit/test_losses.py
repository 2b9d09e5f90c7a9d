"""mechopd.objectives.losses against slow explicit references (Python loops over positions and vocabulary, autograd)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mechopd.objectives import divergences
from mechopd.objectives import losses as L
from mechopd.objectives.schedule import BetaSchedule

B, T, V = 2, 3, 7
DT = torch.float64


def make_logits(seed: int, shape=(B, T, V), scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g, dtype=DT)).requires_grad_(True)


def logp(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, -1)


def weights(seed: int = 99) -> torch.Tensor:
    """Distinct per-position weights so a gradient check sees every position's contribution separately."""
    return torch.rand((B, T), generator=torch.Generator().manual_seed(seed), dtype=DT) + 0.5


# ---------------------------------------------------------------------------------------------------------------------
# Slow references: scalars only, loops over (b, t, v)
# ---------------------------------------------------------------------------------------------------------------------


def ref_probs(row: torch.Tensor) -> list[torch.Tensor]:
    """softmax of a 1-D logits row, one scalar at a time."""
    z = sum(torch.exp(row[v]) for v in range(row.shape[0]))
    return [torch.exp(row[v]) / z for v in range(row.shape[0])]


def ref_kl_row(p: list, q: list, ids=None) -> torch.Tensor:
    ids = range(len(p)) if ids is None else ids
    return sum(p[v] * (torch.log(p[v]) - torch.log(q[v])) for v in ids)


def ref_per_pos(fn, *logits) -> torch.Tensor:
    """Apply fn(list of prob-lists per input, b, t) at every position, stacked into [B, T]."""
    rows = []
    for b in range(B):
        row = []
        for t in range(T):
            row.append(fn(*[ref_probs(x[b, t]) for x in logits]))
        rows.append(torch.stack(row))
    return torch.stack(rows)


def ref_topk_row(q: list, f: list, k: int, renormalize: bool, tail: bool) -> tuple[torch.Tensor, float]:
    ids = sorted(range(len(q)), key=lambda v: -q[v].item())[:k]
    mass = sum(q[v].item() for v in ids)
    if renormalize:
        zq, zf = sum(q[v] for v in ids), sum(f[v] for v in ids)
        return sum(q[v] / zq * (torch.log(q[v] / zq) - torch.log(f[v] / zf)) for v in ids), mass
    kl = ref_kl_row(q, f, ids)
    rest = [v for v in range(len(q)) if v not in ids]
    if tail and rest:
        mq, mf = sum(q[v] for v in rest), sum(f[v] for v in rest)
        kl = kl + mq * (torch.log(mq) - torch.log(mf))
    return kl, mass


def value_and_grads(per_pos: torch.Tensor, *leaves: torch.Tensor, w: torch.Tensor | None = None):
    w = weights() if w is None else w
    total = (per_pos * w).sum()
    grads = torch.autograd.grad(total, leaves, allow_unused=True)
    return per_pos.detach(), grads


def assert_close(a, b, **kw):
    torch.testing.assert_close(a, b, rtol=kw.get("rtol", 1e-9), atol=kw.get("atol", 1e-10))


# ---------------------------------------------------------------------------------------------------------------------
# Per-position losses
# ---------------------------------------------------------------------------------------------------------------------


def test_reverse_kl_full_matches_loop_reference_values_and_grads():
    s, t = make_logits(0), make_logits(1)
    fast, (gs, gt) = value_and_grads(divergences.reverse_kl_full(logp(s), logp(t)), s, t)
    ref, (rs,) = value_and_grads(ref_per_pos(lambda q, f: ref_kl_row(q, f), s, t.detach()), s)
    assert_close(fast, ref)
    assert_close(gs, rs)
    assert gt is None  # the teacher is detached


def test_forward_kl_full_matches_loop_reference_and_pulls_by_the_teachers_probability():
    """Estimator forward_full: KL(f ‖ q_x) per position; autograd of the loop formula, and the closed form q_x − f."""
    s, t = make_logits(0), make_logits(1)
    fast, (gs, gt) = value_and_grads(divergences.forward_kl_full(logp(s), logp(t)), s, t)
    ref, (rs,) = value_and_grads(ref_per_pos(lambda q, f: ref_kl_row(f, q), s, t.detach()), s)
    assert_close(fast, ref)
    assert_close(gs, rs)
    assert_close(gs, weights()[..., None] * (logp(s).exp() - logp(t).exp()).detach())  # ∂/∂z_x = w (q_x − f)
    assert gt is None  # the teacher is detached
    assert not torch.allclose(fast, divergences.reverse_kl_full(logp(s), logp(t)).detach())  # a different divergence


def test_forward_kl_is_zero_at_the_teacher_and_moves_a_rare_token_by_the_teachers_mass():
    s = make_logits(3)
    same, (g,) = value_and_grads(divergences.forward_kl_full(logp(s), logp(s).detach()), s)
    assert_close(same, torch.zeros_like(same), atol=1e-12)
    assert_close(g, torch.zeros_like(g), atol=1e-12)
    # one position: the student gives token 0 probability 1e-4, the teacher 0.05 (pilot 2's medians, issue 52)
    V_ = 50
    q = torch.full((V_,), (1 - 1e-4) / (V_ - 1), dtype=DT)
    q[0] = 1e-4
    f = torch.full((V_,), 0.95 / (V_ - 1), dtype=DT)
    f[0] = 0.05
    z = q.log().reshape(1, 1, V_).requires_grad_(True)
    lf = f.log().reshape(1, 1, V_)
    (g_fwd,) = torch.autograd.grad(divergences.forward_kl_full(logp(z), lf).sum(), z)
    (g_rev,) = torch.autograd.grad(divergences.reverse_kl_full(logp(z), lf).sum(), z)
    assert_close(g_fwd[0, 0, 0], torch.tensor(1e-4 - 0.05, dtype=DT))  # descent raises z_0 by f − q_x
    assert float(-g_fwd[0, 0, 0]) > 50 * abs(float(g_rev[0, 0, 0]))  # reverse KL: ~q_x, two orders smaller


def test_forward_full_with_the_anchor_the_selector_and_the_dual_term():
    """NCA's anchor does not read the OPD estimator (same value and q_c gradient as with full); a TA-OPD keep-mask
    applies to the forward KL term; DualOPD's extra term takes the same direction, KL(f ‖ q_c)."""
    inputs, x, c = _inputs()
    keep = torch.tensor([[False, True, False], [True, False, False]])
    nca_f, logs_f, *_ = L.total_loss(L.method_terms("nca", beta=0.5, estimator="forward_full"), inputs, MASK, keep)
    nca_r, logs_r, *_ = L.total_loss(L.method_terms("nca", beta=0.5, estimator="full"), inputs, MASK, keep)
    assert_close(logs_f["loss/nca"], logs_r["loss/nca"])
    (gc_f,) = torch.autograd.grad(nca_f, c, retain_graph=True)
    (gc_r,) = torch.autograd.grad(nca_r, c, retain_graph=True)
    assert_close(gc_f, gc_r)
    fwd = divergences.forward_kl_full(inputs.student_nctx, inputs.teacher)
    assert_close(logs_f["loss/opd"], divergences.token_mean(fwd, MASK & keep).detach())
    dual, logs_d, *_ = L.total_loss(L.method_terms("dual_opd", estimator="forward_full"), inputs, MASK)
    assert_close(
        logs_d["loss/dual"],
        divergences.token_mean(divergences.forward_kl_full(inputs.student_ctx, inputs.teacher), MASK).detach(),
    )


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("renormalize,tail", [(False, False), (True, False), (False, True)])
def test_reverse_kl_topk_matches_loop_reference(k, renormalize, tail):
    s, t = make_logits(2), make_logits(3)
    out = divergences.reverse_kl_topk(logp(s), logp(t), k=k, renormalize=renormalize, tail=tail)
    fast, (gs, gt) = value_and_grads(out.kl, s, t)
    ref_kl = ref_per_pos(lambda q, f: ref_topk_row(q, f, k, renormalize, tail)[0], s, t.detach())
    ref, (rs,) = value_and_grads(ref_kl, s)
    ref_mass = ref_per_pos(lambda q, f: torch.tensor(ref_topk_row(q, f, k, False, False)[1], dtype=DT), s, t)
    assert_close(fast, ref)
    assert_close(gs, rs)
    assert_close(out.mass, ref_mass.detach())
    assert gt is None
    assert not out.mass.requires_grad


@pytest.mark.parametrize("k", [V, V + 5, 256])
@pytest.mark.parametrize("renormalize,tail", [(False, False), (True, False), (False, True)])
def test_topk_with_k_at_least_vocab_equals_full(k, renormalize, tail):
    s, t = make_logits(4), make_logits(5)
    topk, (g_topk,) = value_and_grads(divergences.reverse_kl_topk(logp(s), logp(t), k, renormalize, tail).kl, s)
    full, (g_full,) = value_and_grads(divergences.reverse_kl_full(logp(s), logp(t)), s)
    assert_close(topk, full)
    assert_close(g_topk, g_full)
    assert_close(divergences.reverse_kl_topk(logp(s), logp(t), k).mass, torch.ones(B, T, dtype=DT))


def test_topk_without_tail_can_go_negative_and_tail_fixes_it():
    # Student puts half its mass on id 0 (its top-1) where the teacher puts 0.9: Σ_{S} q log(q/f) < 0.
    q = torch.tensor([0.5] + [0.5 / (V - 1)] * (V - 1), dtype=DT).log().expand(1, 1, V)
    f = torch.tensor([0.9] + [0.1 / (V - 1)] * (V - 1), dtype=DT).log().expand(1, 1, V)
    assert float(divergences.reverse_kl_topk(q, f, k=1).kl) < 0
    with_tail = float(divergences.reverse_kl_topk(q, f, k=1, tail=True).kl)
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert with_tail == pytest.approx(expected, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, V))
def test_topk_with_tail_is_a_coarsened_kl_between_zero_and_full(seed, k):
    """Grouping the non-top-k ids into one bucket is a coarsening: 0 <= KL_tail <= KL_full (log-sum inequality)."""
    s, t = make_logits(seed, scale=3.0), make_logits(seed + 1, scale=3.0)
    tail = divergences.reverse_kl_topk(logp(s), logp(t), k, tail=True).kl.detach()
    full = divergences.reverse_kl_full(logp(s), logp(t)).detach()
    assert (tail >= -1e-12).all()
    assert (tail <= full + 1e-12).all()


def test_sampled_token_kl_matches_reference_and_is_not_a_kl_value():
    s, t = make_logits(6), make_logits(7)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
    out = divergences.sampled_token_kl(logp(s), logp(t), tokens)
    fast, (gs, gt) = value_and_grads(out.loss, s, t)

    def ref_row(b, tt):
        q, f = ref_probs(s[b, tt]), ref_probs(t[b, tt].detach())
        y = int(tokens[b, tt])
        advantage = -(torch.log(q[y]) - torch.log(f[y])).detach()
        return -advantage * torch.log(q[y]), (torch.log(q[y]) - torch.log(f[y])).detach()

    pairs = [[ref_row(b, tt) for tt in range(T)] for b in range(B)]
    ref_loss = torch.stack([torch.stack([p[0] for p in row]) for row in pairs])
    ref_ratio = torch.stack([torch.stack([p[1] for p in row]) for row in pairs])
    ref, (rs,) = value_and_grads(ref_loss, s)
    assert_close(fast, ref)
    assert_close(gs, rs)
    assert_close(out.log_ratio, ref_ratio)
    assert gt is None and not out.log_ratio.requires_grad
    # The surrogate's value is log_ratio · log q(y), not the KL estimate log_ratio.
    assert not torch.allclose(out.loss, out.log_ratio)


def test_sampled_token_kl_gradient_is_unbiased_for_the_full_kl():
    """E_{y~q_x}[∇ loss(y)] = ∇ KL(q_x ‖ f): enumerate every y, weight by sg[q_x(y)]."""
    s, t = make_logits(8), make_logits(9)
    ls, lt = logp(s), logp(t)
    q = ls.detach().exp()
    expected = torch.zeros((), dtype=DT)
    for y in range(V):
        tokens = torch.full((B, T), y)
        expected = expected + (q[..., y] * divergences.sampled_token_kl(ls, lt, tokens).loss).sum()
    (g_sampled,) = torch.autograd.grad(expected, s, retain_graph=True)
    (g_full,) = torch.autograd.grad(divergences.reverse_kl_full(ls, lt).sum(), s)
    assert_close(g_sampled, g_full)


def test_nca_anchor_matches_reference_and_stops_gradient_into_no_context_view():
    x, c = make_logits(10), make_logits(11)
    fast, (gx, gc) = value_and_grads(divergences.nca_anchor(logp(x), logp(c)), x, c)
    ref, (rc,) = value_and_grads(ref_per_pos(lambda qx, qc: ref_kl_row(qx, qc), x.detach(), c), c)
    assert_close(fast, ref)
    assert_close(gc, rc)
    assert gx is None  # KL(sg[q_x] ‖ q_c): no gradient into the no-context logits


def test_dual_opd_ctx_matches_reference():
    c, t = make_logits(12), make_logits(13)
    fast, (gc, gt) = value_and_grads(divergences.dual_opd_ctx(logp(c), logp(t)), c, t)
    ref, (rc,) = value_and_grads(ref_per_pos(lambda qc, f: ref_kl_row(qc, f), c, t.detach()), c)
    assert_close(fast, ref)
    assert_close(gc, rc)
    assert gt is None


def test_sym_kl_matches_reference_and_moves_both_views():
    x, c = make_logits(14), make_logits(15)
    fast, (gx, gc) = value_and_grads(divergences.sym_kl(logp(x), logp(c)), x, c)
    ref_fn = lambda qx, qc: 0.5 * (ref_kl_row(qx, qc) + ref_kl_row(qc, qx))  # noqa: E731
    ref, (rx, rc) = value_and_grads(ref_per_pos(ref_fn, x, c), x, c)
    assert_close(fast, ref)
    assert_close(gx, rx)
    assert_close(gc, rc)
    assert gx.abs().sum() > 0


def test_losses_reject_misaligned_vocab_and_common_vocab_fixes_it():
    student, teacher = make_logits(16, (B, T, V)), make_logits(17, (B, T, V + 3))
    with pytest.raises(ValueError, match="common_vocab"):
        divergences.reverse_kl_full(logp(student), logp(teacher))
    s2, t2 = divergences.common_vocab(student, teacher)
    assert s2.shape == t2.shape == (B, T, V)
    assert torch.equal(t2, teacher[..., :V])  # padding rows dropped BEFORE log_softmax
    assert torch.allclose(logp(t2).exp().sum(-1), torch.ones(B, T, dtype=DT))
    assert divergences.reverse_kl_full(logp(s2), logp(t2)).shape == (B, T)


# ---------------------------------------------------------------------------------------------------------------------
# Reduction and method registry
# ---------------------------------------------------------------------------------------------------------------------


def test_token_mean_is_masked_mean_over_the_batch_and_ignores_padding_values():
    values = torch.arange(B * T, dtype=DT).view(B, T)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    expected = (0 + 1 + 3) / 3
    assert float(divergences.token_mean(values, mask)) == pytest.approx(expected)
    poisoned = values.clone()
    poisoned[~mask] = float("nan")
    assert float(divergences.token_mean(poisoned, mask)) == pytest.approx(expected)


def test_token_mean_raises_on_empty_mask():
    with pytest.raises(ValueError, match="no response token"):
        divergences.token_mean(torch.zeros(B, T), torch.zeros(B, T, dtype=torch.bool))


@pytest.mark.parametrize(
    "method,names,weights_",
    [
        ("opd", ["opd"], [1.0]),
        ("nca", ["opd", "nca"], [1.0, 0.3]),
        ("dual_opd", ["opd", "dual"], [1.0, 1.0]),
        ("sym_kl", ["opd", "sym"], [1.0, 0.3]),
        ("anchor_only", ["nca"], [0.3]),
    ],
)
def test_method_terms_shape(method, names, weights_):
    terms = L.method_terms(method, beta=0.3)
    assert [t.name for t in terms] == names
    assert [t.weight for t in terms] == weights_
    assert [t.selectable for t in terms] == [method != "anchor_only"] + [False] * (len(terms) - 1)
    needs_ctx = method != "opd"
    assert ("student_ctx" in L.terms_need(terms)) == needs_ctx
    sampled = L.terms_need(L.method_terms(method, estimator="sampled"))
    assert (
        method == "anchor_only" or {"student_nctx_token", "teacher_token"} <= sampled
    )  # log q(y), log f(y): never the full tensors
    assert method != "opd" or not sampled & set(L.FULL_VIEWS)
    assert "tokens" not in L.terms_need(L.method_terms(method, estimator="full"))


def test_method_terms_build_from_the_registry():
    """Every method's terms are registered; anchors carry β and the schedule, nca_positions moves into the term."""
    assert set(L.METHODS) == {"opd", "nca", "dual_opd", "sym_kl", "anchor_only"}
    assert all(name in L.TERMS for names in L.METHODS.values() for name in names)
    sched = BetaSchedule(start=2, warmup=4)
    terms = L.method_terms("nca", beta=0.5, schedule=sched, nca_positions="selected")
    assert [t.selectable for t in terms] == [True, True]
    assert [terms[1].weight_at(s) for s in range(8)] == [0.0, 0.0, 0.125, 0.25, 0.375, 0.5, 0.5, 0.5]
    assert terms[0].weight_at(0) == 1.0  # the OPD term is never scheduled
    with pytest.raises(ValueError, match="ppo"):
        L.method_terms("ppo")


def _inputs(seed: int = 20, with_tokens: bool = True) -> tuple[L.LossInputs, torch.Tensor, torch.Tensor]:
    x, c, t = make_logits(seed), make_logits(seed + 1), make_logits(seed + 2)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed)) if with_tokens else None
    return L.LossInputs(logp(x), logp(c), logp(t).detach(), tokens).with_tokens(), x, c


MASK = torch.tensor([[True, True, True], [True, True, False]])


@pytest.mark.parametrize("estimator", ["topk", "full", "sampled", "forward_full"])
def test_nca_with_beta_zero_equals_opd(estimator):
    inputs, x, c = _inputs()
    opd, *_ = L.total_loss(L.method_terms("opd", estimator=estimator, topk=3), inputs, MASK)
    nca, *_ = L.total_loss(L.method_terms("nca", beta=0.0, estimator=estimator, topk=3), inputs, MASK)
    assert torch.equal(opd, nca)
    g_opd = torch.autograd.grad(opd, x, retain_graph=True)[0]
    g_nca_x, g_nca_c = torch.autograd.grad(nca, (x, c), allow_unused=True)
    assert torch.equal(g_opd, g_nca_x)
    assert g_nca_c is None or not g_nca_c.any()


def test_anchor_only_is_the_nca_term_alone_and_never_reads_the_teacher():
    """The deafness control: β·KL(sg[q_x] ‖ q_c) with no OPD term; its gradient is NCA's context-view gradient, the
    no-context view gets none (stop-gradient), and no teacher is needed."""
    inputs, x, c = _inputs()
    terms = L.method_terms("anchor_only", beta=0.5, estimator="full")
    assert "teacher" not in L.terms_need(terms)
    loss, logs, *_ = L.total_loss(terms, inputs, MASK)
    g_x, g_c = torch.autograd.grad(loss, (x, c), allow_unused=True, retain_graph=True)
    nca, *_ = L.total_loss(L.method_terms("nca", beta=0.5, estimator="full"), inputs, MASK)
    (g_nca_c,) = torch.autograd.grad(nca, c)
    assert g_x is None or not g_x.any()
    assert_close(g_c, g_nca_c)
    assert_close(
        loss, 0.5 * divergences.token_mean(divergences.nca_anchor(inputs.student_nctx, inputs.student_ctx), MASK)
    )


def test_nca_gradients_split_by_view():
    """q_x gets gradient only from OPD; q_c only from the anchor (and OPD gives the ctx logits none)."""
    inputs, x, c = _inputs()
    beta = 0.5
    opd_only, *_ = L.total_loss(L.method_terms("opd", estimator="full"), inputs, MASK)
    g_opd_x, g_opd_c = torch.autograd.grad(opd_only, (x, c), allow_unused=True, retain_graph=True)
    assert g_opd_c is None  # the OPD term never touches the context view
    nca, logs, *_ = L.total_loss(L.method_terms("nca", beta=beta, estimator="full"), inputs, MASK)
    g_x, g_c = torch.autograd.grad(nca, (x, c), retain_graph=True)
    anchor = divergences.token_mean(divergences.nca_anchor(inputs.student_nctx, inputs.student_ctx), MASK)
    (g_anchor_c,) = torch.autograd.grad(beta * anchor, c)
    assert_close(g_x, g_opd_x)
    assert_close(g_c, g_anchor_c)
    assert_close(logs["loss/nca"], anchor.detach())


def test_total_loss_applies_keep_only_to_the_opd_term_and_logs_stats():
    inputs, _, _ = _inputs()
    keep = torch.tensor([[False, True, False], [True, False, False]])
    loss, logs, *_ = L.total_loss(L.method_terms("nca", beta=0.25, topk=3), inputs, MASK, keep=keep)
    kl, mass = divergences.reverse_kl_topk(inputs.student_nctx, inputs.teacher, 3)
    opd = divergences.token_mean(kl, MASK & keep)
    anchor = divergences.token_mean(divergences.nca_anchor(inputs.student_nctx, inputs.student_ctx), MASK)
    assert_close(loss.detach(), (opd + 0.25 * anchor).detach())
    assert_close(logs["loss/opd"], opd.detach())
    assert_close(logs["opd/topk_mass"], divergences.token_mean(mass, MASK))
    sampled_logs = L.total_loss(L.method_terms("opd", estimator="sampled"), inputs, MASK)[1]
    assert "opd/kl_estimate" in sampled_logs


def test_missing_input_is_reported():
    inputs, _, _ = _inputs(with_tokens=False)
    with pytest.raises(ValueError, match="student_nctx_token"):
        L.total_loss(L.method_terms("opd", estimator="sampled"), inputs, MASK)


def test_sampled_estimator_on_token_log_probs_equals_the_full_form():
    """The trainer's form (z_y/T − logsumexp(z/T), no [B, T, V] log-probs) is the full-tensor form, value and grad."""
    from mechopd.generate.scorer import token_logp

    x, t = make_logits(5), make_logits(6)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    full = divergences.sampled_token_kl(torch.log_softmax(x / 0.7, -1), torch.log_softmax(t / 0.7, -1), tokens)
    part = divergences.sampled_token_kl_on_tokens(token_logp(x, tokens, 0.7), token_logp(t, tokens, 0.7))
    f32 = dict(rtol=1e-5, atol=1e-5)  # token_logp computes in float32, as the scorer does
    torch.testing.assert_close(part.loss, full.loss.float(), **f32)
    torch.testing.assert_close(part.log_ratio, full.log_ratio.float(), **f32)
    torch.testing.assert_close(
        torch.autograd.grad(part.loss.sum(), x, retain_graph=True)[0], torch.autograd.grad(full.loss.sum(), x)[0], **f32
    )
