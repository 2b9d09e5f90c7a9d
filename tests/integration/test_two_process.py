"""Two processes (torchrun, gloo on CPU) at the same global batch give the same weights as one process.

Both layouts: full replicas with all-reduced gradients (``sharding=none``) and FSDP2 shards (``sharding=fsdp``). The
FSDP run is also interrupted and resumed (sharded optimizer state restored from a full checkpoint), and the same
checkpoint resumed by one unsharded process: the checkpoint format does not depend on the layout.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

ARGS = [
    "--set",
    "batch_size=8",
    "--set",
    "lr=1e-3",
    "--set",
    "max_new_tokens=8",
    "--set",
    "seed=2",
    "--set",
    "pool_size=64",
    "--set",
    "method=nca",
    "--set",
    "selector=ta_opd",
    "--set",
    "budget=0.3",
    "--set",
    "grad_clip=0.02",
    "--no-progress",  # below the largest global gradient norm: clipping is exercised
    "--set",
    "shared_prefix=off",
]  # TA-OPD's selection on KL ~ 1e-6 flips on float rounding: see the test below
STEPS = ["--set", "steps=3"]


def _run(cmd, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", HF_HUB_OFFLINE="1", PYTHONFAULTHANDLER="1")
    env.pop("OMP_WAIT_POLICY", None)  # one thread per rank: the suite's policy (tests/conftest.py) has nothing to do
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert res.returncode == 0, res.stderr[-8000:]


def free_port() -> int:
    """A TCP port nothing listens on now: the test files run in parallel (pytest-xdist), and so may other sessions on
    the machine, so no port is fixed (torchrun binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(port: int | None = None) -> list[str]:
    port = free_port() if port is None else port
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        "-m",
        "mechopd.cli",
    ]


def _weights(run_dir):
    return load_file(str(run_dir / "final" / "model.safetensors"))


TIMING = ("tokens_per_s", "step_s", "rollout_s")
STAGE_TIMING = ("time/", "tokens_per_s/")  # seconds and tokens/s per stage (train/profile.py)


def _metrics(run_dir):
    """Per step, every logged value except timings: losses, KL, grad_norm, kept fraction, accuracy, lengths. All are
    global over processes, so they must not depend on the layout."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = sorted(k for k in rows[0] if k not in TIMING and not k.startswith(STAGE_TIMING))
    assert {"loss", "grad_norm", "kl/teacher_student", "train_acc_x"} <= set(keys)
    return keys, torch.tensor([[float(r[k]) for k in keys] for r in rows], dtype=torch.float64)


@pytest.fixture(scope="module")
def one_process(tiny_rules_organism, tmp_path_factory):
    """The reference: one process, 3 steps at global batch 8."""
    out = tmp_path_factory.mktemp("one") / "run"
    _run(
        [
            sys.executable,
            "-m",
            "mechopd.cli",
            "train",
            "--student",
            str(tiny_rules_organism),
            *ARGS,
            *STEPS,
            "--out",
            str(out),
        ],
        out.parent,
    )
    one, init = _weights(out), load_file(str(tiny_rules_organism / "model.safetensors"))
    assert max(float((one[k] - init[k]).abs().max()) for k in one) > 1e-4  # training changed the weights
    keys, values = _metrics(out)
    assert float(values[:, keys.index("grad_norm")].max()) > 0.02  # ... and was clipped at least once
    return out


def _assert_same(one_dir, other_dir):
    """Same weights, and the same logged metrics, gradient norm included (AdamW hides a gradient scale error in the weights:
    a mean instead of a sum over processes halves the gradient norm but barely moves the update)."""
    one, other = _weights(one_dir), _weights(other_dir)
    assert sorted(one) == sorted(other)
    for k in one:  # AdamW divides by sqrt(v): a parameter whose gradient is ~0 turns the all-reduce's float order into
        # an update of up to ~lr (measured max |Δw| 1.2e-3 after 3 steps at lr 1e-2); a gradient-scale error is caught by
        # the gradient norm below (rtol 1e-3)
        torch.testing.assert_close(other[k], one[k], atol=5e-3, rtol=1e-4)
    (keys, ref), (other_keys, got) = _metrics(one_dir), _metrics(other_dir)
    assert keys == other_keys
    torch.testing.assert_close(got, ref, atol=1e-7, rtol=1e-3)  # KL terms near 1e-6 carry float32 noise


@pytest.mark.slow
def test_two_processes_equal_one(tiny_rules_organism, one_process, tmp_path):
    _run(
        [*_torchrun(), "train", "--student", str(tiny_rules_organism), *ARGS, *STEPS, "--out", str(tmp_path / "two")],
        tmp_path,
    )
    _assert_same(one_process, tmp_path / "two")


@pytest.mark.slow
def test_fsdp_two_processes_equal_one_and_resume(tiny_rules_organism, one_process, tmp_path):
    from transformers import AutoModelForCausalLM

    base = ["train", "--student", str(tiny_rules_organism), *ARGS, "--set", "save_every=2"]
    fsdp = [*_torchrun(), *base, "--set", "sharding=fsdp"]
    run = tmp_path / "fsdp"
    _run([*fsdp, "--set", "steps=2", "--out", str(run)], tmp_path)  # stops after the step-2 checkpoint
    shutil.copytree(run, tmp_path / "cross")
    _run([*fsdp, *STEPS, "--out", str(run), "--resume"], tmp_path)
    _assert_same(one_process, run)
    # the FSDP checkpoint resumed by ONE unsharded process: same format, same result
    _run([sys.executable, "-m", "mechopd.cli", *base, *STEPS, "--out", str(tmp_path / "cross"), "--resume"], tmp_path)
    _assert_same(one_process, tmp_path / "cross")
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    # full HF weights, not shards: from_pretrained loads them with every tensor at its full shape
    arch = json.loads((tiny_rules_organism / "config.json").read_text())["architectures"]
    for ckpt in (run / "checkpoints" / "step-2", run / "final"):
        assert json.loads((ckpt / "config.json").read_text())["architectures"] == arch
        model = AutoModelForCausalLM.from_pretrained(ckpt)
        saved = load_file(str(ckpt / "model.safetensors"))
        for name, t in model.state_dict().items():
            if name in saved:
                assert torch.equal(t, saved[name]), name
    final = AutoModelForCausalLM.from_pretrained(run / "final").state_dict()
    for k, v in _weights(one_process).items():
        torch.testing.assert_close(final[k], v, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
def test_grad_stats_are_summed_over_processes(tiny_rules_organism, tmp_path):
    """Per-term gradient norms, cosines (global and per group) and dominance of two processes equal one process's:
    the statistics are taken on the gradients summed over processes. One step (later steps sit at float-noise
    gradients, where AdamW turns rounding differences of the two summation orders into visible weight changes)."""
    args = ["train", "--student", str(tiny_rules_organism), *ARGS, "--set", "steps=1", "--set", "grad_stats_every=1"]
    _run([sys.executable, "-m", "mechopd.cli", *args, "--out", str(tmp_path / "one")], tmp_path)
    _run([*_torchrun(), *args, "--out", str(tmp_path / "two")], tmp_path)
    one, two = (
        [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()][0] for d in ("one", "two")
    )
    stats = sorted(k for k in one if k.startswith("grad/"))
    assert "grad/cos/opd__nca" in stats and "grad/cos_group/opd__nca/0.q_proj" in stats
    assert stats == sorted(k for k in two if k.startswith("grad/"))
    for k in stats:
        if one[k] is None:
            assert two[k] is None, k
        else:
            assert abs(one[k] - two[k]) <= 1e-6 + 1e-4 * abs(one[k]), (k, one[k], two[k])
    _assert_same(tmp_path / "one", tmp_path / "two")


def test_shared_prefix_two_processes_equal_one(tiny_rules_organism, tmp_path):
    """The shared context prefix (generate/prefix.py) under both layouts equals one process. Selector "full": the
    shared path changes float rounding (~1e-7), which TA-OPD's top-ρ selection over KL values near 1e-6 can turn
    into a different token set (the unshared path shares that sensitivity; tests/integration/test_shared_prefix.py
    pins shared == unshared per step)."""
    args = [*ARGS, "--set", "selector=full", "--set", "shared_prefix=auto", "--set", "steps=2"]
    one = tmp_path / "one"
    _run(
        [sys.executable, "-m", "mechopd.cli", "train", "--student", str(tiny_rules_organism), *args, "--out", str(one)],
        tmp_path,
    )
    keys, values = _metrics(one)
    assert float(values[:, keys.index("shared_prefix")].min()) > 0  # the shared path ran at every step
    for layout in ("none", "fsdp"):
        out = tmp_path / layout
        _run(
            [
                *_torchrun(),
                "train",
                "--student",
                str(tiny_rules_organism),
                *args,
                "--set",
                f"sharding={layout}",
                "--out",
                str(out),
            ],
            tmp_path,
        )
        _assert_same(one, out)
