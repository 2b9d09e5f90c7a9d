"""Gradient alignment probe: self-alignment, a slow per-sequence reference, aggregation sums, layer restriction, I/O."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.views import RenderSpec, build_two_view_batch, render_prompt_ids
from mechopd.organisms.tokenizer import build_tokenizer
from mechopd.probes.gradients import GradientsOptions, GradRow, run_gradients, select_parameters, term_gradients
from mechopd.probes.setup import ProbeSetup
from mechopd.tasks.base import get_task

TASK = get_task("rules")
TOK = build_tokenizer(TASK.vocab())
SPEC = RenderSpec(placement="system")


def tiny(seed: int, layers: int = 2, tok=TOK) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.3,
    )
    return Qwen3ForCausalLM(cfg).eval()


def fixed_batch(n: int = 3):
    """Prompts of different lengths (left padding in play) and responses of different lengths."""
    examples = TASK.examples("train", n, 1)
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(5, len(TOK), (3 + 2 * i,), generator=g).tolist() for i in range(n)]
    batch = build_two_view_batch(TOK, [e.prompt for e in examples], [e.context for e in examples], responses, SPEC)
    return examples, responses, batch


def by_key(rows: list[GradRow]) -> dict[tuple, GradRow]:
    return {(r.scope, r.layer, r.module): r for r in rows}


# ---------------------------------------------------------------------------------------------------- properties
@pytest.mark.parametrize("term", ["opd", "nca", "dual", "sym"])
def test_term_aligned_with_itself(term):
    _, _, batch = fixed_batch()
    rows = term_gradients(tiny(0), tiny(1), batch, (term, term), estimator="full")
    assert len(rows) > 10
    for r in rows:
        assert r.norm_a > 0
        assert r.cos == pytest.approx(1.0, abs=1e-6)
        assert r.norm_ratio == pytest.approx(1.0, abs=1e-6)
        assert r.value_a == r.value_b


def test_module_and_layer_sums_match_global():
    _, _, batch = fixed_batch()
    rows = term_gradients(tiny(0), tiny(1), batch, ("opd", "nca"), estimator="topk", topk=8)
    g = [r for r in rows if r.scope == "global"]
    assert len(g) == 1
    g = g[0]
    assert -1 < g.cos < 1 and g.norm_a > 0 and g.norm_b > 0
    for scope in ("module", "layer_module"):
        part = [r for r in rows if r.scope == scope]
        assert sum(r.norm_a**2 for r in part) == pytest.approx(g.norm_a**2, rel=1e-9)
        assert sum(r.norm_b**2 for r in part) == pytest.approx(g.norm_b**2, rel=1e-9)
        assert sum(r.dot for r in part) == pytest.approx(g.dot, rel=1e-6, abs=1e-12)
        assert sum(r.numel for r in part) == g.numel
    layer_rows = {r.layer: r for r in rows if r.scope == "layer"}
    assert sorted(layer_rows) == [0, 1]
    for i, lr in layer_rows.items():
        part = [r for r in rows if r.scope == "layer_module" and r.layer == i]
        assert sum(r.norm_a**2 for r in part) == pytest.approx(lr.norm_a**2, rel=1e-9)
    for r in rows:
        assert r.cos == pytest.approx(r.dot / (r.norm_a * r.norm_b), rel=1e-12)
        assert r.norm_ratio == pytest.approx(r.norm_a / r.norm_b, rel=1e-12)
    tied = by_key(rows)
    assert ("module", None, "embed_tokens") in tied and ("module", None, "lm_head") not in tied  # tied: listed once


# ---------------------------------------------------------------------------------------------------- slow reference
def _kl(p_logp: torch.Tensor, q_logp: torch.Tensor) -> torch.Tensor:
    return sum(p_logp[v].exp() * (p_logp[v] - q_logp[v]) for v in range(p_logp.shape[0]))


def _reference_grads(student, teacher, examples, responses, temperature):
    """Per sequence, unpadded forwards; per token explicit KLs; loss.backward() per term -> {name: grad} per term."""

    def logp(model, prompt_ids, resp):
        ids = torch.tensor([prompt_ids + resp])
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(resp)]
        return torch.log_softmax(logits / temperature, -1)  # [len(resp), V]

    opd, nca, count = 0.0, 0.0, 0
    for ex, resp in zip(examples, responses):
        px = render_prompt_ids(TOK, ex.prompt, None, SPEC)
        pc = render_prompt_ids(TOK, ex.prompt, ex.context, SPEC)
        qx, qc = logp(student, px, resp), logp(student, pc, resp)
        with torch.no_grad():
            f = logp(teacher, pc, resp)
        for t in range(len(resp)):
            opd = opd + _kl(qx[t], f[t])  # KL(q_x ‖ f)
            nca = nca + _kl(qx[t].detach(), qc[t])  # KL(sg q_x ‖ q_c)
            count += 1
    out = {}
    for name, loss in (("opd", opd / count), ("nca", nca / count)):
        student.zero_grad()
        loss.backward(retain_graph=True)
        out[name] = {k: p.grad.clone() for k, p in student.named_parameters()}
    student.zero_grad()
    return out


def test_against_slow_reference_one_layer():
    examples, responses, batch = fixed_batch()
    student, teacher = tiny(0, layers=1), tiny(1, layers=1)
    rows = by_key(term_gradients(student, teacher, batch, ("opd", "nca"), estimator="full", temperature=0.7))
    ref = _reference_grads(student, teacher, examples, responses, 0.7)
    ga = torch.cat([g.reshape(-1) for g in ref["opd"].values()]).double()
    gb = torch.cat([g.reshape(-1) for g in ref["nca"].values()]).double()
    glob = rows[("global", None, "")]
    assert glob.norm_a == pytest.approx(float(ga.norm()), rel=1e-4)
    assert glob.norm_b == pytest.approx(float(gb.norm()), rel=1e-4)
    assert glob.cos == pytest.approx(float(ga @ gb / (ga.norm() * gb.norm())), abs=1e-4)
    for name, site in (
        ("model.layers.0.self_attn.q_proj.weight", (0, "q_proj")),
        ("model.layers.0.mlp.down_proj.weight", (0, "down_proj")),
        ("model.embed_tokens.weight", (None, "embed_tokens")),
    ):
        a, b = ref["opd"][name].double().reshape(-1), ref["nca"][name].double().reshape(-1)
        r = rows[("layer_module", *site)]
        assert r.norm_a == pytest.approx(float(a.norm()), rel=1e-4)
        assert r.norm_b == pytest.approx(float(b.norm()), rel=1e-4)
        assert r.dot == pytest.approx(float(a @ b), rel=1e-3, abs=1e-9)


# ---------------------------------------------------------------------------------------------------- restriction
def test_layer_restriction_matches_unrestricted_rows():
    _, _, batch = fixed_batch()
    student, teacher = tiny(0), tiny(1)
    full = by_key(term_gradients(student, teacher, batch, ("opd", "dual"), estimator="full"))
    only = term_gradients(student, teacher, batch, ("opd", "dual"), estimator="full", layers=[1])
    assert {r.layer for r in only if r.scope != "global" and r.scope != "module"} == {1}
    for r in only:
        if r.scope in ("layer", "layer_module"):
            ref = full[(r.scope, r.layer, r.module)]
            assert r.dot == pytest.approx(ref.dot, rel=1e-5)
            assert r.norm_a == pytest.approx(ref.norm_a, rel=1e-5)
    g = by_key(only)[("global", None, "")]
    assert g.norm_a == pytest.approx(full[("layer", 1, "")].norm_a, rel=1e-5)
    with_globals = by_key(
        term_gradients(student, teacher, batch, ("opd", "dual"), estimator="full", layers=[1], include_non_layer=True)
    )
    assert ("module", None, "embed_tokens") in with_globals and ("layer", 0, "") not in with_globals
    assert all(p.requires_grad for p in student.parameters())  # restored


def test_requires_grad_is_restored():
    _, _, batch = fixed_batch()
    student = tiny(0)
    for p in student.parameters():
        p.requires_grad_(False)
    rows = term_gradients(student, None, batch, ("nca", "sym"), estimator="full")
    assert rows[0].norm_a > 0
    assert not any(p.requires_grad for p in student.parameters())


@pytest.mark.parametrize("layers", [[2], [-1], []])
def test_layers_out_of_range(layers):
    with pytest.raises(ConfigError, match="layers"):
        select_parameters(tiny(0), layers)


def test_bad_terms():
    _, _, batch = fixed_batch()
    with pytest.raises(ConfigError, match="unknown"):
        term_gradients(tiny(0), tiny(1), batch, ("opd", "kl"))
    with pytest.raises(ConfigError, match="exactly two"):
        term_gradients(tiny(0), tiny(1), batch, ("opd",))


# ---------------------------------------------------------------------------------------------------- end to end
def _save(model, tok, path):
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_run_gradients_writes_tables(tmp_path):
    s = _save(tiny(0), TOK, tmp_path / "student")
    t = _save(tiny(1), TOK, tmp_path / "teacher")
    setup = ProbeSetup(task="rules", n=3, seed=0, models={"base": str(t), "student": str(s)})
    opts = GradientsOptions(model="student", teacher="base", estimator="sampled")
    lines = run_gradients(setup, tmp_path / "out", opts)
    with (tmp_path / "out" / "gradients.csv").open() as fh:
        recs = list(csv.DictReader(fh))
    doc = json.loads((tmp_path / "out" / "gradients.json").read_text())
    assert len(recs) == len(doc["rows"]) > 1
    g = next(r for r in recs if r["scope"] == "global")
    assert lines == [
        f"cos(grad opd, grad nca) = {float(g['cos']):.4f}, norm ratio {float(g['norm_ratio']):.4f}; "
        f"table: {tmp_path / 'out' / 'gradients.csv'}"
    ]
    assert doc["settings"]["terms"] == ["opd", "nca"] and doc["settings"]["response_tokens"] > 0
    run_gradients(setup, tmp_path / "out2", GradientsOptions(model=str(s), teacher=str(t), estimator="sampled"))
    with (tmp_path / "out2" / "gradients.csv").open() as fh:
        again = list(csv.DictReader(fh))
    assert [r["dot"] for r in again] == [r["dot"] for r in recs]  # deterministic per seed


def test_teacher_with_other_tokenizer(tmp_path):
    other = build_tokenizer(["alpha", "beta", "gamma"])
    s = _save(tiny(0), TOK, tmp_path / "student")
    t = _save(tiny(1, tok=other), other, tmp_path / "teacher")
    with pytest.raises(ModelError, match="tokenizers differ"):
        run_gradients(ProbeSetup(task="rules", n=2), tmp_path / "out", GradientsOptions(model=str(s), teacher=str(t)))


def test_run_gradients_layers_out_of_range(tmp_path):
    s = _save(tiny(0), TOK, tmp_path / "student")
    with pytest.raises(ConfigError, match=r"2 decoder layers \(0..1\)"):
        opts = GradientsOptions(model=str(s), teacher=str(s), layers=[2])
        run_gradients(ProbeSetup(task="rules", n=2), tmp_path / "out", opts)
    assert not (tmp_path / "out").exists()


def test_rows_warn_when_one_norm_is_below_a_thousandth_of_the_other():
    from mechopd.probes.grad_align import aggregate

    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    sums = [(1e-9, 1.0, 1e-8), (0.5, 1.0, 1.0)]  # q_proj: ‖g_b‖ = 1e-4 ≪ ‖g_a‖ = 1; up_proj: equal norms
    rows = {(r.scope, r.module): r for r in aggregate(names, sums, [4, 4], "opd", "nca", (0.1, 0.2))}
    assert rows[("layer_module", "q_proj")].warning == "norm_b < 0.001 x norm_a"
    assert rows[("layer_module", "up_proj")].warning == ""
    flipped = aggregate(names[:1], [(1e-9, 1e-8, 1.0)], [4], "opd", "nca", (0.1, 0.2))
    assert flipped[0].warning == "norm_a < 0.001 x norm_b"


# ---------------------------------------------------------------------------------------------------- split-half null
def _batch_of(examples, responses):
    return build_two_view_batch(TOK, [e.prompt for e in examples], [e.context for e in examples], responses, SPEC)


def test_split_half_null_is_one_on_duplicated_halves_and_matches_two_separate_gradients():
    from mechopd.probes.gradients import split_half_cos

    examples, responses, _ = fixed_batch(2)
    dup = _batch_of(
        [examples[0], examples[0], examples[1], examples[1]], [responses[0], responses[0], responses[1], responses[1]]
    )
    assert split_half_cos(tiny(0), tiny(1), dup, "opd", estimator="full") == pytest.approx(1.0, abs=1e-6)
    # distinct halves: the cosine of the two halves' gradients, each computed on its own batch (a slow reference)
    student, teacher = tiny(0), tiny(1)
    batch = _batch_of(examples + examples[:0], responses)
    grads = []
    for k in (0, 1):
        half = _batch_of([examples[k]], [responses[k]])
        student.zero_grad()
        from mechopd.objectives.divergences import token_mean
        from mechopd.objectives.losses import terms_need
        from mechopd.probes.grad_align import _score_inputs
        from mechopd.probes.gradients import loss_term

        term = loss_term("opd", "full")
        value = token_mean(
            term.fn(_score_inputs(student, teacher, half, terms_need([term]), 1.0)).per_pos, half.response_mask
        )
        value.backward()
        grads.append(torch.cat([p.grad.reshape(-1).clone() for p in student.parameters()]))
    ref = float(torch.nn.functional.cosine_similarity(grads[0].double(), grads[1].double(), dim=0))
    got = split_half_cos(tiny(0), tiny(1), batch, "opd", estimator="full")
    assert got == pytest.approx(ref, abs=1e-5) and got < 0.99
    assert math.isnan(split_half_cos(tiny(0), tiny(1), _batch_of(examples[:1], responses[:1]), "opd"))
