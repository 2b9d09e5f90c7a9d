"""Tiny checkpoints and whole-state-dict references for the parameter-deltas tests (test_deltas.py,
test_deltas_aggregate.py): generic Qwen3 / Qwen2 / Llama models, perturbed copies, and the slow reference every
streamed value is checked against."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from mechopd.core.sites import site_of
from mechopd.probes.delta_sums import parameter_deltas

DIMS = dict(
    hidden_size=32,
    num_hidden_layers=2,
    vocab_size=64,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def tiny(arch: str = "qwen3", tie: bool = True, seed: int = 0, **over) -> torch.nn.Module:
    kw = {**DIMS, "tie_word_embeddings": tie, **over}
    cfg = {
        "qwen3": lambda: Qwen3Config(**{"head_dim": 8, **kw}),
        "qwen2": lambda: Qwen2Config(**kw),
        "llama": lambda: LlamaConfig(**kw),
    }[arch]()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms start at 1 and biases at 0: make every tensor generic
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def perturbed(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A copy with every parameter moved by scale * (1 + tensor index) * N(0, 1)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for i, p in enumerate(out.parameters()):
            p.add_(scale * (1 + i) * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return out


def save(model: torch.nn.Module, path: Path, **kw) -> Path:
    model.save_pretrained(path, **kw)
    return path


def state(path: Path) -> dict[str, torch.Tensor]:
    """The full state dict of a checkpoint dir (all shards), in float64."""
    sd = {}
    for f in sorted(path.glob("*.safetensors")):
        sd.update({k: v.double() for k, v in load_file(f).items()})
    return sd


def by_key(rows) -> dict[tuple, float]:
    return {(r.model, r.vs, r.site, r.param, r.metric): r.value for r in rows}


def reference(base: Path, models: dict[str, Path], pair=None) -> dict[tuple, float]:
    """Slow reference: every metric of every tensor from whole state dicts."""
    w0 = state(base)
    thetas = {k: state(v) for k, v in models.items()}
    ref = {}
    for name, w in w0.items():
        s = site_of(name)
        ref[("base", "", s.site, s.param, "w0_norm")] = w.norm().item()
        for label, th in thetas.items():
            d = (th[name] - w).norm().item()
            ref[(label, "base", s.site, s.param, "delta_norm")] = d
            ref[(label, "base", s.site, s.param, "rel_delta")] = d / w.norm().item()
        if pair:
            a, b = pair
            da, db = (thetas[a][name] - w).flatten(), (thetas[b][name] - w).flatten()
            d = (thetas[b][name] - thetas[a][name]).norm().item()
            ref[(b, a, s.site, s.param, "delta_norm")] = d
            ref[(b, a, s.site, s.param, "rel_delta")] = d / w.norm().item()
            ref[(b, a, s.site, s.param, "cos")] = (da @ db / (da.norm() * db.norm())).item()
    return ref


def assert_close(got: dict, want: dict, rel: float = 1e-9, abs_: float = 1e-12) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=rel, abs=abs_, nan_ok=True), k


def make_trio(root: Path) -> dict[str, Path]:
    """base / opd / nca Qwen3 checkpoints (tied) under `root`, opd = base + u, nca = opd + v."""
    base = tiny("qwen3", tie=True)
    opd = perturbed(base, 1e-2, seed=1)
    nca = perturbed(opd, 1e-2, seed=2)
    return {k: save(m, root / k) for k, m in (("base", base), ("opd", opd), ("nca", nca))}


def run(trio, pair=("opd", "nca"), **kw):
    return parameter_deltas(trio["base"], {"opd": trio["opd"], "nca": trio["nca"]}, pair, progress=False, **kw)
