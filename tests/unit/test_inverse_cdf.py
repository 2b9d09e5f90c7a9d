"""The sampler's two-level inverse CDF (no float64 over the vocabulary) against the plain float64 formula."""

from __future__ import annotations

import torch

from mechopd.generate.sampler import BLOCK, _inverse_cdf


def _reference(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    cdf = torch.softmax(logits.double(), -1).cumsum(-1)  # [B, V] float64: the formula the sampler used to run
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)


def test_equals_the_float64_formula_at_small_and_real_vocabularies():
    g = torch.Generator().manual_seed(0)
    for V in (7, BLOCK, BLOCK + 1, 171, 5000, 151936):
        logits = torch.randn(32, V, generator=g) * 3
        u = torch.rand(32, 1, generator=g, dtype=torch.float64)
        got = _inverse_cdf(torch.softmax(logits, -1), u)
        assert torch.equal(got, _reference(logits, u)), V


def test_many_uniforms_on_one_distribution():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 640, generator=g).expand(20000, -1).contiguous() * 2
    u = torch.rand(20000, 1, generator=g, dtype=torch.float64)
    agree = (_inverse_cdf(torch.softmax(logits, -1), u) == _reference(logits, u)).double().mean()
    assert agree > 0.9999  # float32 probabilities: a uniform within ~1e-7 of a boundary may fall either side


def test_ids_without_mass_are_never_returned():
    """Masked ids (probability 0) inside the vocabulary, at its end and across a block edge; u at the extremes."""
    V = 3 * BLOCK + 5
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(2))
    logits[:, BLOCK - 3 : BLOCK + 3] = -float("inf")
    logits[:, -40:] = -float("inf")
    probs = torch.softmax(logits, -1)
    u = torch.tensor(
        [[0.0], [1e-300], [0.5], [1 - 1e-16], [0.999999], [float.fromhex("0x1.fffffffffffffp-1")]], dtype=torch.float64
    )
    ids = _inverse_cdf(probs, u)
    assert bool((probs.gather(1, ids[:, None]) > 0).all()), ids


def test_no_float64_tensor_spans_the_vocabulary(monkeypatch):
    """Every float64 tensor the sampler builds is at most [B, max(V / BLOCK, BLOCK)] (the issue's memory rule)."""
    V, B = 151936, 4
    sizes = []
    real = torch.Tensor.double

    def spy(self):
        sizes.append(self.shape[-1])
        return real(self)

    monkeypatch.setattr(torch.Tensor, "double", spy)
    _inverse_cdf(torch.softmax(torch.randn(B, V), -1), torch.rand(B, 1, dtype=torch.float64))
    assert sizes and max(sizes) <= max(-(-V // BLOCK), BLOCK)
