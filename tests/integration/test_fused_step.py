"""`train.headstep`: the training step with the fused loss head equals the logits path (`train.step.StepScorer`,
itself pinned to the one-shot step in test_step.py) in loss, logs, selections and gradients: OPD and NCA under every
estimator, selectors, micro-batches and chunks, per-term gradients; ``loss_head`` resolved and refused as documented;
and a whole training run on the zoo's Qwen3 and Llama fixtures gives the same losses and weights either way."""

from __future__ import annotations

import json
import random

import pytest
import torch

from mechopd.config import TrainConfig
from mechopd.core.errors import ConfigError
from mechopd.core.views import assemble_two_views
from mechopd.objectives.losses import TermOptions, method_terms
from mechopd.objectives.select import make_selector
from mechopd.train.headstep import FusedStepScorer, head_choice, use_fused
from mechopd.train.step import StepOptions, StepScorer

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
    rng = random.Random(1)
    px, pc, resp = [], [], []
    for i in range(5):
        x = [rng.randrange(3, V) for _ in range(rng.randrange(3, 7))]
        px.append(x)
        pc.append([rng.randrange(3, V) for _ in range(rng.randrange(4, 9))] + x)
        resp.append([rng.randrange(3, V) for _ in range([2, 4, 7, 7, 5][i])])  # padded responses
    return assemble_two_views(px, pc, resp, 0)


CASES = {  # name: (method, estimator options, selector)
    "opd-full": ("opd", dict(estimator="full"), "full"),
    "opd-topk-tail": ("opd", dict(estimator="topk", topk=5, tail=True), "full"),
    "opd-topk-renorm": ("opd", dict(estimator="topk", topk=5, renormalize=True), "full"),
    "opd-sampled": ("opd", dict(estimator="sampled"), "full"),
    "ta_opd-topk": ("opd", dict(estimator="topk", topk=5), "ta_opd"),
    "nca-full": ("nca", dict(estimator="full"), "full"),
    "nca-topk": ("nca", dict(estimator="topk", topk=5), "full"),
    "nca-sampled-ta_opd": ("nca", dict(estimator="sampled"), "ta_opd"),
    "nca-selected": ("nca", dict(estimator="full", nca_positions="selected"), "divergence"),
    "anchor_only-full": ("anchor_only", dict(estimator="full"), "full"),
}


def _params(m):
    return [p for p in m.parameters() if p.requires_grad]


def _scorers(models, case, mb, chunk):
    student, teacher = models
    method, opts, sel = CASES[case]
    terms = method_terms(method, 0.7, **opts)
    options = TermOptions(**{k: v for k, v in opts.items() if k != "nca_positions"})
    o = StepOptions(
        temperature=T, vocab=V, budget=BUDGET, seed=SEED, micro_batch_size=mb, logit_chunk=chunk, shared_prefix="off"
    )
    args = (student, teacher, terms, make_selector(sel, k=4), _params(student), o)
    return StepScorer(*args), FusedStepScorer(*args, options=options)


def _run(scorer, batch, per_term=False):
    scorer.student.zero_grad(set_to_none=True)
    res = scorer.step(batch, 0, per_term=per_term)
    return res, [None if p.grad is None else p.grad.clone() for p in _params(scorer.student)]


def _close_grad(got, want, where):
    assert got is not None, where
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-6 * max(1.0, float(want.abs().max())), msg=where)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_step_equals_the_logits_step(models, batch, case):
    ref, ref_grads = _run(_scorers(models, case, None, None)[0], batch)
    for mb, chunk in [(None, None), (2, 3), (1, 1)]:
        got, grads = _run(_scorers(models, case, mb, chunk)[1], batch)
        where = f"{case} micro={mb} chunk={chunk}"
        torch.testing.assert_close(got.loss, ref.loss, rtol=1e-5, atol=1e-7, msg=where)
        assert set(got.logs) == set(ref.logs), where
        for k, v in ref.logs.items():
            torch.testing.assert_close(got.logs[k], v, rtol=1e-5, atol=1e-7, msg=f"{where} {k}")
        assert got.weights == ref.weights and got.kept == ref.kept, where
        assert (got.keep is None) == (ref.keep is None) and (ref.keep is None or torch.equal(got.keep, ref.keep))
        for g, r in zip(grads, ref_grads):
            _close_grad(g, r, where)


@pytest.mark.parametrize("case", ["nca-topk", "opd-sampled", "anchor_only-full"])
def test_fused_per_term_gradients_equal_the_logits_ones(models, batch, case):
    ref, _ = _run(_scorers(models, case, 2, 3)[0], batch, per_term=True)
    got, grads = _run(_scorers(models, case, 2, 3)[1], batch, per_term=True)
    assert all(g is None for g in grads)  # a per-term step leaves .grad alone
    assert list(got.term_grads) == list(ref.term_grads)
    for t in ref.term_grads:
        for g, r in zip(got.term_grads[t], ref.term_grads[t]):
            _close_grad(g, r, t)


def test_loss_head_is_resolved_and_refused_as_documented(models):
    student, teacher = models
    opd, sym = method_terms("opd"), method_terms("sym_kl")
    assert use_fused("fused", opd, student, teacher, V, "none")
    assert not use_fused("auto", opd, student, teacher, V, "none")  # V = 61 < 8192: the logits path
    assert use_fused("auto", opd, student, teacher, 8192, "none")
    assert not use_fused("auto", sym, student, teacher, 8192, "none") and not use_fused(
        "logits", opd, student, teacher, 8192, "none"
    )
    with pytest.raises(ConfigError, match="not sym"):
        use_fused("fused", sym, student, teacher, V, "none")
    for bad in (dict(method="sym_kl"), dict(method="dual_opd"), dict(sharding="fsdp"), dict(loss_head="fast")):
        with pytest.raises(ConfigError, match="loss_head"):
            TrainConfig(loss_head=bad.pop("loss_head", "fused"), **bad)
    assert TrainConfig(loss_head="auto", method="sym_kl", sharding="fsdp").loss_head == "auto"


def test_loss_head_choice_says_which_head_and_why(models):
    student, teacher = models
    opd, sym = method_terms("opd"), method_terms("sym_kl")
    assert head_choice("auto", opd, student, teacher, V, "none") == (
        False,
        "auto: vocabulary 61 < 8192, where the logits path is as fast",
    )
    fused, why = head_choice("auto", opd, student, teacher, 8192, "none")
    assert fused and why.startswith("auto: vocabulary 8192 >= 8192")
    fused, why = head_choice("auto", sym, student, teacher, 8192, "none")
    assert not fused and why == "auto: it computes the opd and nca terms only, not sym"
    assert head_choice("auto", opd, student, teacher, 8192, "fsdp") == (False, "auto: sharding is not none")
    assert head_choice("logits", opd, student, teacher, 8192, "none") == (False, "loss_head=logits")


def test_cli_refuses_fused_with_a_method_it_cannot_do(tmp_path, capsys):
    from mechopd.cli import main

    code = main(["train", "--method", "sym_kl", "--set", "loss_head=fused", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "loss_head=fused" in err[0] and "set loss_head=logits" in err[0]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_training_run_is_the_same_with_either_loss_head(tmp_path, family):
    """Two steps of NCA (top-k with a tail, micro-batches, chunks) on a zoo fixture: per-step losses and KL and the
    final weights agree between loss_head=fused and loss_head=logits."""
    from mechopd.models import load_model
    from mechopd.testing.zoo import build_zoo
    from mechopd.train.trainer import Trainer

    zoo = build_zoo()
    out = {}
    for head in ("logits", "fused"):
        cfg = TrainConfig(
            task="jsonl",
            task_options=zoo.jsonl_options(max_new_tokens=6),
            student=str(zoo.student(family)),
            method="nca",
            estimator="topk",
            topk=16,
            tail=True,
            batch_size=3,
            steps=2,
            lr=1e-3,
            pool_size=6,
            micro_batch_size=2,
            logit_chunk=4,
            loss_head=head,
            temperature=1.0,
            no_context_system="" if family == "llama" else None,  # its template renders a system block always
            chat_template_kwargs={"date_string": "26 Jul 2024"} if family == "llama" else {"enable_thinking": False},
        )
        tr = Trainer(cfg, tmp_path / head, progress=False)
        assert type(tr.scoring).__name__ == ("FusedStepScorer" if head == "fused" else "StepScorer")
        tr.run()
        rows = [json.loads(x) for x in (tmp_path / head / "metrics.jsonl").read_text().splitlines()]
        out[head] = rows, load_model(tmp_path / head / "final").state_dict()
    (a, wa), (b, wb) = out["logits"], out["fused"]
    assert [r["response_tokens"] for r in a] == [r["response_tokens"] for r in b]  # the same rollouts
    for ra, rb in zip(a, b):
        for k in ("loss", "loss/opd", "loss/nca", "kl/teacher_student", "opd/topk_mass", "grad_norm"):
            assert rb[k] == pytest.approx(ra[k], rel=1e-4, abs=1e-6), k
    for k, v in wa.items():  # AdamW turns float-order noise in a ~0 gradient into steps up to lr: a few entries move
        diff = (wb[k] - v).abs()  # (measured: max 2e-5 on 0.7 % of the tied head rows), a wrong gradient moves most
        assert float(diff.max()) < 0.05 * 1e-3 and float((diff > 1e-6).float().mean()) < 0.02, k


def _zoo_cfg(zoo, **kw):
    return TrainConfig(
        task="jsonl",
        task_options=zoo.jsonl_options(max_new_tokens=6),
        student=str(zoo.student("qwen3")),
        method="nca",
        batch_size=3,
        lr=1e-3,
        pool_size=6,
        temperature=1.0,
        chat_template_kwargs={"enable_thinking": False},
        **kw,
    )


def test_a_resume_may_change_the_loss_head(tmp_path, capsys):
    """loss_head is resume-mutable (config.RESUME_MUTABLE): two steps on the logits path, resumed for a third on the
    fused head, give the losses of three steps on the logits path; the trainer prints which head each leg took."""
    from mechopd.testing.zoo import build_zoo
    from mechopd.train.trainer import Trainer

    zoo = build_zoo()
    Trainer(_zoo_cfg(zoo, steps=3, loss_head="logits"), tmp_path / "ref", progress=False).run()
    Trainer(_zoo_cfg(zoo, steps=2, save_every=2, loss_head="logits"), tmp_path / "r", progress=False).run()
    tr = Trainer(_zoo_cfg(zoo, steps=3, save_every=2, loss_head="fused"), tmp_path / "r", resume=True, progress=False)
    assert type(tr.scoring).__name__ == "FusedStepScorer"
    tr.run()
    printed = capsys.readouterr().out
    assert "loss head: logits (loss_head=logits)" in printed and "loss head: fused (loss_head=fused)" in printed
    ref, got = (
        [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
        for d in ("ref", "r")
    )
    assert [r["step"] for r in got] == [1, 2, 3]
    for ra, rb in zip(ref, got):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-4, abs=1e-6)
