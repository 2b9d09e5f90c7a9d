"""Micro-batched, chunked steps on two processes (torchrun, gloo) equal the one-shot step on one process.

7 rows over two processes (4 + 3) in micro-batches of 3 (2 + 1): the second process runs a masked copy of a row to
keep the collectives in step. Replicas with ``logit_chunk`` too; FSDP with micro-batches. Two steps: the third step
of this fixture sits at float-noise gradients (KL ~1e-6) that AdamW turns into visible weight differences for ANY
change of summation order (one process with and without micro-batches already differs there).
"""

from __future__ import annotations

import sys

import pytest

from tests.integration.test_two_process import ARGS, _assert_same, _run, _torchrun

MICRO = ["--set", "micro_batch_size=3"]


@pytest.fixture(scope="module")
def args(tiny_rules_organism):
    return ["train", "--student", str(tiny_rules_organism), *ARGS, "--set", "steps=2", "--set", "batch_size=7"]


@pytest.fixture(scope="module")
def one_shot(args, tmp_path_factory):
    out = tmp_path_factory.mktemp("one_shot") / "run"
    _run([sys.executable, "-m", "mechopd.cli", *args, "--out", str(out)], out.parent)
    return out


@pytest.mark.slow
def test_two_processes_micro_batched_and_chunked_equal_one_shot(args, one_shot, tmp_path):
    _run([*_torchrun(), *args, *MICRO, "--set", "logit_chunk=3", "--out", str(tmp_path / "two")], tmp_path)
    _assert_same(one_shot, tmp_path / "two")


@pytest.mark.slow
def test_fsdp_uneven_micro_batches_equal_one_shot(args, one_shot, tmp_path):
    _run([*_torchrun(), *args, *MICRO, "--set", "sharding=fsdp", "--out", str(tmp_path / "fsdp")], tmp_path)
    _assert_same(one_shot, tmp_path / "fsdp")
