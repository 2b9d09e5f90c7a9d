"""``adamw: fused`` (one kernel per tensor) against ``default`` (torch's per-tensor AdamW on CPU), issue 58: each
update within one float32 ulp, a fused run resumes from a default run's optimizer state, the trainer builds the one
asked for, and the weight guard's one-call norm sees what the per-tensor norms see."""

from __future__ import annotations

import copy
import math

import torch

from mechopd.train import guard

ULP = dict(rtol=2**-23, atol=1e-7)  # one float32 ulp of the weight (2^-23 relative), weights near 0: 1e-7


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 32), (32,), (96, 64), (1,)]
    out = [torch.nn.Parameter(torch.randn(s, generator=g) * 0.05) for s in shapes]
    out[1].data.fill_(1.0)  # a norm weight: magnitude 1, where one ulp is 1.19e-7
    return out


def _grads(step: int, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g) * (0.01 * (1 + step)) for p in params]


def _steps(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: range) -> None:
    for s in steps:
        for p, g in zip(params, _grads(s, params)):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()


def _adamw(params: list[torch.nn.Parameter], fused: bool) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True if fused else None)


def test_fused_updates_within_one_ulp_of_default():
    a, b = _params(), _params()
    oa, ob = _adamw(a, False), _adamw(b, True)
    assert not oa.defaults.get("fused") and ob.defaults["fused"]
    for s in range(5):
        _steps(oa, a, range(s, s + 1))
        _steps(ob, b, range(s, s + 1))
        for x, y in zip(a, b):
            torch.testing.assert_close(y.detach(), x.detach(), **ULP)
        for sa, sb in zip(oa.state.values(), ob.state.values()):
            torch.testing.assert_close(sb["exp_avg"], sa["exp_avg"], **ULP)
            torch.testing.assert_close(sb["exp_avg_sq"], sa["exp_avg_sq"], rtol=2**-22, atol=1e-12)


def test_fused_resumes_from_a_default_runs_state():
    """A checkpoint written by a run with the default AdamW (its optimizer state_dict) loads into a fused one."""
    a, b = _params(), _params()
    oa = _adamw(a, False)
    _steps(oa, a, range(3))
    saved = copy.deepcopy(oa.state_dict())  # as read back from a checkpoint: tensors of its own
    with torch.no_grad():
        for x, y in zip(a, b):
            y.copy_(x)
    ob = _adamw(b, True)
    ob.load_state_dict(saved)
    _steps(oa, a, range(3, 5))
    _steps(ob, b, range(3, 5))
    for x, y in zip(a, b):
        torch.testing.assert_close(y.detach(), x.detach(), **ULP)


def test_weight_guard_counts_as_per_tensor_norms():
    params = _params()
    assert guard.nonfinite_weights(params) == 0
    with torch.no_grad():
        params[0][3, 4] = math.nan
        params[2][0, 0] = math.inf
    assert guard.nonfinite_weights(params) == 2
    half = [torch.nn.Parameter(p.detach().to(torch.bfloat16)) for p in params]  # the per-tensor path
    assert guard.nonfinite_weights(half) == 2


def test_trainer_builds_the_adamw_asked_for(tiny_rules_organism, tmp_path):
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import Trainer

    for impl, fused in (("default", None), ("fused", True)):
        cfg = TrainConfig(student=str(tiny_rules_organism), steps=1, batch_size=2, max_new_tokens=4, adamw=impl)
        tr = Trainer(cfg, tmp_path / impl, progress=False)
        assert tr.parts.opt.defaults.get("fused") is fused
