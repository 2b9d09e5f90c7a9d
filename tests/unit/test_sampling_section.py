"""`SamplingSettings.from_section`: the rollout section reaches the sampler whole, each field declared once.

Every field of `config.sections.RolloutOptions` is either a `SamplingSettings` field (carried by `from_section`) or
named in `settings.NOT_SAMPLING` (the trainer's or the engine's); the callers (train, eval, probes) hand over the
section, so a new rollout option reaches generate by being declared there.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from mechopd.config.sections import RolloutOptions
from mechopd.evaluation.config import EvalConfig
from mechopd.generate.settings import NOT_SAMPLING, TASK_DEFAULTS, SamplingSettings, known_vocab, stop_ids

TASK = SimpleNamespace(temperature=0.7, max_new_tokens=9)


def test_every_rollout_field_is_carried_or_declared_not_sampling():
    names = {f.name for f in dataclasses.fields(SamplingSettings)}
    rollout = {f.name for f in dataclasses.fields(RolloutOptions)}
    stray = sorted(rollout - names - NOT_SAMPLING)
    assert not stray, f"RolloutOptions fields neither sampled nor in NOT_SAMPLING: {stray}"
    assert NOT_SAMPLING <= rollout, sorted(NOT_SAMPLING - rollout)  # no stale name
    assert set(TASK_DEFAULTS) <= rollout & names


def test_from_section_reads_the_section_and_the_task(organism_tokenizer, tiny_qwen3):
    tok, model = organism_tokenizer, tiny_qwen3
    st = SamplingSettings.from_section(RolloutOptions(), TASK, tok, model)
    assert (st.temperature, st.max_new_tokens, st.engine, st.shared_prefix) == (0.7, 9, "auto", "auto")
    assert st.stop == tuple(stop_ids(tok, model)) and st.vocab == known_vocab(tok, model)
    assert st.batch_size == SamplingSettings.batch_size  # the section's batch_size is prompts per step: not carried
    own = RolloutOptions(temperature=1.3, max_new_tokens=4, rollout_engine="hf", shared_prefix="off", batch_size=3)
    st = SamplingSettings.from_section(own, TASK, tok, model, greedy=True, batch_size=5)
    assert (st.temperature, st.max_new_tokens, st.engine, st.shared_prefix) == (1.3, 4, "hf", "off")
    assert (st.greedy, st.batch_size) == (True, 5)
    engine = SimpleNamespace(name="fake", sample=lambda *a: None)
    assert SamplingSettings.from_section(own, TASK, tok, model, engine=engine).engine is engine


def test_eval_config_is_a_rollout_section():
    cfg = EvalConfig(temperature=0.5, max_new_tokens=7, engine="hf", shared_prefix="off", batch_size=3)
    r = cfg.rollout()
    assert (r.temperature, r.max_new_tokens, r.rollout_engine, r.shared_prefix) == (0.5, 7, "hf", "off")
    assert r.batch_size == RolloutOptions.batch_size  # eval's batch_size (per sampling call) stays the caller's
