"""`train.step`: micro-batched, chunked scoring gives the one-shot step's losses, gradients and selections.

The reference is the one-shot formulation written out here: `scorer.score_roles` (whole-batch [B, R, V]
log-probabilities), the selector on those, `losses.total_loss`, one backward. Every estimator, NCA, TA-OPD, DualOPD,
SymKL, a teacher whose vocabulary has extra padding rows, shared prefix on and off; per-term gradients; activation
checkpointing and bf16 autocast.
"""

from __future__ import annotations

import random

import pytest
import torch

from mechopd.core.views import assemble_two_views
from mechopd.generate.sampler import stable_seed
from mechopd.generate.scorer import score_roles
from mechopd.objectives.divergences import _kl, token_mean
from mechopd.objectives.losses import LossInputs, method_terms, terms_need, total_loss
from mechopd.objectives.select import make_selector
from mechopd.train import gradstats
from mechopd.train.step import StepOptions, StepScorer, enable_checkpointing

V, PAD_ROWS, T, BUDGET, SEED = 61, 7, 0.8, 0.3, 3


def _model(vocab: int, seed: int):
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=0,
        initializer_range=0.25,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.fixture(scope="module")
def models():
    return _model(V, 0), _model(V + PAD_ROWS, 1).requires_grad_(False)  # teacher: padded vocabulary


@pytest.fixture(scope="module")
def batch():
    rng = random.Random(0)
    header = [rng.randrange(3, V) for _ in range(12)]  # every context view starts with it (shared prefix)
    px, pc, resp = [], [], []
    for i in range(5):
        x = [rng.randrange(3, V) for _ in range(rng.randrange(3, 7))]
        px.append(x)
        pc.append(header + [rng.randrange(3, V) for _ in range(rng.randrange(1, 4))] + x)
        resp.append([rng.randrange(3, V) for _ in range([1, 4, 7, 7, 5][i])])  # padded responses
    return assemble_two_views(px, pc, resp, 0)


CASES = {  # name: (method, estimator options, selector)
    "opd-full": ("opd", dict(estimator="full"), "full"),
    "opd-topk": ("opd", dict(estimator="topk", topk=5), "full"),
    "opd-topk-tail": ("opd", dict(estimator="topk", topk=5, tail=True), "full"),
    "opd-topk-renorm": ("opd", dict(estimator="topk", topk=5, renormalize=True), "full"),
    "opd-sampled": ("opd", dict(estimator="sampled"), "full"),
    "ta_opd-sampled": ("opd", dict(estimator="sampled"), "ta_opd"),
    "ta_opd-topk": ("opd", dict(estimator="topk", topk=5), "ta_opd"),
    "nca-topk": ("nca", dict(estimator="topk", topk=5), "full"),
    "nca-sampled-ta_opd": ("nca", dict(estimator="sampled"), "ta_opd"),
    "nca-selected": ("nca", dict(estimator="full", nca_positions="selected"), "divergence"),
    "dual_opd": ("dual_opd", dict(estimator="topk", topk=5), "full"),
    "sym_kl": ("sym_kl", dict(estimator="full"), "full"),
    "nca-forward_full-ta_opd": ("nca", dict(estimator="forward_full"), "ta_opd"),  # the forward-KL ablation
}


def _params(student):
    return [p for p in student.parameters() if p.requires_grad]


def reference(student, teacher, batch, terms, selector, shared: str):
    """The one-shot step: whole-batch log-probs, selection, `total_loss`, one backward."""
    student.zero_grad(set_to_none=True)
    needs = terms_need(terms) | {"student_nctx", "teacher"}
    roles = [r for r in ("teacher", "student_nctx", "student_ctx") if r in needs or f"{r}_token" in needs]
    sc = score_roles(student, teacher, batch, roles, temperature=T, vocab=V, shared_prefix=shared)
    mask = batch.response_mask
    keep = None
    if any(t.selectable for t in terms):
        gen = torch.Generator().manual_seed(stable_seed(SEED, 0, -1) % (2**31))
        keep = selector(sc["student_nctx"].detach(), sc["teacher"], mask, BUDGET, gen).keep
    inputs = LossInputs(
        student_nctx=sc["student_nctx"],
        student_ctx=sc.get("student_ctx"),
        teacher=sc["teacher"],
        tokens=batch.response_ids,
    ).with_tokens()
    res = total_loss(terms, inputs, mask, keep)
    kl = token_mean(_kl(sc["student_nctx"].detach(), sc["teacher"]), mask)
    return res, keep, kl


def _close_grad(got, want, where: str) -> None:
    """Float tolerance at the gradient's own scale (summation order differs between chunks/micro-batches)."""
    assert got is not None, where
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-6 * max(1.0, float(want.abs().max())), msg=where)


def _scorer(student, teacher, terms, selector, mb, chunk, shared, **kw):
    opts = StepOptions(
        temperature=T,
        vocab=V,
        budget=BUDGET,
        seed=SEED,
        micro_batch_size=mb,
        logit_chunk=chunk,
        shared_prefix=shared,
        **kw,
    )
    return StepScorer(student, teacher, terms, selector, _params(student), opts)


@pytest.mark.parametrize("shared", ["off", "auto"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_micro_batched_chunked_step_equals_one_shot(models, batch, case, shared):
    student, teacher = models
    method, opts, sel_name = CASES[case]
    terms = method_terms(method, 0.7, **opts)
    selector = make_selector(sel_name, k=4)
    ref, ref_keep, ref_kl = reference(student, teacher, batch, terms, selector, shared)
    ref.loss.backward()
    ref_grads = [p.grad.clone() for p in _params(student)]
    for mb, chunk in [(None, None), (2, 3), (1, 1), (3, None), (None, 2)]:
        student.zero_grad(set_to_none=True)
        got = _scorer(student, teacher, terms, selector, mb, chunk, shared).step(batch, 0)
        where = f"{case} shared={shared} micro={mb} chunk={chunk}"
        torch.testing.assert_close(got.loss, ref.loss.detach(), rtol=1e-5, atol=1e-7, msg=where)
        for k, v in ref.logs.items():
            torch.testing.assert_close(got.logs[k], v, rtol=1e-5, atol=1e-7, msg=f"{where} {k}")
        if "student_nctx_token" not in terms_need(terms) or "teacher" in terms_need(terms):
            torch.testing.assert_close(got.logs["kl/teacher_student"], ref_kl, rtol=1e-5, atol=1e-7, msg=where)
        assert (got.keep is None) == (ref_keep is None) and (ref_keep is None or torch.equal(got.keep, ref_keep)), where
        for g, r in zip((p.grad for p in _params(student)), ref_grads):
            _close_grad(g, r, where)


def test_sampled_estimator_logs_the_sampled_kl_estimate(models, batch):
    """With only log q(y) and log f(y) computed, the logged KL is the mean single-sample estimate."""
    student, teacher = models
    terms = method_terms("opd", estimator="sampled")
    got = _scorer(student, teacher, terms, make_selector("full"), 2, 3, "off").step(batch, 0)
    torch.testing.assert_close(got.logs["kl/teacher_student"], got.logs["opd/kl_estimate"])


@pytest.mark.parametrize("method", ["nca", "sym_kl"])
def test_per_term_gradients_equal_the_one_shot_per_term_gradients(models, batch, method):
    student, teacher = models
    terms = method_terms(method, 0.7, estimator="topk", topk=5)
    selector = make_selector("ta_opd", k=4)
    ref, _, _ = reference(student, teacher, batch, terms, selector, "auto")
    want = gradstats.term_grads(ref.weighted, _params(student))
    student.zero_grad(set_to_none=True)
    got = _scorer(student, teacher, terms, selector, 2, 3, "auto").step(batch, 0, per_term=True)
    assert all(p.grad is None for p in _params(student))  # a per-term step leaves .grad alone
    assert list(got.term_grads) == list(want)
    for t in want:
        for g, r in zip(got.term_grads[t], want[t]):
            _close_grad(g, r, t)


def test_activation_checkpointing_gives_the_same_gradients(batch):
    terms = method_terms("nca", 0.5, estimator="topk", topk=5)
    selector = make_selector("full")
    out = []
    for ckpt in (False, True):
        student, teacher = _model(V, 0).train(), _model(V + PAD_ROWS, 1).requires_grad_(False)
        if ckpt:
            enable_checkpointing(student)
        student.zero_grad(set_to_none=True)
        res = _scorer(
            student, teacher, terms, selector, 2, 3, "auto", student_shared_prefix="off" if ckpt else None
        ).step(batch, 0)
        out.append((res.loss, [p.grad.clone() for p in _params(student)]))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-6, atol=0)
    for a, b in zip(out[1][1], out[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_bf16_autocast_runs_and_tracks_float32(models, batch):
    student, teacher = models
    terms = method_terms("nca", 0.5, estimator="full")
    selector = make_selector("full")
    ref = _scorer(student, teacher, terms, selector, 2, 3, "off").step(batch, 0)
    student.zero_grad(set_to_none=True)
    got = _scorer(student, teacher, terms, selector, 2, 3, "off", autocast=torch.bfloat16).step(batch, 0)
    assert got.loss.dtype == torch.float32  # log-softmax and losses in float32
    torch.testing.assert_close(got.loss, ref.loss, rtol=5e-2, atol=1e-3)
    assert all(torch.isfinite(p.grad).all() for p in _params(student))


def test_memory_fields_are_validated():
    from mechopd.config import TrainConfig
    from mechopd.core.errors import ConfigError

    assert TrainConfig(micro_batch_size=2, logit_chunk=16, gradient_checkpointing=True).logit_chunk == 16
    for bad in (
        dict(micro_batch_size=0),
        dict(logit_chunk=-1),
        dict(micro_batch_size=1.5),
        dict(gradient_checkpointing="yes"),
        dict(logit_chunk=8, sharding="fsdp"),
    ):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            TrainConfig(**bad)
