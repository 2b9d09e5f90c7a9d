"""vLLM engine vs the lean decoder on one model: greedy ids, the sampled distribution, in-place weight loading."""

from __future__ import annotations

import math

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
from tests.vllm.conftest import max_weight_diff  # noqa: E402


@pytest.fixture(scope="module")
def setup(hd32_model_dir, readable_weights):
    model, tok = load_model(hd32_model_dir), load_tokenizer(hd32_model_dir)
    engine = VllmEngine(hd32_model_dir, seed=0)
    task = get_task("rules")
    spec = RenderSpec(task.placement)
    exs = task.examples("test", 8, 0)
    ids = [render_prompt_ids(tok, e.prompt, e.context if i % 2 else None, spec) for i, e in enumerate(exs)]
    return model, tok, engine, ids


def _greedy(model, tok, ids, engine):
    return sample(
        model, ids, SamplingSettings.for_model(tok, model, max_new_tokens=16, greedy=True, engine=engine)
    ).responses


def test_greedy_ids_equal_the_lean_decoder(setup):
    model, tok, engine, ids = setup
    lean = _greedy(model, tok, ids, "lean")
    assert any(len(r) > 4 for r in lean)  # real responses, not one stop token each
    assert _greedy(model, tok, ids, engine) == lean


def _chi2_critical(df: int, z: float) -> float:
    """Upper quantile of chi-square(df) at the normal quantile z (Wilson–Hilferty; z = 3.09 -> alpha 1e-3)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over bins with expected count >= 5 (the rest pooled into one bin); returns (stat, df)."""
    n = float(counts.sum())
    exp = probs.double() * n
    big = exp >= 5
    obs_b = torch.cat([counts[big].double(), counts[~big].double().sum()[None]])
    exp_b = torch.cat([exp[big], exp[~big].sum()[None]])
    keep = exp_b > 0
    obs_b, exp_b = obs_b[keep], exp_b[keep]
    return float(((obs_b - exp_b) ** 2 / exp_b).sum()), int(keep.sum()) - 1


def test_sampled_tokens_follow_the_model_softmax(setup):
    """One decode step sampled N times with seeds 0..N-1: Pearson's chi-square against softmax(logits / T)."""
    model, tok, engine, ids = setup
    prompt, T, N = ids[0], 1.0, 3000
    gen = engine.sample(
        [prompt] * N, SamplingSettings(max_new_tokens=1, stop=(), pad_id=0, temperature=T), row_seeds=list(range(N))
    )
    drawn = torch.tensor([r[0] for r in gen.responses])
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]  # [V]
    counts = torch.bincount(drawn, minlength=logits.shape[-1]).double()
    stat, df = _chi2(counts, torch.softmax(logits.double() / T, -1))
    assert df >= 10  # a spread-out distribution: the test has something to check
    crit = _chi2_critical(df, 3.09)
    assert stat < crit, f"chi2={stat:.1f} >= {crit:.1f} (df={df}): vLLM's samples do not follow the model's softmax"
    wrong, wdf = _chi2(counts, torch.softmax(logits.double() / (2 * T), -1))  # power: a temperature slip is caught
    assert wrong > _chi2_critical(wdf, 3.09)


def test_row_seeds_make_a_row_independent_of_its_batch(setup):
    _, _, engine, ids = setup
    st = SamplingSettings(max_new_tokens=12, stop=(), pad_id=0, temperature=1.0)
    full = engine.sample(ids, st, row_seeds=list(range(100, 108))).responses
    part = engine.sample(ids[3:6], st, row_seeds=list(range(103, 106))).responses
    assert part == full[3:6]


def test_in_place_weight_loading(setup):
    """After a change of the trainer's weights, vLLM holds exactly them and samples what the lean decoder does."""
    model, tok, engine, ids = setup
    assert max_weight_diff(engine, model) == 0.0
    before = _greedy(model, tok, ids, engine)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    assert max_weight_diff(engine, model) > 0  # not yet loaded: the comparison can fail
    engine.load_weights(model)
    assert max_weight_diff(engine, model) == 0.0
    after = _greedy(model, tok, ids, engine)
    assert after == _greedy(model, tok, ids, "lean")
    assert after != before
