"""Without the vLLM extra, asking for it is one error line naming the install command (runs in every environment)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from mechopd.cli import main
from mechopd.config import TrainConfig
from mechopd.core.errors import ConfigError, ModelError, TaskError
from mechopd.evaluation.evaluate import EvalConfig
from mechopd.generate import vllm_engine


@pytest.fixture
def no_vllm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))


def test_train_and_eval_name_the_install_command(no_vllm, capsys, tmp_path):
    with pytest.raises(ConfigError, match=r"rollout_engine=vllm needs vLLM.*pip install mechopd\[vllm\]"):
        TrainConfig(rollout_engine="vllm")
    with pytest.raises(ConfigError, match=r"engine=vllm needs vLLM.*pip install mechopd\[vllm\]"):
        EvalConfig(engine="vllm")
    assert main(["train", "--set", "rollout_engine=vllm", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: rollout_engine=vllm needs vLLM") and "mechopd[vllm]" in err[0]
    assert not (tmp_path / "run").exists()


def test_unsupported_head_dim_names_the_constraint_and_the_sizes():
    organism = SimpleNamespace(hidden_size=96, num_attention_heads=4, head_dim=24)  # the default rules organism
    with pytest.raises(ModelError, match=r"head_dim 24.*supported head sizes: 32, 64, 80, 96, 112, 128"):
        vllm_engine.check_shape(organism, "cpu")
    vllm_engine.check_shape(SimpleNamespace(hidden_size=96, num_attention_heads=3, head_dim=32), "cpu")
    vllm_engine.check_shape(organism, "cuda")  # the CPU backend's constraint only


def test_unknown_vllm_option_is_named():
    with pytest.raises(ConfigError, match="vllm_options: unknown key.*gpu_mem"):
        TrainConfig(vllm_options={"gpu_mem": 0.5})
    with pytest.raises(TaskError, match="engine='sglang' is unknown"):
        EvalConfig(engine="sglang")
