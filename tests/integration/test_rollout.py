"""The lean decode loop is pinned to `generate` (greedy) and is batch-invariant with per-row seeds."""

from __future__ import annotations

import pytest
import torch

from mechopd.core.views import left_pad
from mechopd.generate.sampler import sample
from mechopd.generate.settings import SamplingSettings, stop_ids
from tests.conftest import generate_reference, rule_prompt_ids, tiny_model


def _ids(tok):
    return rule_prompt_ids(tok)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_greedy_matches_generate(organism_tokenizer, arch):
    tok = organism_tokenizer
    model = tiny_model(tok, arch, seed=3)
    ids = _ids(tok)
    stop = stop_ids(tok, model)
    ours = sample(model, ids, SamplingSettings(max_new_tokens=10, stop=stop, pad_id=tok.pad_token_id, greedy=True))
    assert ours.responses == generate_reference(model, tok, ids, stop, 10)


def test_row_seeds_make_sampling_batch_invariant(organism_tokenizer, tiny_qwen3):
    tok = organism_tokenizer
    ids = _ids(tok)
    stop = stop_ids(tok, tiny_qwen3)
    st = SamplingSettings(max_new_tokens=12, stop=stop, pad_id=tok.pad_token_id, temperature=1.0)
    full = sample(tiny_qwen3, ids, st, row_seeds=[11, 12, 13, 14]).responses
    halves = (
        sample(tiny_qwen3, ids[:2], st, row_seeds=[11, 12]).responses
        + sample(tiny_qwen3, ids[2:], st, row_seeds=[13, 14]).responses
    )
    assert full == halves
    other = sample(tiny_qwen3, ids, st, row_seeds=[21, 22, 23, 24]).responses
    assert other != full  # the seeds matter


def test_inverse_cdf_sampling_follows_the_distribution(organism_tokenizer, tiny_qwen3):
    """First-token frequencies over many seeds match softmax(logits / T) (chi-square-free tolerance check)."""
    tok = organism_tokenizer
    ids = [_ids(tok)[0]] * 2000
    stop = stop_ids(tok, tiny_qwen3)
    out = sample(
        tiny_qwen3,
        ids,
        SamplingSettings(max_new_tokens=1, stop=stop, pad_id=tok.pad_token_id, temperature=0.7),
        row_seeds=list(range(2000)),
    ).responses
    first = torch.tensor([r[0] for r in out])
    with torch.no_grad():
        x, m = left_pad(ids[:1], tok.pad_token_id)
        p = torch.softmax(tiny_qwen3(input_ids=x, attention_mask=m).logits[0, -1] / 0.7, -1)
    freq = torch.bincount(first, minlength=p.numel()).float() / len(first)
    assert (freq - p).abs().max() < 0.015


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_lean_decoder_matches_the_model_step_by_step(organism_tokenizer, arch):
    """Every decode step's logits equal ``model(...)`` over the whole prefix (biases and q/k norms exercised)."""
    from mechopd.generate.lean import LeanDecoder

    tok = organism_tokenizer
    model = tiny_model(tok, arch, seed=5)
    if arch == "llama":
        model.config.attention_bias = model.config.mlp_bias = True  # rebuild with every bias present
        from transformers import AutoModelForCausalLM

        torch.manual_seed(5)
        model = AutoModelForCausalLM.from_config(model.config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))  # non-trivial biases and norm weights
    ids = _ids(tok)
    x, m = left_pad(ids, tok.pad_token_id)
    pos = (m.cumsum(-1) - 1).clamp(min=0)
    dec = LeanDecoder(model)
    with torch.inference_mode():
        logits = dec.prefill(x, m, pos, max_new_tokens=6)
        for _ in range(6):
            tok_ids = logits.argmax(-1)
            x = torch.cat([x, tok_ids[:, None]], 1)
            m = torch.cat([m, torch.ones_like(m[:, :1])], 1)
            pos = (m.cumsum(-1) - 1).clamp(min=0)
            logits = dec.step(tok_ids, pos[:, -1:])
            want = model(input_ids=x, attention_mask=m, position_ids=pos).logits[:, -1]
            assert torch.allclose(logits, want, atol=1e-5), (logits - want).abs().max()


def test_lean_and_hf_decoders_sample_the_same_ids(organism_tokenizer, tiny_qwen3):
    tok = organism_tokenizer
    st = SamplingSettings(max_new_tokens=12, stop=stop_ids(tok, tiny_qwen3), pad_id=tok.pad_token_id)
    assert (
        sample(tiny_qwen3, _ids(tok), st.replace(engine="lean"), [1, 2, 3, 4]).responses
        == sample(tiny_qwen3, _ids(tok), st.replace(engine="hf"), [1, 2, 3, 4]).responses
    )


def test_lean_decoder_refuses_what_it_cannot_run(organism_tokenizer):
    from transformers import AutoModelForCausalLM, GPT2Config

    from mechopd.core.errors import ModelError
    from mechopd.generate.lean import LeanDecoder

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(ModelError, match="model_type 'gpt2'.*train.rollout_engine .*eval.engine"):
        LeanDecoder(gpt2)
    with pytest.raises(ModelError, match="train.rollout_engine"):  # asked for explicitly: refused, not replaced
        sample(gpt2, [[1, 2]], SamplingSettings(max_new_tokens=2, stop=[0], pad_id=0, greedy=True, engine="lean"))
    with pytest.raises(ValueError, match="engine must be"):
        SamplingSettings(max_new_tokens=2, stop=[0], pad_id=0, engine="fast")


def test_auto_engine_falls_back_to_hf_generation_and_says_so_once(caplog):
    """The default engine ("auto") samples a model lean decoding cannot run through ``model(...)`` (the same ids as
    engine="hf"), logging the reason once per process."""
    import logging

    from transformers import AutoModelForCausalLM, GPT2Config

    from mechopd.generate import lean

    torch.manual_seed(0)
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).eval()
    st = SamplingSettings(max_new_tokens=5, stop=[0], pad_id=0, greedy=True)
    assert st.engine == "auto"
    lean._told.clear()
    with caplog.at_level(logging.WARNING, logger="mechopd"):
        got = [sample(gpt2, [[3, 4, 5], [6, 7]], st).responses for _ in range(2)]
    assert got[0] == got[1] == sample(gpt2, [[3, 4, 5], [6, 7]], st.replace(engine="hf")).responses
    told = [r.getMessage() for r in caplog.records if "lean decoding cannot run" in r.getMessage()]
    assert len(told) == 1 and "gpt2" in told[0]


def test_lean_decoder_refuses_position_dependent_rope_and_sliding_windows(organism_tokenizer):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from mechopd.core.errors import ModelError
    from mechopd.generate.lean import LeanDecoder, lean_supported

    base = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    longrope = LlamaConfig(
        **base,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0] * 4,
            "long_factor": [2.0] * 4,
            "original_max_position_embeddings": 64,
        },
    )
    with pytest.raises(ModelError, match="longrope"):
        LeanDecoder(AutoModelForCausalLM.from_config(longrope))
    sliding = Qwen2Config(**base, use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert "sliding" in lean_supported(AutoModelForCausalLM.from_config(sliding))


def test_lean_decoding_runs_mistral_without_a_sliding_window():
    from transformers import AutoModelForCausalLM

    from mechopd.generate.lean import lean_supported
    from mechopd.testing.families import tiny_config, tiny_family_model

    m = tiny_family_model("mistral")
    st = SamplingSettings(max_new_tokens=6, stop=[2], pad_id=0, greedy=True)
    prompts = [[3, 4, 5, 6], [7, 8]]
    assert lean_supported(m) is None
    assert (
        sample(m, prompts, st.replace(engine="lean")).responses == sample(m, prompts, st.replace(engine="hf")).responses
    )
    windowed = tiny_config("mistral")
    windowed.sliding_window = 4
    assert "sliding" in lean_supported(AutoModelForCausalLM.from_config(windowed))


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_sliding_window_models_never_share_a_prefix(family):
    """A sliding window counts cache columns: the shared-prefix layout (padding after the prefix) would shift it, so
    such a model runs the unshared prefill, and its greedy ids equal one-by-one sampling and ``generate``."""
    from mechopd.generate.prefix import sliding_window
    from mechopd.testing.families import tiny_family_model

    m = tiny_family_model(family)
    assert sliding_window(m) and not sliding_window(tiny_family_model("olmo2"))
    common = list(range(3, 20))
    prompts = [common + [21, 22, 23], common + [30, 31], common + [40]]
    st = SamplingSettings(max_new_tokens=8, stop=[2], pad_id=0, greedy=True)
    auto = sample(m, prompts, st.replace(shared_prefix="auto")).responses
    one = [sample(m, [p], st.replace(shared_prefix="off")).responses[0] for p in prompts]
    gen = [
        m.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, eos_token_id=2, pad_token_id=0)[0, len(p) :]
        for p in prompts
    ]
    assert auto == one == [g[: g.tolist().index(2) + 1].tolist() if 2 in g else g.tolist() for g in gen]
