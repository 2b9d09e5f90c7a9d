"""A saved LoRA adapter proves what it holds (#41): its tensors' rank is the config's r, every lora_A has its lora_B,
r is a rank, values are finite, ΔW has its weight's shape; a rank past the model's projections and lm_head on tied
embeddings are refused before anything is allocated; a resume refuses a NaN adapter; the deltas settings name it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mechopd.config.sections import LoraOptions
from mechopd.core.errors import ConfigError, ModelError
from mechopd.models import lora
from tests.unit.test_lora import OPTS, _adapted, _llama


@pytest.fixture
def saved(tmp_path):
    """A LoRA checkpoint (merged weights + adapter/, rank 4) and its base model's directory."""
    ref, student, _ = _adapted()
    ref.save_pretrained(tmp_path / "base", safe_serialization=True)
    student.save_pretrained(tmp_path / "lora", state_dict=lora.merged_state(student), safe_serialization=True)
    lora.save_adapter(student, OPTS, tmp_path / "lora" / lora.ADAPTER_DIR, str(tmp_path / "base"))
    return tmp_path / "lora"


def _edit_config(ckpt, **changes):
    f = ckpt / lora.ADAPTER_DIR / lora.ADAPTER_CONFIG
    f.write_text(json.dumps({**json.loads(f.read_text()), **changes}))


def _edit_tensors(ckpt, edit):
    f = ckpt / lora.ADAPTER_DIR / lora.ADAPTER_WEIGHTS
    tensors = load_file(str(f))
    edit(tensors)
    save_file(tensors, str(f))


def _refused(ckpt, needle):
    with pytest.raises(ModelError, match=needle):
        lora.AdapterDeltas(lora.adapter_dir(ckpt))


def test_a_config_rank_other_than_the_tensors_is_refused(saved):
    _edit_config(saved, r=8)  # the tensors have rank 4: scaling by 16/8 would halve every ΔW
    _refused(saved, "not rank 8")


@pytest.mark.parametrize("r", [0, -1, 2.5, "4", None, True])
def test_a_config_r_that_is_no_rank_is_refused(saved, r):
    _edit_config(saved, r=r)
    _refused(saved, "is not a rank")


def test_an_adapter_missing_one_lora_b_is_refused(saved):
    _edit_tensors(saved, lambda t: t.pop(next(k for k in sorted(t) if ".lora_B." in k)))
    _refused(saved, "lacks .*lora_B")


def test_a_nan_adapter_is_refused(saved):
    def poison(t):
        k = next(k for k in sorted(t) if ".lora_A." in k)
        t[k] = t[k].clone()
        t[k][0, 0] = float("nan")

    _edit_tensors(saved, poison)
    _refused(saved, "NaN or inf")


def test_an_adapter_of_another_models_shape_is_refused_by_the_deltas_reader(saved):
    from mechopd.probes.delta_sums import open_checkpoint
    from mechopd.probes.weights import reader_for, tensor_shapes

    def wider(t):  # rank 4 kept, but every ΔW two columns wider than its weight
        for k in [k for k in t if ".lora_A." in k]:
            t[k] = torch.cat([t[k], t[k][:, :2]], dim=1).contiguous()

    _edit_tensors(saved, wider)
    base = open_checkpoint(saved.parent / "base")
    with pytest.raises(ModelError, match="belongs to another model"):
        reader_for(open_checkpoint(saved), base, 1 << 16, tensor_shapes(base))


def test_the_adapter_record_names_what_was_read(saved):
    import hashlib

    rec = lora.AdapterDeltas(lora.adapter_dir(saved)).record
    weights = saved / lora.ADAPTER_DIR / lora.ADAPTER_WEIGHTS
    assert rec["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert rec["r"] == 4 and rec["lora_alpha"] == 8.0 and rec["base_model_name_or_path"] == str(saved.parent / "base")


@pytest.mark.parametrize("rank", [2**40, 33, 0])
def test_a_rank_outside_the_projections_is_refused_before_allocation(rank):
    model = _llama(0)  # hidden 32: no projection has a dimension above 32
    with pytest.raises(ConfigError, match=f"lora_rank={rank} is outside 1..32"):
        lora.add_adapter(model, LoraOptions(lora_rank=rank))
    assert not lora.lora_layers(model)


def test_lm_head_on_tied_embeddings_is_refused():
    model = _llama(0)  # tie_word_embeddings=True
    with pytest.raises(ConfigError, match="ties to embed_tokens"):
        lora.add_adapter(model, LoraOptions(lora_rank=4, lora_targets=["q_proj", "lm_head"]))


def test_a_resume_refuses_a_nan_adapter(tmp_path):
    _, student, _ = _adapted()
    state = lora.adapter_state(student)
    key = next(iter(sorted(state)))
    state[key][0, 0] = float("inf")
    with pytest.raises(ModelError, match="NaN or inf"):
        lora.load_adapter_state(student, state, tmp_path)
    state = {k: (v[:2] if ".lora_A." in k else v) for k, v in lora.adapter_state(student).items()}
    with pytest.raises(ModelError, match="do not match"):  # another rank: a shape mismatch, not copy_'s RuntimeError
        lora.load_adapter_state(student, state, tmp_path)


def test_an_adapter_read_over_another_base_is_refused(saved, tmp_path):
    import shutil

    from mechopd.probes.delta_sums import open_checkpoint
    from mechopd.probes.weights import reader_for, tensor_shapes

    rec = lora.AdapterDeltas(lora.adapter_dir(saved)).record
    assert rec["base_sha256"] == dict(lora.base_hashes(str(saved.parent / "base")))
    other = Path(shutil.copytree(saved.parent / "base", tmp_path / "other-base"))  # same shapes, other W0
    tensors = load_file(str(other / "model.safetensors"))
    key = next(k for k in sorted(tensors) if "q_proj" in k)
    tensors[key] = tensors[key] + 1e-3
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    base = open_checkpoint(other)
    with pytest.raises(ModelError, match="trained on other base weights"):
        reader_for(open_checkpoint(saved), base, 1 << 16, tensor_shapes(base))
    own = open_checkpoint(saved.parent / "base")
    reader_for(open_checkpoint(saved), own, 1 << 16, tensor_shapes(own)).close()  # its own base reads
