"""Parameter deltas (mechopd.probes.deltas): streamed values against explicit references from full state dicts.

Per tensor here (site names, values, tied embeddings, bad input); the aggregates and the table's CSV / JSON round trip
are in test_deltas_aggregate.py; the tiny checkpoints and the reference in delta_checkpoints.py."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.sites import site_of
from mechopd.probes.delta_sums import aggregate_deltas, parameter_deltas
from mechopd.probes.weights import checkpoint_tensors
from tests.unit.delta_checkpoints import assert_close, by_key, make_trio, perturbed, reference, run, save, state, tiny


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    """base / opd / nca Qwen3 checkpoints (tied), opd = base + u, nca = opd + v."""
    return make_trio(tmp_path_factory.mktemp("trio"))


# ------------------------------------------------------------------------------------------------------ site names
@pytest.mark.parametrize(
    "name, want",
    [
        ("model.layers.3.self_attn.q_proj.weight", ("layers.3.self_attn.q_proj", 3, "q_proj", "weight")),
        ("model.layers.0.self_attn.k_proj.bias", ("layers.0.self_attn.k_proj", 0, "k_proj", "bias")),
        ("model.layers.11.mlp.down_proj.weight", ("layers.11.mlp.down_proj", 11, "down_proj", "weight")),
        ("model.layers.2.self_attn.q_norm.weight", ("layers.2.self_attn.q_norm", 2, "q_norm", "weight")),
        (
            "model.layers.2.post_attention_layernorm.weight",
            ("layers.2.post_attention_layernorm", 2, "post_attention_layernorm", "weight"),
        ),
        ("model.embed_tokens.weight", ("embed", None, "embed_tokens", "weight")),
        ("model.norm.weight", ("final_norm", None, "norm", "weight")),
        ("lm_head.weight", ("lm_head", None, "lm_head", "weight")),
        ("layers.1.mlp.up_proj.weight", ("layers.1.mlp.up_proj", 1, "up_proj", "weight")),
        (
            "base_model.model.model.layers.4.self_attn.v_proj.weight",
            ("layers.4.self_attn.v_proj", 4, "v_proj", "weight"),
        ),
        ("model.language_model.layers.0.self_attn.o_proj.weight", ("layers.0.self_attn.o_proj", 0, "o_proj", "weight")),
        ("model.visual.blocks.0.attn.qkv.weight", ("visual.blocks.0.attn.qkv", None, "qkv", "weight")),
    ],
)
def test_site_of(name, want):
    assert tuple(site_of(name)) == want


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_sites_resolve_to_the_module_owning_the_parameter(arch):
    """One naming scheme across mechopd: every site resolves with models.module_at to the module holding the param."""
    from mechopd.models import module_at

    model = tiny(arch, tie=False)
    for name, p in model.named_parameters():
        s = site_of(name)
        assert getattr(module_at(model, s.site), s.param) is p, name


# ---------------------------------------------------------------------------------------------------------- values
def test_identical_checkpoints_give_zero_deltas(tmp_path):
    model = tiny()
    base, same = save(model, tmp_path / "base"), save(model, tmp_path / "same")
    rows = parameter_deltas(base, {"opd": same, "nca": same}, ("opd", "nca"), progress=False)
    deltas = [r for r in rows if r.metric in ("delta_norm", "rel_delta")]
    assert deltas and all(r.value == 0.0 for r in deltas)
    assert all(math.isnan(r.value) for r in rows if r.metric == "cos")  # the angle between zero updates is undefined
    w0 = {k: v for k, v in reference(base, {}).items()}
    assert_close({k: v for k, v in by_key(rows).items() if k[-1] == "w0_norm" and k[2] != "lm_head"}, w0)


def test_known_perturbation_moves_only_that_tensor(tmp_path):
    base = tiny()
    moved = copy.deepcopy(base)
    q = moved.model.layers[1].self_attn.q_proj.weight
    with torch.no_grad():
        q.add_(0.25)
    rows = parameter_deltas(save(base, tmp_path / "b"), {"opd": save(moved, tmp_path / "m")}, progress=False)
    norms = {r.site: r.value for r in rows if r.metric == "delta_norm"}
    assert norms.pop("layers.1.self_attn.q_proj") == pytest.approx(0.25 * math.sqrt(q.numel()), rel=1e-6)
    assert all(v == 0.0 for v in norms.values())


def test_norms_and_cosines_match_full_state_dicts(trio):
    rows = run(trio)
    want = reference(trio["base"], {"opd": trio["opd"], "nca": trio["nca"]}, ("opd", "nca"))
    got = {k: v for k, v in by_key(rows).items() if k[2] != "lm_head"}  # tied head: checked separately
    assert_close(got, want)


@pytest.mark.parametrize("arch, tie", [("qwen3", False), ("qwen2", True), ("qwen2", False), ("llama", False)])
def test_other_architectures_match_full_state_dicts(tmp_path, arch, tie):
    base = tiny(arch, tie=tie)
    opd, nca = perturbed(base, 1e-2, seed=3), perturbed(base, 2e-2, seed=4)
    dirs = {k: save(m, tmp_path / k) for k, m in (("base", base), ("opd", opd), ("nca", nca))}
    rows = parameter_deltas(dirs["base"], {"opd": dirs["opd"], "nca": dirs["nca"]}, ("opd", "nca"), progress=False)
    got = by_key(rows)
    if tie:
        got = {k: v for k, v in got.items() if k[2] != "lm_head"}
    assert_close(got, reference(dirs["base"], {"opd": dirs["opd"], "nca": dirs["nca"]}, ("opd", "nca")))
    if arch == "qwen2":  # q/k/v biases are their own rows, on the projection's site
        assert {r.site for r in rows if r.param == "bias"} == {
            f"layers.{i}.self_attn.{m}" for i in range(2) for m in ("q_proj", "k_proj", "v_proj")
        }


def test_cosine_of_an_update_with_itself_and_its_negative(tmp_path):
    base = tiny().double()  # float64 checkpoint: also the path for dtypes wider than 4 bytes
    plus, minus = copy.deepcopy(base), copy.deepcopy(base)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p, m in zip(plus.parameters(), minus.parameters()):
            d = 1e-2 * torch.randn(p.shape, generator=g, dtype=p.dtype)
            p.add_(d)
            m.sub_(d)
    dirs = {k: save(m, tmp_path / k) for k, m in (("base", base), ("plus", plus), ("minus", minus))}
    dirs["again"] = save(plus, tmp_path / "again")
    same = parameter_deltas(dirs["base"], {"a": dirs["plus"], "b": dirs["again"]}, ("a", "b"), progress=False)
    opposite = parameter_deltas(dirs["base"], {"a": dirs["plus"], "b": dirs["minus"]}, ("a", "b"), progress=False)
    for rows, cos in ((same, 1.0), (opposite, -1.0)):
        values = [r.value for r in rows if r.metric == "cos"]
        assert values and all(v == pytest.approx(cos, abs=1e-9) for v in values)
    assert all(r.value == 0.0 for r in same if r.vs == "a" and r.metric == "delta_norm")


def test_sharded_checkpoints_give_the_same_table(trio, tmp_path):
    models = {k: AutoModelForCausalLM.from_pretrained(trio[k]) for k in ("base", "opd", "nca")}
    sharded = {k: save(m, tmp_path / k, max_shard_size="20KB") for k, m in models.items()}
    assert len(set(checkpoint_tensors(sharded["base"]).values())) > 2
    assert not (sharded["base"] / "model.safetensors").exists()
    want, got = run(trio), run(sharded)
    assert [r.__class__(**{**r.__dict__, "value": 0}) for r in got] == [
        r.__class__(**{**r.__dict__, "value": 0}) for r in want
    ]
    assert_close(by_key(got), by_key(want), rel=1e-12)


def test_windows_chunks_and_float32_do_not_change_the_result(trio):
    threads = torch.get_num_threads()
    want = by_key(run(trio))
    assert torch.get_num_threads() == threads  # computed single-threaded, the caller's setting restored
    assert_close(by_key(run(trio, window_numel=100, chunk_numel=7)), want, rel=1e-12)
    assert_close(by_key(run(trio, dtype=torch.float32)), want, rel=1e-5, abs_=1e-5)


# -------------------------------------------------------------------------------------------------- tied embeddings
def test_tied_head_repeats_the_embedding_and_is_counted_once(trio):
    assert not any(site_of(n).site == "lm_head" for n in checkpoint_tensors(trio["base"]))
    rows = run(trio)
    head = {k[:2] + k[3:]: v for k, v in by_key(rows).items() if k[2] == "lm_head"}
    embed = {k[:2] + k[3:]: v for k, v in by_key(rows).items() if k[2] == "embed"}
    assert head == embed and all(r.tied_to == "embed_tokens" for r in rows if r.site == "lm_head")
    model = AutoModelForCausalLM.from_pretrained(trio["base"])
    total = aggregate_deltas(rows, "all")
    assert {r.numel for r in total} == {sum(p.numel() for p in model.parameters())}  # parameters() dedups ties
    w0 = state(trio["base"])
    want = math.sqrt(sum((w**2).sum().item() for w in w0.values()))
    assert next(r.value for r in total if r.metric == "w0_norm") == pytest.approx(want, rel=1e-12)


def test_tied_head_stored_next_to_its_embedding_is_dropped(trio, tmp_path):
    copied = tmp_path / "opd"
    copied.mkdir()
    sd = load_file(trio["opd"] / "model.safetensors")
    save_file({**sd, "lm_head.weight": sd["model.embed_tokens.weight"].clone()}, copied / "model.safetensors")
    (copied / "config.json").write_text((trio["opd"] / "config.json").read_text())
    rows = parameter_deltas(trio["base"], {"opd": copied}, progress=False)
    assert by_key(rows) == by_key(parameter_deltas(trio["base"], {"opd": trio["opd"]}, progress=False))


def test_tied_and_untied_checkpoints_do_not_compare(tmp_path):
    base = save(tiny(tie=True), tmp_path / "tied")
    other = save(tiny(tie=False), tmp_path / "untied")
    with pytest.raises(ModelError, match="lm_head.weight"):
        parameter_deltas(base, {"opd": other}, progress=False)


# -------------------------------------------------------------------------------------------------------- bad input
def test_shape_mismatch_names_the_tensor_and_both_dirs(tmp_path):
    base = save(tiny(), tmp_path / "base")
    wider = save(tiny(intermediate_size=64), tmp_path / "wider")
    with pytest.raises(ModelError) as err:
        parameter_deltas(base, {"opd": wider}, progress=False)
    msg = str(err.value)
    assert "'model.layers.0.mlp.down_proj.weight'" in msg and str(base) in msg and str(wider) in msg
    assert "[32, 48]" in msg and "[32, 64]" in msg


def test_architecture_mismatch_names_the_tensor(tmp_path):
    qwen3 = save(tiny("qwen3", tie=False), tmp_path / "qwen3")
    llama = save(tiny("llama", tie=False), tmp_path / "llama")  # same shapes, no q_norm / k_norm
    with pytest.raises(ModelError, match=r"'model\.layers\.0\.self_attn\.k_norm\.weight' is in .*qwen3 but not in"):
        parameter_deltas(qwen3, {"opd": llama}, progress=False)


def test_missing_or_pickled_checkpoints_raise_model_error(tmp_path, trio):
    pickled = tmp_path / "bin"
    pickled.mkdir()
    torch.save({"w": torch.zeros(2)}, pickled / "pytorch_model.bin")
    with pytest.raises(ModelError, match=r"bin .*safe_serialization=True"):
        checkpoint_tensors(pickled)
    with pytest.raises(ModelError, match="does not exist"):
        parameter_deltas(tmp_path / "nowhere", {"opd": trio["opd"]}, progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="model.safetensors"):
        checkpoint_tensors(tmp_path / "empty")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a.weight": "gone.safetensors"}}))
    with pytest.raises(ModelError, match="gone.safetensors"):
        checkpoint_tensors(broken)


@pytest.mark.parametrize(
    "models, pair",
    [({}, None), ({"base": "x"}, None), ({"opd": "x"}, ("opd", "nca")), ({"opd": "x", "nca": "y"}, ("opd", "opd"))],
)
def test_bad_labels_raise_config_error(models, pair, trio):
    with pytest.raises(ConfigError):
        parameter_deltas(trio["base"], models, pair, progress=False)
