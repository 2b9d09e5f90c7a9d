"""vLLM never draws an id the tokenizer does not know (``allowed_token_ids`` from ``SamplingSettings.vocab``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (the optional extra: pip install -e .[vllm])")
pytestmark = pytest.mark.vllm

from mechopd.core.views import RenderSpec, render_prompt_ids  # noqa: E402
from mechopd.generate.sampler import sample  # noqa: E402
from mechopd.generate.settings import SamplingSettings  # noqa: E402
from mechopd.generate.vllm_engine import VllmEngine  # noqa: E402
from mechopd.tasks.base import get_task  # noqa: E402


def test_ids_past_the_tokenizer_are_never_drawn(organism_tokenizer, tmp_path):
    """A head padded past the tokenizer whose padding rows would win every draw: vLLM gets ``allowed_token_ids``
    (settings.vocab = the tokenizer's ids), so no padding id is sampled or chosen greedily; without it, they are."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    tok, n = organism_tokenizer, len(organism_tokenizer)
    cfg = Qwen3Config(
        vocab_size=n + 16,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # logit of a padding row: +-50 * sum(h), one sign of the two wins
        model.lm_head.weight[n : n + 8] = 50.0
        model.lm_head.weight[n + 8 :] = -50.0
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    engine = VllmEngine(tmp_path, seed=0)
    try:
        task = get_task("rules")
        ids = [render_prompt_ids(tok, e.prompt, None, RenderSpec(task.placement)) for e in task.examples("test", 4, 0)]
        st = SamplingSettings.for_model(tok, model, max_new_tokens=6, engine=engine)
        assert st.vocab == n
        for settings in (st, st.replace(greedy=True)):
            drawn = [t for r in sample(model, ids, settings, [1, 2, 3, 4]).responses for t in r]
            assert drawn and max(drawn) < n
        free = sample(model, ids, st.replace(vocab=None), [1, 2, 3, 4]).responses  # the test can fail
        assert max(t for r in free for t in r) >= n
    finally:
        engine.close()
