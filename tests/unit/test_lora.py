"""`mechopd.models.lora`: a LoRA student at B = 0 is the full model (loss and gradient), its adapter-off teacher is the base
model on shared tensors, the merged checkpoint and the PEFT-format adapter reproduce the adapted student, and the lean
decoder runs the adapter."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from mechopd.config import TrainConfig
from mechopd.config.sections import LoraOptions
from mechopd.core.errors import ConfigError
from mechopd.core.views import assemble_two_views
from mechopd.models import lora
from mechopd.objectives.losses import method_terms
from mechopd.objectives.select import make_selector
from mechopd.train.step import StepOptions, StepScorer

V, T = 61, 0.8
OPTS = LoraOptions(lora_rank=4, lora_alpha=8.0)


def _llama(seed: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=0,
        initializer_range=0.25,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.fixture(scope="module")
def batch():
    rng = random.Random(0)
    px, pc, resp = [], [], []
    for n in (3, 5, 2):
        x = [rng.randrange(3, V) for _ in range(4)]
        px.append(x)
        pc.append([rng.randrange(3, V) for _ in range(6)] + x)
        resp.append([rng.randrange(3, V) for _ in range(n)])
    return assemble_two_views(px, pc, resp, 0)


def _adapted(seed: int = 0, perturb: bool = True):
    """(base reference with its own tensors, student with an adapter, teacher = the student's shared base)."""
    ref = _llama(seed)
    student = copy.deepcopy(ref)
    teacher = lora.shared_base(student)
    lora.add_adapter(student, OPTS)
    if perturb:
        with torch.no_grad():
            for n, p in student.named_parameters():
                if ".lora_B." in n:
                    p.normal_(0, 0.3)  # a trained adapter
    return ref, student, teacher.requires_grad_(False)


def _logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch.input_ids_c, attention_mask=batch.attention_mask_c).logits


def _step(student, teacher, batch):
    params = [p for p in student.parameters() if p.requires_grad]
    student.zero_grad(set_to_none=True)
    opts = StepOptions(temperature=T, vocab=V, budget=1.0, seed=0, shared_prefix="off")
    terms = method_terms("nca", 0.5, estimator="full")
    return StepScorer(student, teacher, terms, make_selector("full"), params, opts).step(batch, 0)


def test_lora_at_b_zero_gives_the_full_models_first_step_loss_and_gradient(batch):
    full, teacher = _llama(0), _llama(1).requires_grad_(False)
    student = lora.add_adapter(copy.deepcopy(full), OPTS)  # B = 0 at init: ΔW = 0
    ref = _step(full, teacher, batch)
    got = _step(student, teacher, batch)
    torch.testing.assert_close(got.loss, ref.loss, rtol=1e-6, atol=1e-7)
    for key in ("loss/opd", "loss/nca", "kl/teacher_student"):
        torch.testing.assert_close(got.logs[key], ref.logs[key], rtol=1e-6, atol=1e-7)
    grads = dict(full.named_parameters())
    layers = lora.lora_layers(student)
    assert len(layers) == 2 * 7  # q/k/v/o/gate/up/down in both layers
    for path, layer in layers.items():
        g_w = grads[path + ".weight"].grad  # dL/dW of the full model  [d_out, d_in]
        a = layer.lora_A[lora.NAME].weight
        scale = layer.scaling[lora.NAME]
        # ΔW = s·B·A  =>  dL/dB = s · dL/dW · Aᵀ, and dL/dA = s · Bᵀ · dL/dW = 0 at B = 0
        torch.testing.assert_close(layer.lora_B[lora.NAME].weight.grad, scale * g_w @ a.T, rtol=1e-4, atol=1e-7)
        assert float(layer.lora_A[lora.NAME].weight.grad.abs().max()) == 0.0


@pytest.mark.parametrize("micro, chunk, ckpt", [(1, 2, False), (2, None, True), (None, 1, True)])
def test_lora_gradients_equal_the_one_shot_step_with_the_memory_options(batch, micro, chunk, ckpt):
    """Micro-batches, logit chunks and activation checkpointing give the adapter the one-shot step's gradient."""
    from mechopd.train.step import enable_checkpointing

    _, student, teacher = _adapted()
    student.train()
    ref = _step(student, teacher, batch)
    want = {n: p.grad.clone() for n, p in student.named_parameters() if p.requires_grad}
    other = copy.deepcopy(student)
    if ckpt:
        enable_checkpointing(other)
    params = [p for p in other.parameters() if p.requires_grad]
    opts = StepOptions(
        temperature=T, vocab=V, budget=1.0, seed=0, shared_prefix="off", micro_batch_size=micro, logit_chunk=chunk
    )
    got = StepScorer(
        other, teacher, method_terms("nca", 0.5, estimator="full"), make_selector("full"), params, opts
    ).step(batch, 0)
    torch.testing.assert_close(got.loss, ref.loss, rtol=1e-5, atol=1e-7)
    for n, p in other.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-7, msg=n)


def test_the_adapter_off_teacher_is_the_base_model_without_a_copy(batch):
    ref, student, teacher = _adapted()
    torch.testing.assert_close(_logits(teacher, batch), _logits(ref, batch), rtol=0, atol=0)
    assert not torch.allclose(_logits(student, batch), _logits(ref, batch), atol=1e-3)  # the adapter acts
    n_train, n_all = lora.trainable_share(student)
    assert n_train == sum(p.numel() for n, p in student.named_parameters() if ".lora_" in n) and n_train < n_all
    base = {lora.site_name(n): p for n, p in student.named_parameters() if ".lora_" not in n}
    for n, p in teacher.named_parameters():
        assert p.data_ptr() == base[n].data_ptr(), n  # the very same storage: no second copy of the weights
    for layer in lora.lora_layers(student).values():
        layer.enable_adapters(False)  # peft's own adapter switch gives the same model
    torch.testing.assert_close(_logits(student, batch), _logits(teacher, batch), rtol=0, atol=0)


def test_merged_checkpoint_and_peft_adapter_reproduce_the_student(batch, tmp_path):
    from peft import PeftModel

    from mechopd.models import load_model

    ref, student, _ = _adapted()
    student.save_pretrained(tmp_path, state_dict=lora.merged_state(student), safe_serialization=True)
    lora.save_adapter(student, OPTS, tmp_path / lora.ADAPTER_DIR, None)
    want = _logits(student, batch)
    torch.testing.assert_close(_logits(load_model(tmp_path), batch), want, rtol=1e-5, atol=1e-5)
    peft_model = PeftModel.from_pretrained(copy.deepcopy(ref), str(tmp_path / lora.ADAPTER_DIR)).eval()
    torch.testing.assert_close(_logits(peft_model, batch), want, rtol=1e-5, atol=1e-5)
    deltas = lora.AdapterDeltas(lora.adapter_dir(tmp_path))
    for path, layer in lora.lora_layers(student).items():
        torch.testing.assert_close(deltas.delta(path + ".weight").float(), lora.delta_weight(layer))


def test_the_lean_decoder_runs_the_adapter(batch):
    from mechopd.generate.lean import LeanDecoder

    _, student, _ = _adapted()
    x, m = batch.input_ids_x, batch.attention_mask_x
    pos = (m.cumsum(-1) - 1).clamp(min=0)
    dec = LeanDecoder(student)
    with torch.inference_mode():
        logits = dec.prefill(x, m, pos, max_new_tokens=3)
        for _ in range(3):
            tok = logits.argmax(-1)
            x, m = torch.cat([x, tok[:, None]], 1), torch.cat([m, torch.ones_like(m[:, :1])], 1)
            pos = (m.cumsum(-1) - 1).clamp(min=0)
            logits = dec.step(tok, pos[:, -1:])
            want = student(input_ids=x, attention_mask=m, position_ids=pos).logits[:, -1]
            torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)


def test_unknown_lora_target_is_refused():
    with pytest.raises(ConfigError, match="lora_targets.*q_projx.*choose from"):
        lora.add_adapter(_llama(0), LoraOptions(lora_rank=2, lora_targets=["q_projx"]))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(lora_rank=-1), "lora_rank"),
        (dict(lora_rank=4, lora_alpha=0), "lora_alpha"),
        (dict(lora_rank=4, lora_dropout=1.0), "lora_dropout"),
        (dict(lora_targets=[]), "lora_targets"),
        (dict(lora_targets=["q_proj", "q_proj"]), "lora_targets"),
        (dict(lora_rank=4, sharding="fsdp"), "sharding"),
        (dict(lora_rank=4, rollout_engine="vllm"), "vllm"),
        (dict(teacher_mode="swa"), "teacher_mode"),
        (dict(teacher_mode="ema", teacher="some/teacher"), "self-distillation"),
        (dict(teacher_mode="live", sharding="fsdp"), "sharding"),
        (dict(ema_decay=1.5), "ema_decay"),
    ],
)
def test_lora_and_teacher_fields_are_validated(kw, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**kw)


def test_the_adapter_takes_its_options_without_importing_the_config():
    from pathlib import Path

    import mechopd.models.lora as lora
    from tests.unit.test_layering import imported_modules

    assert not [m for m in imported_modules(Path(lora.__file__)) if m.startswith("mechopd.config")]  # issue 56
    opts = LoraOptions(lora_rank=2, lora_targets=["q_proj"])
    assert lora.targets_of(opts) == ("q_proj",) and lora.targets_of(LoraOptions()) == lora.DEFAULT_TARGETS
