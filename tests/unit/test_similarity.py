"""Two-view similarity: capture hooks and per-layer cosine against slow explicit references, invariances, bad input."""

from __future__ import annotations

import csv
import json
import statistics

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from mechopd.core.errors import ConfigError, ModelError
from mechopd.core.views import RenderSpec, assemble_two_views, render_prompt_ids
from mechopd.organisms.tokenizer import build_tokenizer
from mechopd.probes.capture import capture_views, patch_response, resolve_sites, run_view
from mechopd.probes.cka import StreamingCKA
from mechopd.probes.items import make_batches
from mechopd.probes.setup import ProbeSetup
from mechopd.probes.similarity import SimilarityOptions, run_similarity, write_rows
from mechopd.probes.view_cosine import _Buffer, compare_models, token_cosine, two_view_cosine
from mechopd.tasks.base import get_task

ATOL = 2e-5


@pytest.fixture(scope="module")
def task():
    return get_task("rules")


@pytest.fixture(scope="module")
def tok(task):
    return build_tokenizer(task.vocab())


def tiny(tok, layers: int = 2, hidden: int = 32, seed: int = 0):
    cfg = Qwen3Config(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=len(tok),
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.fixture(scope="module")
def model(tok):
    return tiny(tok)


@pytest.fixture(scope="module")
def items(tok, task, model):
    """Six rules items with responses sampled from the model (varying lengths)."""
    return make_batches(tok, task, 6, 0, 6, model)


# ---------------------------------------------------------------------------------------------------------------------
# Slow references: one unpadded sequence at a time, modules called one by one, cosines token by token.


def ref_sites(model, ids: list[int]) -> dict[str, torch.Tensor]:
    """Every site's hidden states ``[L, d]`` of one unpadded sequence, calling embed / layers / norm explicitly."""
    inner = model.model
    x = torch.tensor([ids])
    pos = torch.arange(len(ids))[None]
    with torch.no_grad():
        h = inner.embed_tokens(x)
        out = {"embed": h[0]}
        pe = inner.rotary_emb(h, pos)
        for i, layer in enumerate(inner.layers):
            h = layer(h, attention_mask=None, position_embeddings=pe, position_ids=pos)  # causal via sdpa is_causal
            h = h if isinstance(h, torch.Tensor) else h[0]
            out[f"layers.{i}.resid_post"] = h[0]
        out["final_norm"] = inner.norm(h)[0]
    return out


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    both_zero = float(a.norm()) == 0.0 and float(b.norm()) == 0.0  # a sampled pad id: identical
    return 1.0 if both_zero else float(torch.dot(a, b) / (a.norm() * b.norm()))


def ref_cosines(model, tok, items, stop: bool = False) -> dict[str, list[list[float]]]:
    """site -> per example -> per PREDICTING position cosine (the state predicting response token t: the last prompt
    token, then response tokens 0..n-2), float64, one dot product at a time; ``stop``: instead, per example the
    cosine of the state OF the response's last token."""
    spec = items.spec
    out: dict[str, list[list[float]]] = {}
    for ex, resp in zip(items.examples, items.responses):
        px = render_prompt_ids(tok, ex.prompt, None, spec)
        pc = render_prompt_ids(tok, ex.prompt, ex.context, spec)
        hx, hc = ref_sites(model, px + resp), ref_sites(model, pc + resp)
        for site in hx:
            if stop:
                vals = [_cos(hx[site][len(px) + len(resp) - 1], hc[site][len(pc) + len(resp) - 1])]
            else:
                vals = [_cos(hx[site][len(px) + t - 1], hc[site][len(pc) + t - 1]) for t in range(len(resp))]
            out.setdefault(site, []).append(vals)
    return out


def by_site(rows, key="cos_mean"):
    return {r["site"]: r[key] for r in rows}


def test_cosine_matches_explicit_reference_on_one_layer_model(tok, task):
    model = tiny(tok, layers=1, seed=3)
    items = make_batches(tok, task, 5, 1, 5, model)
    res = two_view_cosine(model, items)
    ref = ref_cosines(model, tok, items)
    assert [r["site"] for r in res.rows] == ["embed", "layers.0.resid_post", "final_norm"]
    for row in res.rows:
        per_ex = ref[row["site"]]
        flat = [v for ex in per_ex for v in ex]
        assert row["n_tokens"] == len(flat)
        assert row["cos_mean"] == pytest.approx(sum(flat) / len(flat), abs=ATOL)
        assert row["cos_median"] == pytest.approx(statistics.median(flat), abs=ATOL)
        assert row["cos_example_mean"] == pytest.approx(sum(sum(e) / len(e) for e in per_ex) / len(per_ex), abs=ATOL)
    stops = ref_cosines(model, tok, items, stop=True)
    for row in res.rows:  # the stop token's own state, apart: the mean over examples of its one cosine
        assert row["cos_stop"] == pytest.approx(sum(e[0] for e in stops[row["site"]]) / len(items.examples), abs=ATOL)
    assert any(r["cos_stop"] != pytest.approx(r["cos_mean"], abs=1e-3) for r in res.rows if r["site"] != "embed")
    assert min(r["cos_mean"] for r in res.rows if r["site"] != "embed") < 0.999  # the views really differ
    for er in res.example_rows:
        vals = ref[er["site"]][er["example"]]
        assert er["n_tokens"] == len(vals)
        assert er["cos_mean"] == pytest.approx(sum(vals) / len(vals), abs=ATOL)


def test_batched_equals_one_by_one(tok, task, model, items):
    assert len({len(r) for r in items.responses}) > 1  # padding really happens
    one = make_batches(tok, task, 6, 0, 1, items.responses)
    big, small = two_view_cosine(model, items, cka=True), two_view_cosine(model, one, cka=True)
    for a, b in zip(big.rows, small.rows):
        for k in ("cos_mean", "cos_median", "cos_example_mean", "cka"):
            assert a[k] == pytest.approx(b[k], abs=ATOL), (a["site"], k)
        assert a["n_tokens"] == b["n_tokens"]
    assert [r["cos_mean"] for r in big.example_rows] == pytest.approx(
        [r["cos_mean"] for r in small.example_rows], abs=ATOL
    )


def test_left_and_right_padding_agree(tok, task, model, items):
    right = make_batches(tok, task, 6, 0, 6, items.responses, layout="right")
    a, b = two_view_cosine(model, items), two_view_cosine(model, right)
    assert by_site(a.rows) == pytest.approx(by_site(b.rows), abs=ATOL)
    assert by_site(a.rows, "cos_median") == pytest.approx(by_site(b.rows, "cos_median"), abs=ATOL)


def test_model_against_itself_on_identical_views_is_one_everywhere(tok, model):
    spec = RenderSpec()
    prompts = [render_prompt_ids(tok, p, None, spec) for p in ["apply the rule to : 1 2 3", "apply the rule to : 4"]]
    pad = tok.pad_token_id
    responses = [[7, 8, 9, pad, 10], [11, 3]]  # a pad id inside a response: zero embedding on both sides
    batch = assemble_two_views(prompts, prompts, responses, pad)
    res = two_view_cosine(model, [batch], cka=True)
    for row in res.rows:
        assert row["cos_mean"] == pytest.approx(1.0, abs=1e-6) and row["cos_median"] == pytest.approx(1.0, abs=1e-6)
        assert row["cka"] == pytest.approx(1.0, abs=1e-6)
    assert res.rows[0]["n_tokens"] == 7


def test_token_cosine_and_streaming_cka_against_references():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 6, generator=g, dtype=torch.float64) + 5.0  # far from centred: the shift matters
    y = (
        x @ torch.randn(6, 6, generator=g, dtype=torch.float64)
        + 0.3 * torch.randn(50, 6, generator=g, dtype=torch.float64)
        - 2.0
    )
    cos = token_cosine(x, y)
    for i in range(50):
        assert float(cos[i]) == pytest.approx(float(x[i] @ y[i] / (x[i].norm() * y[i].norm())), abs=1e-6)
    h = torch.eye(50, dtype=torch.float64) - 1.0 / 50  # centring matrix, kernel form: HSIC(K, L) = tr(K H L H)
    k, l_ = x @ x.T, y @ y.T
    hsic = lambda a, b: torch.trace(a @ h @ b @ h)  # noqa: E731
    ref = float(hsic(k, l_) / torch.sqrt(hsic(k, k) * hsic(l_, l_)))
    cka = StreamingCKA()
    for lo, hi in [(0, 7), (7, 8), (8, 31), (31, 50)]:
        cka.add(x[lo:hi].float(), y[lo:hi].float())
    assert cka.value() == pytest.approx(ref, abs=1e-5)
    assert 0.0 < ref < 0.999
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    same = StreamingCKA()
    same.add(x.float(), (3 * x @ q + 1.0).float())  # linear CKA: invariant to rotation, scale and shift
    assert same.value() == pytest.approx(1.0, abs=1e-5)


def test_capture_matches_hf_hidden_states_and_stops_early(tok, model, items):
    batch = next(iter(items))
    caps = capture_views(model, batch)
    with torch.no_grad():
        hs = model(**batch.view("c"), output_hidden_states=True).hidden_states  # embed, layer 0, final norm
    for site, h in [("embed", hs[0]), ("layers.0.resid_post", hs[1]), ("final_norm", hs[-1])]:
        torch.testing.assert_close(caps["c"][site], batch.response_hidden(h, "c"))
    calls = []
    handle = model.model.layers[1].register_forward_hook(lambda *a: calls.append(1))
    try:
        got: dict = {}
        run_view(model, batch, "x", resolve_sites(model, [0]), got.__setitem__)
    finally:
        handle.remove()
    assert calls == [] and list(got) == ["layers.0.resid_post"]  # layer 1 never ran
    torch.testing.assert_close(got["layers.0.resid_post"], caps["x"]["layers.0.resid_post"])


def test_patching_the_last_layer_makes_the_no_context_view_agree(model, items):
    batch = next(iter(items))
    caps = capture_views(model, batch, ["layers.1.resid_post", "final_norm"])
    with patch_response(model, batch, "x", "layers.1.resid_post", caps["c"]["layers.1.resid_post"]):
        patched = capture_views(model, batch, ["final_norm"])["x"]["final_norm"]
    m = batch.response_mask
    torch.testing.assert_close(patched[m], caps["c"]["final_norm"][m])
    assert not torch.allclose(caps["x"]["final_norm"][m], caps["c"]["final_norm"][m], atol=1e-3)
    after = capture_views(model, batch, ["final_norm"])["x"]["final_norm"]  # the hook is gone
    torch.testing.assert_close(after, caps["x"]["final_norm"])


def test_compare_models_runs_every_model_on_the_same_batches(tok, model, items):
    other = tiny(tok, seed=1)
    res = compare_models({"a": model, "b": other}, iter(list(items)), layers=[0, "final_norm"])  # one-shot iterator
    assert [(r["model"], r["site"]) for r in res.rows] == [
        ("a", "layers.0.resid_post"),
        ("a", "final_norm"),
        ("b", "layers.0.resid_post"),
        ("b", "final_norm"),
    ]
    alone = two_view_cosine(other, items, layers=[0, "final_norm"])
    assert [r["cos_mean"] for r in res.rows[2:]] == pytest.approx([r["cos_mean"] for r in alone.rows], abs=1e-7)
    assert res.rows[0]["cos_mean"] != pytest.approx(res.rows[2]["cos_mean"], abs=1e-4)


def test_bad_input_names_the_problem(tok, model, items):
    with pytest.raises(ModelError, match="hidden_size"):
        compare_models({"a": model, "b": tiny(tok, hidden=48)}, items)
    with pytest.raises(ModelError, match="num_hidden_layers"):
        compare_models({"a": model, "b": tiny(tok, layers=3)}, items)
    shape = (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
    )
    llama = LlamaConfig(**{k: getattr(model.config, k) for k in shape})
    with pytest.raises(ModelError, match="model_type"):
        compare_models({"a": model, "b": AutoModelForCausalLM.from_config(llama)}, items)
    for bad in ([2], [-3], ["layers.7.resid_post"]):
        with pytest.raises(ConfigError, match="out of range"):
            two_view_cosine(model, items, layers=bad)
    with pytest.raises(ConfigError, match="not a site"):
        resolve_sites(model, ["attn"])
    assert resolve_sites(model, [-1, "embed", 0]) == ["embed", "layers.0.resid_post", "layers.1.resid_post"]


def test_sampled_responses_are_deterministic_per_seed(tok, task, model, items):
    again = make_batches(tok, task, 6, 0, 6, model)
    assert again.responses == items.responses and again.uids == items.uids
    assert make_batches(tok, task, 6, 1, 6, model).responses != items.responses


def test_run_similarity_writes_tables_and_reuses_its_responses(tmp_path, tok, model):
    for name, m in [("base", model), ("opd", tiny(tok, seed=5))]:
        m.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    dirs = {"base": str(tmp_path / "base"), "opd": str(tmp_path / "opd")}
    setup = ProbeSetup(task="rules", n=4, seed=0, batch_size=3, responses_from="opd", models=dirs)
    lines = run_similarity(setup, tmp_path / "sim", SimilarityOptions(cka=True), progress=False)
    out = tmp_path / "sim" / "similarity.csv"
    assert lines[0] == f"similarity table: {out}" and len(lines) > 1  # the table, then the summary's lines
    rows = list(csv.DictReader(out.open()))
    assert [(r["model"], r["site"]) for r in rows][:2] == [("base", "embed"), ("base", "layers.0.resid_post")]
    assert len(rows) == 2 * 4 and {"cos_mean", "cos_median", "cka", "depth", "layer", "n_tokens"} <= set(rows[0])
    examples = list(csv.DictReader((tmp_path / "sim" / "similarity_examples.csv").open()))
    assert len(examples) == 2 * 4 * 4
    settings = json.loads((tmp_path / "sim" / "similarity.json").read_text())
    assert settings["responses_from"] == "opd" and settings["sites"][-1] == "final_norm"
    run_similarity(
        setup.replace(responses_from=str(tmp_path / "sim" / "similarity_responses.jsonl"), batch_size=4),
        tmp_path / "sim2",
        SimilarityOptions(cka=True),
        progress=False,
    )
    rows2 = list(csv.DictReader((tmp_path / "sim2" / "similarity.csv").open()))
    assert [float(r["cos_mean"]) for r in rows2] == pytest.approx([float(r["cos_mean"]) for r in rows], abs=ATOL)
    with pytest.raises(ConfigError, match="not a model label"):
        run_similarity(setup.replace(responses_from="nca"), tmp_path / "bad", progress=False)
    with pytest.raises(ConfigError, match="out of range"):
        run_similarity(setup, tmp_path / "bad", SimilarityOptions(layers=[9]), progress=False)


def test_growing_buffer_keeps_every_value_in_order():
    buf = _Buffer(torch.float32, capacity=2)
    chunks = [torch.arange(k, dtype=torch.float32) + 10 * k for k in (1, 0, 3, 5, 2)]
    for c in chunks:
        buf.append(c)
    torch.testing.assert_close(buf.values(), torch.cat(chunks))
    assert buf.data.numel() >= 11 and buf.n == 11


def test_write_rows_formats(tmp_path):
    rows = [{"site": "embed", "layer": None, "cos_mean": float("nan")}, {"site": "final_norm", "cka": 0.5}]
    write_rows(rows, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())[0] == {"site": "embed", "layer": None, "cos_mean": None}
    write_rows(rows, tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_text().splitlines()[0] == "site,layer,cos_mean,cka"
    with pytest.raises(ConfigError, match=".csv or .json"):
        write_rows(rows, tmp_path / "r.txt")


def test_sampled_responses_do_not_depend_on_batch_size(organism_tokenizer, tiny_qwen3):
    from mechopd.config.sections import RolloutOptions
    from mechopd.core.views import RenderSpec
    from mechopd.probes.items import sample_responses
    from mechopd.tasks.base import get_task

    task = get_task("rules")
    ex = task.examples("test", 5, 0)
    kw = dict(rollout=RolloutOptions(max_new_tokens=6, temperature=1.0), seed=4)
    a = sample_responses(tiny_qwen3, organism_tokenizer, task, ex, RenderSpec("system"), batch_size=2, **kw)
    b = sample_responses(tiny_qwen3, organism_tokenizer, task, ex, RenderSpec("system"), batch_size=5, **kw)
    c = sample_responses(
        tiny_qwen3, organism_tokenizer, task, ex, RenderSpec("system"), batch_size=5, **{**kw, "seed": 5}
    )
    assert a == b and a != c
