"""The two-view core: rendering per placement and template, alignment, invariances on a tiny model."""

from __future__ import annotations

import copy

import pytest
import torch

from mechopd.core.errors import TaskError
from mechopd.core.views import RenderSpec, build_two_view_batch, render_prompt_ids, render_prompt_text
from tests.conftest import LLAMA3_TEMPLATE, QWEN25_TEMPLATE, tiny_model

CTX = "rule : shift every digit by 2 ."
PROMPTS = ["apply the rule to : 3 1 4", "apply the rule to : 1 5 9 2 6", "apply the rule to : 7"]


def _resp(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def test_system_placement_renders_context_as_system_message(organism_tokenizer):
    spec = RenderSpec("system")
    x = render_prompt_text(organism_tokenizer, PROMPTS[0], None, spec)
    c = render_prompt_text(organism_tokenizer, PROMPTS[0], CTX, spec)
    assert "system" not in x and x.startswith("<|im_start|>user\n")
    assert c == f"<|im_start|>system\n{CTX}<|im_end|>\n" + x
    assert x.endswith("<|im_start|>assistant\n")


def test_user_placement_splices_context_into_user_turn(organism_tokenizer):
    spec = RenderSpec("user")
    c = render_prompt_text(organism_tokenizer, PROMPTS[0], CTX, spec)
    assert c == f"<|im_start|>user\n{CTX}\n\n{PROMPTS[0]}<|im_end|>\n<|im_start|>assistant\n"


def test_raw_text_without_chat_template(organism_tokenizer):
    tok = copy.deepcopy(organism_tokenizer)
    tok.chat_template = None
    spec = RenderSpec("system")
    assert render_prompt_text(tok, "q", None, spec) == "q\n"
    assert render_prompt_text(tok, "q", "c", spec) == "c\n\nq\n"


def test_default_system_prompt_is_refused_then_explicit(organism_tokenizer):
    tok = copy.deepcopy(organism_tokenizer)
    tok.chat_template = QWEN25_TEMPLATE
    with pytest.raises(TaskError, match="no_context_system"):
        render_prompt_text(tok, PROMPTS[0], None, RenderSpec("system"))
    spec = RenderSpec("system", no_context_system="")
    x = render_prompt_text(tok, PROMPTS[0], None, spec)
    c = render_prompt_text(tok, PROMPTS[0], CTX, spec)
    assert x.startswith("<|im_start|>system\n<|im_end|>")  # an explicit empty system message, not Qwen's default
    assert c.startswith(f"<|im_start|>system\n{CTX}<|im_end|>")
    assert "Qwen" not in x + c


def test_llama3_date_header_is_explicit_and_fixed(organism_tokenizer):
    tok = copy.deepcopy(organism_tokenizer)
    tok.chat_template = LLAMA3_TEMPLATE
    with pytest.raises(TaskError):
        render_prompt_text(tok, PROMPTS[0], None, RenderSpec("system"))
    spec = RenderSpec("system", no_context_system="", chat_template_kwargs={"date_string": "01 Jan 2025"})
    x = render_prompt_text(tok, PROMPTS[0], None, spec)
    c = render_prompt_text(tok, PROMPTS[0], CTX, spec)
    assert "Today Date : 01 Jan 2025" in x and "Today Date : 01 Jan 2025" in c
    assert CTX in c and CTX not in x
    assert x.startswith("<s>") and render_prompt_ids(tok, PROMPTS[0], None, spec).count(tok.bos_token_id) == 1


def test_nonempty_no_context_system_is_kept_in_both_views(organism_tokenizer):
    spec = RenderSpec("system", no_context_system="a helpful assistant")
    x = render_prompt_text(organism_tokenizer, PROMPTS[0], None, spec)
    c = render_prompt_text(organism_tokenizer, PROMPTS[0], CTX, spec)
    assert "a helpful assistant" in x and f"a helpful assistant\n\n{CTX}" in c


def _batch(tok, layout="left", prompts=PROMPTS):
    resps = [_resp(tok, t) for t in ["5 3 6", "3 7 1 4 8 extra", "9"]][: len(prompts)]
    return build_two_view_batch(tok, prompts, [CTX] * len(prompts), resps, RenderSpec("system"), layout=layout)


def test_alignment_columns_and_identical_responses(organism_tokenizer):
    b = _batch(organism_tokenizer)
    R = b.response_ids.shape[1]
    Px = b.input_ids_x.shape[1] - R
    Pc = b.input_ids_c.shape[1] - R
    assert torch.equal(b.cols_x, (Px + torch.arange(R)).expand_as(b.cols_x))
    assert torch.equal(b.cols_c, (Pc + torch.arange(R)).expand_as(b.cols_c))
    m = b.response_mask
    assert torch.equal(b.input_ids_x[:, Px:][m], b.response_ids[m])
    assert torch.equal(b.input_ids_c[:, Pc:][m], b.response_ids[m])
    # left padding: every row's prompt ends right before column P; position ids restart at 0 after the padding
    for _ids, mask, pos in ((b.input_ids_x, b.attention_mask_x, b.position_ids_x),):
        first = mask.argmax(-1)
        assert torch.all(pos[torch.arange(len(first)), first] == 0)


def _resp_logits(model, b, which):
    with torch.no_grad():
        out = model(**b.view(which))
    return b.response_logits(out.logits, which)


@pytest.mark.parametrize("which", ["x", "c"])
def test_batched_equals_one_by_one(organism_tokenizer, tiny_qwen3, which):
    tok = organism_tokenizer
    b = _batch(tok)
    full = _resp_logits(tiny_qwen3, b, which)
    for i, p in enumerate(PROMPTS):
        one = build_two_view_batch(
            tok, [p], [CTX], [b.response_ids[i][b.response_mask[i]].tolist()], RenderSpec("system")
        )
        r = int(b.response_mask[i].sum())
        torch.testing.assert_close(full[i, :r], _resp_logits(tiny_qwen3, one, which)[0, :r], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_left_and_right_padding_give_same_response_logits(organism_tokenizer, arch):
    model = tiny_model(organism_tokenizer, arch)
    left, right = _batch(organism_tokenizer, "left"), _batch(organism_tokenizer, "right")
    m = left.response_mask
    for which in ("x", "c"):
        torch.testing.assert_close(
            _resp_logits(model, left, which)[m], _resp_logits(model, right, which)[m], atol=1e-5, rtol=1e-4
        )


def test_too_long_context_names_both_lengths(organism_tokenizer):
    with pytest.raises(TaskError, match=r"context \+ prompt \(\d+ tokens\).*maximum length 10"):
        build_two_view_batch(organism_tokenizer, PROMPTS[:1], [CTX], [[5, 6]], RenderSpec("system"), max_length=10)


def test_placement_validated():
    from mechopd.core.errors import ConfigError

    with pytest.raises(ConfigError, match="placement"):
        RenderSpec("assistant")


def test_a_template_number_stays_a_number_and_a_flag_word_reads_as_a_boolean():
    """``max_turns: 1`` renders "1" (not "True"); the text ``0``/``false`` (a command line's flag) reads as False."""
    from mechopd.core.config_parse import parse_options, parse_overrides
    from mechopd.organisms.recipes import load_train_config

    spec = RenderSpec("user", None, {"max_turns": 1, "depth": 0, "a": "0", "b": "TRUE", "c": "false", "d": "no"})
    assert spec.chat_template_kwargs == {"max_turns": 1, "depth": 0, "a": False, "b": True, "c": False, "d": "no"}
    assert type(spec.chat_template_kwargs["max_turns"]) is int
    given = parse_options(["enable_thinking=0", "max_turns=3"], "--chat-template-kwarg")
    assert RenderSpec("user", None, given).chat_template_kwargs == {"enable_thinking": False, "max_turns": 3}
    assert parse_options(["k=0"], "--option") == {"k": 0}  # a task option stays a number
    cfg = load_train_config(overrides={"chat_template_kwargs": parse_overrides(["enable_thinking=0"])})
    assert RenderSpec("user", None, cfg.chat_template_kwargs).chat_template_kwargs == {"enable_thinking": False}
