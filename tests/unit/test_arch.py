"""`mechopd.models.arch`: the module map by structure on every tested family, and the fused / Conv1D split views
against hand-computed slices of the stored weight (Phi-3 qkv_proj / gate_up_proj, GPT-2 c_attn, GPT-NeoX
query_key_value with its per-head interleaving)."""

from __future__ import annotations

import pytest
import torch

from mechopd.core.errors import ModelError
from mechopd.core.sites import site_of
from mechopd.models import decoder_layers, layer_modules, module_at
from mechopd.models.arch import check_supported, model_views
from mechopd.testing.families import EXTRA_FAMILIES, tiny_config, tiny_family_model

H, K, D, HD = 4, 2, 32, 8  # query heads, key/value heads, hidden, head size of the tiny configs


@pytest.fixture(scope="module")
def models():
    return {f: tiny_family_model(f) for f in EXTRA_FAMILIES}


def _w(model, name):
    return dict(model.named_parameters())[name].detach()


def test_phi3_qkv_and_gate_up_views_are_hand_slices(models):
    m = models["phi3"]
    views = model_views(m)
    qkv, gu = _w(m, "model.layers.1.self_attn.qkv_proj.weight"), _w(m, "model.layers.1.mlp.gate_up_proj.weight")
    want = {
        "q_proj": qkv[0 : H * HD],
        "k_proj": qkv[H * HD : H * HD + K * HD],
        "v_proj": qkv[H * HD + K * HD : H * HD + 2 * K * HD],
    }
    for proj, w in want.items():
        v = views[f"model.layers.1.self_attn.{proj}.weight"]
        assert torch.equal(v.take(qkv), w) and v.shape == tuple(w.shape)
    assert torch.equal(views["model.layers.1.mlp.gate_proj.weight"].take(gu), gu[: 2 * D])
    assert torch.equal(views["model.layers.1.mlp.up_proj.weight"].take(gu), gu[2 * D :])
    # the model's own MLP: gate first (Phi3MLP chunks [gate; up])
    x = torch.randn(3, D)
    gate, up = (x @ gu.T).chunk(2, dim=-1)
    assert torch.allclose(x @ views["model.layers.1.mlp.gate_proj.weight"].take(gu).T, gate)
    assert torch.allclose(x @ views["model.layers.1.mlp.up_proj.weight"].take(gu).T, up)


def test_gpt2_conv1d_views_are_transposed_column_slices(models):
    m = models["gpt2"]
    views = model_views(m)
    w, b = _w(m, "transformer.h.0.attn.c_attn.weight"), _w(m, "transformer.h.0.attn.c_attn.bias")
    assert w.shape == (D, 3 * D)  # Conv1D: [in, out]
    for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        vw, vb = views[f"model.layers.0.self_attn.{proj}.weight"], views[f"model.layers.0.self_attn.{proj}.bias"]
        assert torch.equal(vw.take(w), w[:, i * D : (i + 1) * D].T) and vw.shape == (D, D)
        assert torch.equal(vb.take(b), b[i * D : (i + 1) * D])
    # the model's own split: query, key, value = c_attn(x).split(n_embd)
    x = torch.randn(2, D)
    q, k, v = m.transformer.h[0].attn.c_attn(x).split(D, dim=-1)
    for proj, out in zip(("q_proj", "k_proj", "v_proj"), (q, k, v)):
        vw, vb = views[f"model.layers.0.self_attn.{proj}.weight"], views[f"model.layers.0.self_attn.{proj}.bias"]
        assert torch.allclose(x @ vw.take(w).T + vb.take(b), out, atol=1e-6)
    down = views["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(
        down.take(_w(m, "transformer.h.0.mlp.c_proj.weight")), _w(m, "transformer.h.0.mlp.c_proj.weight").T
    )


def test_gpt_neox_query_key_value_is_interleaved_per_head(models):
    m = models["gpt_neox"]
    views = model_views(m)
    w = _w(m, "gpt_neox.layers.1.attention.query_key_value.weight")  # [3·H·d, D], rows [q_h; k_h; v_h] per head
    b = _w(m, "gpt_neox.layers.1.attention.query_key_value.bias")
    for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        hand = torch.cat([w[3 * HD * h + i * HD : 3 * HD * h + (i + 1) * HD] for h in range(H)])
        assert torch.equal(views[f"model.layers.1.self_attn.{proj}.weight"].take(w), hand)
        assert torch.equal(views[f"model.layers.1.self_attn.{proj}.bias"].take(b), b.view(H, 3, HD)[:, i].reshape(-1))
    # the model's own split: qkv.view(..., H, 3d).chunk(3, -1)
    x = torch.randn(2, D)
    q, k, v = (x @ w.T + b).view(2, H, 3 * HD).chunk(3, dim=-1)
    for proj, out in zip(("q_proj", "k_proj", "v_proj"), (q, k, v)):
        vw, vb = views[f"model.layers.1.self_attn.{proj}.weight"], views[f"model.layers.1.self_attn.{proj}.bias"]
        assert torch.allclose(x @ vw.take(w).T + vb.take(b), out.reshape(2, H * HD), atol=1e-6)


def test_views_cover_every_element_once(models):
    """Every stored element is in exactly one view (nothing dropped, nothing counted twice)."""
    for family, m in models.items():
        params = dict(m.named_parameters())
        covered = {n: 0 for n in params}
        for v in model_views(m).values():
            covered[v.raw] += int(torch.Size(v.shape).numel())
        assert covered == {n: p.numel() for n, p in params.items()}, family


@pytest.mark.parametrize("family", EXTRA_FAMILIES)
def test_module_map_by_structure(models, family):
    m = models[family]
    assert len(decoder_layers(m)) == 2
    mods = layer_modules(m, -1)
    assert "o_proj" in mods and "down_proj" in mods and "post_attention_layernorm" in mods
    assert module_at(m, "embed") is m.get_input_embeddings()
    assert module_at(m, "lm_head") is m.get_output_embeddings()
    assert module_at(m, "layers.1.resid_post") is decoder_layers(m)[1]
    assert module_at(m, "layers.1.self_attn.o_proj") is mods["o_proj"]
    names = {site_of(n).module for n, _ in m.named_parameters() if site_of(n).layer is not None}
    assert {"o_proj", "down_proj"} <= names, names
    if family in ("phi3", "gpt2", "gpt_neox"):
        with pytest.raises(ModelError, match="fused"):
            module_at(m, "layers.0.self_attn.q_proj")


def test_site_names_of_other_families():
    assert site_of("transformer.h.3.attn.c_proj.weight")[:3] == ("layers.3.self_attn.o_proj", 3, "o_proj")
    assert site_of("gpt_neox.layers.1.mlp.dense_4h_to_h.bias")[:3] == ("layers.1.mlp.down_proj", 1, "down_proj")
    assert site_of("transformer.wte.weight").site == "embed" and site_of("embed_out.weight").site == "lm_head"
    assert site_of("gpt_neox.final_layer_norm.weight").site == "final_norm"


@pytest.mark.parametrize(
    "config, why",
    [
        ("MixtralConfig", "mixture-of-experts"),
        ("Qwen2MoeConfig", "mixture-of-experts"),
        ("T5Config", "encoder-decoder"),
        ("MambaConfig", "state-space"),
    ],
)
def test_unsupported_architectures_are_refused_with_the_reason(config, why):
    import transformers

    with pytest.raises(ModelError, match=why):
        check_supported(getattr(transformers, config)())
    check_supported(tiny_config("gemma3"))  # dense: no error


def test_gpt_neox_checkpoint_passes_the_weight_check(models, tmp_path):
    """GPT-NeoX stores its head as ``embed_out`` (transformers renames it ``lm_head`` on load): valid, and a
    checkpoint without it is still refused by name."""
    from safetensors.torch import load_file, save_file

    from mechopd.core.model_checks import check_checkpoint

    models["gpt_neox"].save_pretrained(tmp_path / "neox")
    files = check_checkpoint(tmp_path / "neox")
    assert "embed_out.weight" in files
    state = load_file(tmp_path / "neox" / "model.safetensors")
    del state["embed_out.weight"]
    save_file(state, tmp_path / "neox" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError, match="embed_out.weight"):
        check_checkpoint(tmp_path / "neox")


def test_gradient_sums_are_per_part_of_a_fused_tensor(models):
    """The gradients probe's per-parameter sums, split: Phi-3's qkv_proj gives q / k / v rows (hand slices)."""
    from mechopd.probes.grad_align import view_sums

    m = models["phi3"]
    name = "model.layers.0.self_attn.qkv_proj.weight"
    p = dict(m.named_parameters())[name]
    ga, gb = torch.randn(p.shape, dtype=torch.float64), torch.randn(p.shape, dtype=torch.float64)
    views = [v for v in model_views(m).values() if v.raw == name]
    names, sums, sizes = view_sums(ga.reshape(-1), [gb], [p], [views])
    assert [site_of(n).module for n in names] == ["q_proj", "k_proj", "v_proj"] and sizes == [1024, 512, 512]
    k = slice(H * HD, (H + K) * HD)
    assert sums[1][0] == pytest.approx(float((ga[k] * gb[k]).sum())) and sums[1][1] == pytest.approx(
        float(ga[k].square().sum())
    )


def test_a_family_whose_blocks_go_by_other_names_is_refused_for_what_was_not_found():
    """Falcon (``self_attention``) and OPT (``fc1``/``fc2``) are not recurrent: the message says which block mechopd's
    module map did not find, and asserts no family kind."""
    import transformers

    from mechopd.models.family import check_family

    opt = transformers.OPTConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4, word_embed_proj_dim=32
    )
    falcon = transformers.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    for config, needle in ((opt, "no MLP block mechopd's module map knows"), (falcon, "no attention block")):
        with pytest.raises(ModelError, match=needle) as e:
            check_family(config)
        assert "recurrent" not in str(e.value) and "\n" not in str(e.value)
