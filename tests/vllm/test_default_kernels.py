"""vLLM's default CPU kernels (oneDNN, packed weights): after in-place loading it samples from the new weights.

The exact weight comparisons (test_engine, test_training) need vLLM's fallback kernels; this module keeps the
default ones, where the LM head multiplies with a packed copy of the (tied) embedding, and checks the outputs.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (the optional extra: pip install -e .[vllm])")
pytestmark = pytest.mark.vllm

from mechopd.core.views import RenderSpec, render_prompt_ids  # noqa: E402
from mechopd.generate.sampler import sample  # noqa: E402
from mechopd.generate.settings import SamplingSettings  # noqa: E402
from mechopd.generate.vllm_engine import VllmEngine  # noqa: E402
from mechopd.models import load_model, load_tokenizer  # noqa: E402
from mechopd.tasks.base import get_task  # noqa: E402


def test_default_kernels_follow_every_weight_after_loading(hd32_model_dir):
    model, tok = load_model(hd32_model_dir), load_tokenizer(hd32_model_dir)
    engine = VllmEngine(hd32_model_dir, seed=0)
    task = get_task("rules")
    ids = [render_prompt_ids(tok, e.prompt, None, RenderSpec(task.placement)) for e in task.examples("test", 8, 0)]
    st = SamplingSettings.for_model(tok, model, max_new_tokens=12, greedy=True)

    def same() -> bool:
        return sample(model, ids, st.replace(engine=engine)).responses == sample(model, ids, st).responses

    assert same()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed" not in name:
                p.add_(0.2 * torch.randn_like(p))
    engine.load_weights(model)
    assert same()
    with torch.no_grad():  # the embedding = the tied LM head
        model.model.embed_tokens.weight.add_(0.3 * torch.randn_like(model.model.embed_tokens.weight))
    engine.load_weights(model)
    assert same()
    engine.close()
