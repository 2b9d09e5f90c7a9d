"""Two processes (torchrun, gloo on CPU) at the same global batch give the same weights as one process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

ARGS = ["--set", "batch_size=8", "--set", "steps=3", "--set", "lr=1e-3", "--set", "max_new_tokens=8",
        "--set", "seed=2", "--set", "pool_size=64", "--set", "method=nca", "--set", "selector=ta_opd",
        "--set", "budget=0.3", "--no-progress"]


def _run(cmd, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", HF_HUB_OFFLINE="1")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
def test_two_processes_equal_one(tiny_rules_organism, tmp_path):
    base = ["train", "--student", str(tiny_rules_organism), *ARGS]
    _run([sys.executable, "-m", "mechopd.cli", *base, "--out", str(tmp_path / "one")], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
          "-m", "mechopd.cli", *base, "--out", str(tmp_path / "two")], tmp_path)
    one = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    two = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    init = load_file(str(tiny_rules_organism / "model.safetensors"))
    moved = max(float((one[k] - init[k]).abs().max()) for k in one)
    assert moved > 1e-4  # training changed the weights ...
    for k in one:  # ... identically in both layouts
        torch.testing.assert_close(one[k], two[k], atol=2e-5, rtol=1e-4)
