"""Choices from registries (issue 56): a config field whose choices a package above the config extends names its
registry (``option(..., registry="selector")``); the registry lives in `mechopd.core.options`, the owning package fills
it when imported, and the check, ``--help`` and the docs read its live names. The config imports nothing above itself
(`tests/unit/test_layout.py`), yet a config built from Python is checked as one read from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mechopd.config import TrainConfig, method_names
from mechopd.core import options as opts
from mechopd.core.errors import ConfigError
from mechopd.objectives.select import register_selector, unregister_selector

ROOT = Path(__file__).resolve().parents[2]
FRESH = """
import sys
import mechopd
assert "torch" not in sys.modules and "mechopd.objectives.losses" not in sys.modules  # import mechopd stays light
from mechopd.config import TrainConfig
for kw in ({"method": "bogus"}, {"method": "follow"}, {"selector": "nope"}, {"rollout_engine": "x"},
           {"loss_head": "fused", "method": "sym_kl"}):
    try:
        TrainConfig(**kw)
    except Exception as e:
        print(type(e).__name__, e)
print(TrainConfig(method="ta_opd").selector)
"""


def test_a_config_built_from_python_refuses_unknown_names_with_the_same_message():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, env=env, check=True).stdout
    methods = "opd, nca, dual_opd, sym_kl, anchor_only, ta_opd, ta_opd_ent"
    selectors = "full, random, entropy, divergence, tip, compat, ta_opd, ta_opd_ent"
    assert out.splitlines() == [
        f"ConfigError method='bogus' is unknown; choose one of {methods}",
        f"ConfigError method='follow' is unknown; choose one of {methods} — the follow term is not a method: add it "
        "to any method with follow_weight (--set follow_weight=1, e.g. --method nca --set follow_weight=1)",
        f"ConfigError selector='nope' is unknown; choose one of {selectors}",
        "ConfigError rollout_engine='x' is unknown; choose one of auto, lean, hf, vllm",
        "ConfigError loss_head=fused computes the opd and nca terms only; method=sym_kl needs sym: set "
        "loss_head=logits (or auto)",
        "ta_opd",
    ]


def test_the_check_the_help_and_the_docs_read_the_live_names():
    facts = next(f for f in opts.field_facts(TrainConfig) if f.name == "selector")
    assert facts.registry == "selector" and "toy_live" not in opts.limits(facts)
    with pytest.raises(ConfigError, match="selector='toy_live' is unknown"):
        TrainConfig(selector="toy_live")
    register_selector("toy_live", needs_stats=False)(lambda normed, mask, generator: None)
    try:
        assert opts.limits(facts).endswith("| ta_opd_ent | toy_live")  # --help and docs/config.md's words
        assert TrainConfig(selector="toy_live").selector == "toy_live"
    finally:
        unregister_selector("toy_live")
    assert method_names() == list(opts.registry_names("method")) == [*opts.registry("method")]


def test_a_registry_nobody_filled_is_named():
    with pytest.raises(LookupError, match="no registry 'no_such' is filled"):
        opts.registry("no_such")
    f = opts.Facts("x", str, "a", "help", registry="no_such")
    with pytest.raises(LookupError, match="no_such"):
        opts.check_value(f, "a")


def test_the_vllm_options_help_names_every_key_the_check_accepts():
    from mechopd.config.sections import VLLM_OPTIONS

    facts = next(f for f in opts.field_facts(TrainConfig) if f.name == "vllm_options")
    assert all(key in facts.help for key in VLLM_OPTIONS)  # kv_cache_memory_bytes was missing from --help and the docs
