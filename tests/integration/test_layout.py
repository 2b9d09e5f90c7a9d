"""The small-row layout (`generate/layout.py`) is a cache: the same bits with or without it, refreshed by nothing
(a block copies once and forgets), and only where its copy pays."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mechopd.core.views import RenderSpec, left_pad, render_prompt_ids
from mechopd.generate import layout, sampler
from mechopd.generate.lean import LeanDecoder, projections
from mechopd.generate.settings import SamplingSettings, stop_ids
from tests.conftest import generate_reference, rule_prompt_ids, tiny_model


class _Proj(torch.nn.Module):
    def __init__(self, n_out: int, n_in: int, bias: bool):
        super().__init__()
        self.proj = torch.nn.Linear(n_in, n_out, bias=bias)


@pytest.mark.parametrize(("n_out", "n_in", "bias"), [(1536, 576, False), (576, 1536, True), (4864, 896, True)])
def test_the_laid_out_copy_gives_the_weights_own_bits(n_out, n_in, bias):
    torch.manual_seed(0)
    m = _Proj(n_out, n_in, bias).eval()
    assert layout.onednn(m.proj.weight)
    for rows in [*range(1, 10), 16, 33]:
        x = torch.randn(rows, 1, n_in)
        with torch.inference_mode():
            plain = layout.linear(m.proj, x)
            with layout.laid_out([m.proj]) as n:
                laid = layout.linear(m.proj, x)
            assert n == 1
        assert torch.equal(plain, laid), rows
        want = F.linear(x, m.proj.weight, m.proj.bias)
        assert torch.allclose(laid, want, rtol=1e-5, atol=1e-4)  # MKL's sum in another order
    assert len(layout._LAID) == 0


def test_small_weights_and_the_organisms_stay_on_f_linear():
    from mechopd.organisms.pretrain import OrganismConfig, organism_vocab

    torch.manual_seed(0)
    m = _Proj(192, 96, True).eval()
    x = torch.randn(4, 96)
    assert not layout.onednn(m.proj.weight)
    assert torch.equal(layout.linear(m.proj, x), F.linear(x, m.proj.weight, m.proj.bias))
    c = OrganismConfig()
    largest = max(c.hidden_size * c.intermediate_size, c.hidden_size * (len(organism_vocab()) + 8), c.hidden_size**2)
    assert largest < layout.MIN_ELEMENTS  # the default organism's decode arithmetic is what it was
    assert not layout.onednn(m.proj.weight.double()) and not layout.onednn(m.proj.weight.bfloat16())


def _ids(tok):
    return rule_prompt_ids(tok)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_lean_decoding_through_onednn_is_the_same_with_and_without_the_layout(organism_tokenizer, arch, monkeypatch):
    """Every projection of a tiny model through oneDNN (MIN_ELEMENTS 0): each step's logits bit-equal with and
    without the laid-out copies, close to ``model(...)``'s; greedy ids equal `generate`'s."""
    monkeypatch.setattr(layout, "MIN_ELEMENTS", 0)
    tok = organism_tokenizer
    model = tiny_model(tok, arch, seed=7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))  # Qwen2's q/k/v biases, non-trivial
    x, m = left_pad(_ids(tok), tok.pad_token_id)
    pos = (m.cumsum(-1) - 1).clamp(min=0)

    def steps() -> list[torch.Tensor]:
        dec, out = LeanDecoder(model), []
        logits = dec.prefill(x, m, pos, max_new_tokens=8)
        for s in range(8):
            logits = dec.step(logits.argmax(-1), pos[:, -1:] + 1 + s)
            out.append(logits)
        return out

    with torch.inference_mode():
        plain = steps()
        with layout.laid_out(projections(model)) as n:
            laid = steps()
    assert n == sum(type(mod) is torch.nn.Linear for mod in model.modules())
    for a, b in zip(plain, laid):
        assert torch.equal(a, b)
    stop = stop_ids(tok, model)
    st = SamplingSettings(max_new_tokens=20, stop=stop, pad_id=tok.pad_token_id, greedy=True)
    assert sampler.sample_rows(model, _ids(tok), None, st) == generate_reference(model, tok, _ids(tok), stop, 20)


def test_nested_blocks_read_the_outer_copies(organism_tokenizer, monkeypatch):
    monkeypatch.setattr(layout, "MIN_ELEMENTS", 0)
    model = tiny_model(organism_tokenizer, "llama", seed=1)
    with layout.laid_out(projections(model)) as outer:
        copies = dict(layout._LAID)
        with layout.laid_out(projections(model)) as inner:
            assert inner == 0
        assert outer > 0 and dict(layout._LAID) == copies
    assert len(layout._LAID) == 0


def test_sample_rows_lays_out_only_where_the_copy_pays(organism_tokenizer, monkeypatch):
    """A block over ≥ MIN_DECODE_STEPS lean decode steps; none for a short call, the hf engine or small weights;
    none left open afterwards (weights changed between calls are read fresh)."""
    tok = organism_tokenizer
    model = tiny_model(tok, "llama", seed=2)
    opened: list[int] = []
    real = layout.laid_out

    def spy(mod):
        opened.append(1)
        return real(mod)

    monkeypatch.setattr(layout, "laid_out", spy)
    st = SamplingSettings(max_new_tokens=20, stop=stop_ids(tok, model), pad_id=tok.pad_token_id, greedy=True)
    sampler.sample_rows(model, _ids(tok), None, st)
    assert opened == []  # every weight of the tiny model is below MIN_ELEMENTS
    monkeypatch.setattr(layout, "MIN_ELEMENTS", 0)
    sampler.sample_rows(model, _ids(tok), None, st.replace(max_new_tokens=2))
    sampler.sample_rows(model, _ids(tok), None, st.replace(engine="hf"))
    assert opened == []
    before = sampler.sample_rows(model, _ids(tok), None, st)
    assert opened == [1] and len(layout._LAID) == 0
    sampler.sample_rows(model, _ids(tok), None, st.replace(batch_size=1))  # one-row calls never read a copy
    assert opened == [1]
    with torch.no_grad():
        torch.manual_seed(9)
        for mod in model.model.layers.modules():
            if type(mod) is torch.nn.Linear:
                mod.weight.copy_(torch.randn_like(mod.weight))  # the layers now outweigh the (tied) embedding
    after = sampler.sample_rows(model, _ids(tok), None, st)
    assert after != before
    monkeypatch.setattr(layout, "laid_out", real)
    assert after == [r.responses[0] for r in (sampler.sample(model, [p], st) for p in _ids(tok))]


def test_decode_steps_run_on_one_thread_under_passive_and_their_bits_do_not_move(monkeypatch):
    """`sampler.decode_threads`: one intra-op thread under OMP_WAIT_POLICY=PASSIVE (the caller's count restored),
    the caller's count otherwise; the laid-out oneDNN projections give the same bits on 1 and 2 threads."""
    before = torch.get_num_threads()
    cpu = torch.device("cpu")
    try:
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
        with sampler.decode_threads(cpu) as n:
            assert n == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with sampler.decode_threads(torch.device("meta")) as n:
            assert n == 2 and torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
        with sampler.decode_threads(cpu) as n:
            assert n == 2 and torch.get_num_threads() == 2
        torch.manual_seed(0)
        m = _Proj(1536, 576, True).eval()
        x = torch.randn(16, 1, 576)
        with torch.inference_mode(), layout.laid_out([m.proj]):
            got = {}
            for threads in (1, 2):
                torch.set_num_threads(threads)
                got[threads] = [layout.linear(m.proj, x[:rows]) for rows in (2, 4, 7, 16)]
        assert all(torch.equal(a, b) for a, b in zip(got[1], got[2]))
    finally:
        torch.set_num_threads(before)


def test_an_interrupted_copy_leaves_nothing_and_a_changed_weight_is_refused(monkeypatch):
    torch.manual_seed(0)
    mods = [torch.nn.Linear(576, 1536) for _ in range(3)]
    real, made = torch.ops.mkldnn._reorder_linear_weight, []

    def failing(w, rows):
        if len(made) == 1:
            raise MemoryError("out of memory")
        made.append(1)
        return real(w, rows)

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", failing)
    with pytest.raises(MemoryError), layout.laid_out(mods):
        pass
    assert len(layout._LAID) == 0  # no copy survives to be read stale later
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", real)
    x = torch.randn(4, 576)
    with torch.inference_mode(), layout.laid_out(mods):
        layout.linear(mods[0], x)
        with torch.no_grad():
            mods[0].weight.add_(1.0)
        with pytest.raises(layout.StaleLayout, match="changed inside"):
            layout.linear(mods[0], x)


def test_autograd_and_a_disabled_onednn_get_f_linear():
    torch.manual_seed(0)
    m = torch.nn.Linear(576, 1536)
    x = torch.randn(4, 576, requires_grad=True)
    y = layout.linear(m, x)  # grad mode, weights that require grad: F.linear, with its backward
    assert torch.equal(y, F.linear(x, m.weight, m.bias))
    y.sum().backward()
    assert x.grad is not None and m.weight.grad is not None
    with torch.inference_mode():
        assert not torch.equal(layout.linear(m, x), F.linear(x, m.weight, m.bias))  # oneDNN: another sum order
        with torch.backends.mkldnn.flags(enabled=False):
            assert torch.equal(layout.linear(m, x), F.linear(x, m.weight, m.bias))


def test_games_lay_the_weights_out_once_for_every_move(organism_tokenizer, monkeypatch):
    from mechopd.tasks.base import get_task

    monkeypatch.setattr(layout, "MIN_ELEMENTS", 0)
    tok = organism_tokenizer
    model = tiny_model(tok, "llama", seed=4)
    real, copies = torch.ops.mkldnn._reorder_linear_weight, []

    def counted(w, rows):
        copies.append(1)
        return real(w, rows)

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", counted)
    task = get_task("frozenlake")
    items = task.examples("test", 3, 0)
    spec = RenderSpec(placement=task.placement)
    st = SamplingSettings(max_new_tokens=16, stop=stop_ids(tok, model), pad_id=tok.pad_token_id, greedy=True)
    _, turns = sampler.play_games(
        model, tok, task, items, lambda p, c: render_prompt_ids(tok, p, c, spec), st, with_context=False
    )
    assert max(t.move for t in turns) >= 1  # several moves...
    assert len(copies) == len(layout.targets(projections(model)))  # ...one copy of each weight
