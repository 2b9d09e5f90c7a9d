"""The shared-prefix path (generate/prefix.py) equals the unshared path in float32 within 1e-5, in each use:
scores and per-parameter gradients (teacher and student context view), the trainer's losses and gradients, greedy
ids of generation (lean and hf decoders), evaluation's records, and the probes' per-layer hidden states; on the
organism's word-level tokenizer and a byte-level BPE one, Qwen3 and Llama, contexts of different lengths. Rows whose
prefix differs fall back to the unshared path.
"""

from __future__ import annotations

import pytest
import torch

from mechopd.core.views import RenderSpec, build_two_view_batch, render_prompt_ids
from mechopd.generate.prefix import MIN_PREFIX_TOKENS, PrefixStore, view_inputs, view_prefix_len
from mechopd.generate.sampler import sample
from mechopd.generate.scorer import score_views
from mechopd.generate.settings import SamplingSettings, stop_ids
from tests.conftest import tiny_model

ATOL = 1e-5
WORDS = (
    "rule shift every digit by reverse the items repeat times apply to : . , and then a list of "
    "numbers guideline you must answer with one word only context question what is next"
).split()
SHORT = "rule : shift every digit by 2 ."
LONG = " ".join([SHORT, "then reverse the items .", "apply the rule to every item ,", "answer with one word ."] * 4)


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE tokenizer trained here (offline) with a Qwen-style chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) + " 0 1 2 3 4 5 6 7 8 9" for i in range(len(WORDS))]
    tk.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = (
        "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
        "'<|im_end|>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}"
        "{{ '<|im_start|>assistant\n' }}{%- endif -%}"
    )
    return tok


def _tokenizer(request, name):
    return request.getfixturevalue("organism_tokenizer" if name == "organism" else "bpe_tokenizer")


def _batch(tok, context, n=4, contexts=None):
    prompts = [f"apply the rule to : {' '.join(str((3 * i + j) % 10) for j in range(2 + i))}" for i in range(n)]
    responses = [
        tok(" ".join(str(j) for j in range(1 + (i % 3) * 2)), add_special_tokens=False)["input_ids"]
        + [tok.eos_token_id]
        for i in range(n)
    ]
    return build_two_view_batch(tok, prompts, contexts or [context] * n, responses, RenderSpec("system"))


def _scores_and_grads(model, batch, mode):
    model.zero_grad(set_to_none=True)
    info: dict = {}
    lp = score_views(model, batch, ("c",), temperature=0.7, shared_prefix=mode, info=info)["c"]
    m = batch.response_mask
    loss = -(lp.exp() * lp).sum(-1)[m].mean() + lp.gather(-1, batch.response_ids[..., None]).squeeze(-1)[m].mean()
    loss.backward()
    return lp.detach(), float(loss.detach()), {k: p.grad.clone() for k, p in model.named_parameters()}, info["c"]


@pytest.mark.parametrize("tok_name", ["organism", "bpe"])
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("context", [SHORT, LONG])
def test_student_context_view_scores_and_gradients(request, tok_name, arch, context):
    tok = _tokenizer(request, tok_name)
    model = tiny_model(tok, arch, seed=1).train()
    batch = _batch(tok, context)
    lp0, loss0, g0, n0 = _scores_and_grads(model, batch, "off")
    lp1, loss1, g1, n1 = _scores_and_grads(model, batch, "auto")
    assert n0 == 0 and n1 >= MIN_PREFIX_TOKENS  # the shared path really ran
    m = batch.response_mask
    torch.testing.assert_close(lp1[m], lp0[m], atol=ATOL, rtol=0)
    assert abs(loss1 - loss0) < ATOL
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], atol=ATOL, rtol=0, msg=k)
    assert max(float(g.abs().max()) for g in g0.values()) > 1e-3  # the gradients are not trivially zero


def test_prefix_length_grows_with_the_context(organism_tokenizer):
    short, long = _batch(organism_tokenizer, SHORT), _batch(organism_tokenizer, LONG)
    assert view_prefix_len(long, "c") - view_prefix_len(short, "c") == len(organism_tokenizer(LONG)["input_ids"]) - len(
        organism_tokenizer(SHORT)["input_ids"]
    )


def test_mixed_contexts_fall_back_and_partial_prefixes_stay_exact(organism_tokenizer, tiny_qwen3):
    tok = organism_tokenizer
    mixed = _batch(tok, None, contexts=[SHORT, "rule : reverse the items .", SHORT, LONG])
    _, extra, n = view_inputs(tiny_qwen3, mixed, "c", mode="auto")
    assert n == 0 and extra == {}  # only the chat header is common: the unshared forward runs
    late = _batch(tok, None, contexts=[LONG + " then a list .", LONG + " answer .", LONG, LONG + " and then"])
    info: dict = {}
    a = score_views(tiny_qwen3, late, ("c",), temperature=1.0, shared_prefix="off", grad=False)["c"]
    b = score_views(tiny_qwen3, late, ("c",), temperature=1.0, shared_prefix="auto", grad=False, info=info)["c"]
    assert info["c"] >= MIN_PREFIX_TOKENS  # the common part of the contexts is shared, the rest is per row
    torch.testing.assert_close(b[late.response_mask], a[late.response_mask], atol=ATOL, rtol=0)
    right = build_two_view_batch(
        tok, ["apply the rule to : 1 2"] * 3, [LONG] * 3, [[5, 6]] * 3, RenderSpec("system"), layout="right"
    )
    assert view_prefix_len(right, "c") == 0


def test_teacher_store_reuses_and_sees_weight_changes(organism_tokenizer):
    model = tiny_model(organism_tokenizer, seed=2)
    batch = _batch(organism_tokenizer, LONG)
    store = PrefixStore()
    ref = score_views(model, batch, ("c",), temperature=1.0, shared_prefix="off", grad=False)["c"]
    a = score_views(model, batch, ("c",), temperature=1.0, grad=False, store=store)["c"]
    b = score_views(model, batch, ("c",), temperature=1.0, grad=False, store=store)["c"]
    assert store.hits == 1 and torch.equal(a, b)
    torch.testing.assert_close(a[batch.response_mask], ref[batch.response_mask], atol=ATOL, rtol=0)
    with torch.no_grad():
        model.model.layers[0].self_attn.v_proj.weight.mul_(1.5)  # in place: the stored K/V are stale
    c = score_views(model, batch, ("c",), temperature=1.0, grad=False, store=store)["c"]
    ref2 = score_views(model, batch, ("c",), temperature=1.0, shared_prefix="off", grad=False)["c"]
    assert store.hits == 1
    torch.testing.assert_close(c[batch.response_mask], ref2[batch.response_mask], atol=ATOL, rtol=0)
    assert not torch.allclose(ref2, ref, atol=1e-3)


@pytest.mark.parametrize("tok_name", ["organism", "bpe"])
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_with_context_generation_same_greedy_ids_and_prefill_logits(request, tok_name, arch):
    from mechopd.core.views import left_pad
    from mechopd.generate.lean import LeanDecoder
    from mechopd.generate.prefix import expanded_cache, prefix_kv

    tok = _tokenizer(request, tok_name)
    model = tiny_model(tok, arch, seed=3)
    ids = [
        render_prompt_ids(tok, f"apply the rule to : {' '.join('1234567'[: 2 + i])}", ctx, RenderSpec("system"))
        for i, ctx in enumerate([LONG, LONG, LONG, LONG, LONG])
    ]
    for decoder in ("lean", "hf"):
        st = SamplingSettings(
            max_new_tokens=10, stop=stop_ids(tok, model), pad_id=tok.pad_token_id, greedy=True, engine=decoder
        )
        off, auto = sample(model, ids, st.replace(shared_prefix="off")), sample(model, ids, st)
        assert off.shared_prefix == 0 and auto.shared_prefix >= MIN_PREFIX_TOKENS
        assert auto.responses == off.responses
    with torch.inference_mode():  # the prefill's logits themselves, shared vs full
        x, m = left_pad(ids, tok.pad_token_id)
        full = LeanDecoder(model).prefill(x, m, (m.cumsum(-1) - 1).clamp(min=0), 4)
        n = auto.shared_prefix
        s, sm = left_pad([p[n:] for p in ids], tok.pad_token_id)
        cache = expanded_cache(model, prefix_kv(model, torch.tensor([ids[0][:n]])), len(ids))
        shared = LeanDecoder(model).prefill(
            s, torch.cat([sm.new_ones(len(ids), n), sm], 1), n + (sm.cumsum(-1) - 1).clamp(min=0), 4, cache=cache
        )
    torch.testing.assert_close(shared, full, atol=ATOL, rtol=0)


def test_probe_hidden_states_per_layer(organism_tokenizer):
    from mechopd.probes.capture import all_sites, run_view

    for arch in ("qwen3", "llama"):
        model = tiny_model(organism_tokenizer, arch, layers=3, seed=4)
        batch = _batch(organism_tokenizer, LONG, n=5)
        got = {}
        for mode in ("off", "auto"):
            store: dict = {}
            run_view(model, batch, "c", all_sites(model), store.__setitem__, shared_prefix=mode)
            got[mode] = store
        assert list(got["auto"]) == all_sites(model)
        m = batch.response_mask
        for site in got["off"]:
            torch.testing.assert_close(got["auto"][site][m], got["off"][site][m], atol=ATOL, rtol=0, msg=site)


def test_trainer_losses_and_gradients(tiny_rules_organism, tmp_path):
    """One NCA step (teacher + student context view shared) equals the unshared step: losses and every gradient."""
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import Trainer

    out = {}
    for mode in ("off", "auto"):
        cfg = TrainConfig(
            student=str(tiny_rules_organism),
            steps=1,
            batch_size=6,
            max_new_tokens=6,
            pool_size=16,
            method="nca",
            beta=0.5,
            estimator="full",
            lr=1e-3,
            shared_prefix=mode,
        )
        tr = Trainer(cfg, tmp_path / mode, progress=False)
        rec = tr.train_step()
        out[mode] = rec, {k: p.grad.clone() for k, p in tr.student.named_parameters()}
    (r0, g0), (r1, g1) = out["off"], out["auto"]
    assert r0["shared_prefix"] == 0 and r1["shared_prefix"] >= MIN_PREFIX_TOKENS
    assert r0["prefix/shared_rows"] == 0 and r1["prefix/shared_rows"] == 6  # metrics.jsonl: rows that ran shared
    for key in ("loss", "loss/opd", "loss/nca", "kl/teacher_student"):
        assert abs(r1[key] - r0[key]) < ATOL, key
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], atol=ATOL, rtol=0, msg=k)


def test_evaluation_with_context_same_records(tiny_rules_organism):
    from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
    from mechopd.models import load_model, load_tokenizer
    from mechopd.tasks.base import get_task

    m, tok = load_model(tiny_rules_organism), load_tokenizer(tiny_rules_organism)
    task = get_task("rules")
    a = evaluate_model(m, tok, task, EvalConfig(n=8, seed=0, n_boot=0, shared_prefix="off"))
    b = evaluate_model(m, tok, task, EvalConfig(n=8, seed=0, n_boot=0, shared_prefix="auto"))
    assert a["records"] == b["records"] and b["settings"]["shared_prefix"] == "auto"


# -- prefix groups (generate/groups.py): a batch that mixes contexts shares each context block once ---------------------
OWN = ["rule : reverse the items . then answer with one word only .", "guideline : repeat every digit two times ."]


def test_group_prompts_is_a_partition_that_finds_each_block(organism_tokenizer):
    from mechopd.generate.groups import group_prompts
    from mechopd.generate.prefix import common_prefix_len

    tok = organism_tokenizer
    spec = RenderSpec("system")
    qs = [f"apply the rule to : {' '.join('1234567'[: 2 + i % 4])}" for i in range(8)]
    uniform = [render_prompt_ids(tok, q, LONG, spec) for q in qs]
    assert [(g.rows, g.length) for g in group_prompts(uniform)] == [(tuple(range(8)), common_prefix_len(uniform))]
    mixed = [render_prompt_ids(tok, q, c, spec) for q, c in zip(qs, [LONG] * 3 + [OWN[0]] + [LONG] * 3 + [OWN[1]])]
    groups = group_prompts(mixed)
    assert sorted(r for g in groups for r in g.rows) == list(range(8))
    shared = [g for g in groups if g.length]
    assert [g.rows for g in shared] == [(0, 1, 2, 4, 5, 6)] and [g.rows for g in groups if not g.length] == [(3, 7)]
    long_block = len(render_prompt_ids(tok, "", LONG, spec)) - len(render_prompt_ids(tok, "", SHORT, spec))
    assert shared[0].length > long_block  # the whole context block, not only the chat header


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_prefix_groups_scores_and_gradients_equal_unshared(organism_tokenizer, arch):
    tok = organism_tokenizer
    model = tiny_model(tok, arch, seed=1).train()
    batch = _batch(tok, None, n=7, contexts=[LONG, LONG, OWN[0], LONG, LONG, OWN[1], LONG])
    lp0, loss0, g0, n0 = _scores_and_grads(model, batch, "off")
    model.zero_grad(set_to_none=True)
    info: dict = {}
    lp1 = score_views(model, batch, ("c",), temperature=0.7, shared_prefix="auto", info=info)["c"]
    m = batch.response_mask
    loss1 = -(lp1.exp() * lp1).sum(-1)[m].mean() + lp1.gather(-1, batch.response_ids[..., None]).squeeze(-1)[m].mean()
    loss1.backward()
    assert n0 == 0 and info["c:rows"] == 5 and info["c"] > view_prefix_len(batch, "c") + MIN_PREFIX_TOKENS
    torch.testing.assert_close(lp1.detach()[m], lp0[m], atol=ATOL, rtol=0)
    assert abs(float(loss1.detach()) - loss0) < ATOL
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, g0[k], atol=ATOL, rtol=0, msg=k)


def test_prefix_groups_in_sampling_equal_unshared_and_batch_size_invariant(organism_tokenizer):
    from mechopd.generate.sampler import sample_rows

    tok = organism_tokenizer
    model = tiny_model(tok, "qwen3", seed=3)
    ctxs = [LONG, OWN[0], LONG, LONG, OWN[1], LONG]
    ids = [
        render_prompt_ids(tok, f"apply the rule to : {' '.join('1234567'[: 2 + i])}", c, RenderSpec("system"))
        for i, c in enumerate(ctxs)
    ]
    st = SamplingSettings(max_new_tokens=6, stop=stop_ids(tok, model), pad_id=tok.pad_token_id, temperature=1.0)
    off = sample_rows(model, ids, list(range(6)), st.replace(shared_prefix="off"))
    for size in (1, 4, 6):
        paths: list[int] = []
        assert sample_rows(model, ids, list(range(6)), st.replace(batch_size=size), paths=paths) == off
        assert max(paths) > MIN_PREFIX_TOKENS and min(paths) == 0  # the LONG group shared, the others not
    greedy = st.replace(greedy=True)
    assert sample_rows(model, ids, None, greedy) == sample_rows(model, ids, None, greedy.replace(shared_prefix="off"))


def test_group_prompts_charged_decode_steps_merges_small_groups():
    """A header of 25 tokens shared by all rows, then first words shared by pairs (12 more tokens): charged the forward
    only, the pairs split into groups (saving 12 positions each beats 32 per call); charged their decode steps too
    (`sample_rows(charge_decode=True)`, the evaluation), one group at the header (issue 58)."""
    from mechopd.generate.groups import GROUP_COST, group_prompts

    header = list(range(100, 125))
    prompts = [header + [200 + i // 2] * 100 + [300 + i] for i in range(8)]  # pairs share 125 tokens, all 25
    split = group_prompts(prompts)  # 4 x 125 - 3 x 32 saved beats 7 x 25
    assert [(g.rows, g.length) for g in split] == [((2 * k, 2 * k + 1), 125) for k in range(4)]
    merged = group_prompts(prompts, decode_steps=24)  # 3 x 32 x 25 more to pay: the header alone wins
    assert [(g.rows, g.length) for g in merged] == [(tuple(range(8)), 25)] and GROUP_COST == 32


def test_sampling_charged_decode_steps_same_ids(organism_tokenizer):
    """Fewer groups (`charge_decode`) sample the same ids: greedy and seeded (exact like the groups themselves)."""
    from mechopd.generate.groups import group_prompts
    from mechopd.generate.sampler import sample_rows

    tok = organism_tokenizer
    model = tiny_model(tok, "qwen3", seed=5)
    header = render_prompt_ids(tok, "apply the rule to :", None, RenderSpec("system"))  # the chat header, a question
    words = [tok.convert_tokens_to_ids(w) for w in ("rule", "shift", "reverse", "list")]
    ids = [header + [words[i // 2]] * 60 + [words[(i + 1) % 4]] for i in range(8)]  # pairs share 60 more tokens
    assert len(group_prompts(ids, 6)) < len(group_prompts(ids))  # the charge changes the plan under test
    st = SamplingSettings(max_new_tokens=6, stop=stop_ids(tok, model), pad_id=tok.pad_token_id, temperature=1.0)
    for s in (st, st.replace(greedy=True)):
        seeds = None if s.greedy else list(range(8))
        base = sample_rows(model, ids, seeds, s)
        assert sample_rows(model, ids, seeds, s, charge_decode=True) == base
        assert sample_rows(model, ids, seeds, s.replace(shared_prefix="off")) == base


def test_prefix_groups_in_the_probe_capture_equal_unshared(organism_tokenizer):
    from mechopd.generate.groups import view_groups
    from mechopd.probes.capture import all_sites, run_view

    model = tiny_model(organism_tokenizer, "llama", layers=3, seed=4)
    batch = _batch(organism_tokenizer, None, n=6, contexts=[LONG, OWN[0], LONG, LONG, OWN[1], LONG])
    assert view_groups(batch, "c", "auto") is not None  # the grouped path is the one under test
    got = {}
    for mode in ("off", "auto"):
        store: dict = {}
        run_view(model, batch, "c", all_sites(model), store.__setitem__, shared_prefix=mode)
        got[mode] = store
    m = batch.response_mask
    for site in got["off"]:
        torch.testing.assert_close(got["auto"][site][m], got["off"][site][m], atol=ATOL, rtol=0, msg=site)
