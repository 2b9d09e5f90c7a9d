"""The fixture zoo has the mechanics of the real checkpoints: architecture classes, byte-level BPE, the family's special
tokens, the chat-template behaviour that matters for privileged context, padded vocabularies, a ~512-token context."""

from __future__ import annotations

import json

import pytest

from mechopd.models import load_model, load_tokenizer
from mechopd.testing.zoo import FAMILIES, QWEN_DEFAULT_SYSTEM, build_zoo, zoo_key

ARCH = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
SPECIALS = {
    "qwen3": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"],
    "qwen2": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
    "llama": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
}
USER = [{"role": "user", "content": "Which drug?"}]


@pytest.mark.parametrize("family", FAMILIES)
def test_architecture_tokenizer_and_padded_vocabularies(zoo, family):
    tok = load_tokenizer(zoo.student(family))
    student, teacher = load_model(zoo.student(family)), load_model(zoo.teacher(family))
    assert type(student).__name__ == ARCH[family] == type(teacher).__name__
    assert student.config.num_hidden_layers == 2 and student.config.hidden_size == 32
    # vocabulary rows padded past the tokenizer, to different sizes (as Qwen2.5-3B 151936 vs 7B 152064)
    assert len(tok) < student.config.vocab_size < teacher.config.vocab_size
    assert json.loads((zoo.student(family) / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    text = "Fièvre 39.5°C — naïve ✓ 日本\n\ttabs"  # bytes never seen in training: byte-level, no <unk>
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and tok.unk_token_id not in ids
    for s in SPECIALS[family]:
        assert len(tok(s, add_special_tokens=False)["input_ids"]) == 1, s  # one id each, never split


def test_qwen25_inserts_a_default_system_prompt(zoo):
    tok = load_tokenizer(zoo.student("qwen2"))
    text = tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert text.startswith(f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>")
    explicit = tok.apply_chat_template([{"role": "system", "content": ""}] + USER, tokenize=False)
    assert QWEN_DEFAULT_SYSTEM not in explicit


def test_llama3_date_header_follows_date_string(zoo):
    tok = load_tokenizer(zoo.student("llama"))
    a = tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True, date_string="26 Jul 2024")
    b = tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True, date_string="01 Jan 2025")
    assert a.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date")
    assert "Today Date: 26 Jul 2024" in a and "Today Date: 01 Jan 2025" in b
    assert a.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_qwen3_thinking_blocks(zoo):
    tok = load_tokenizer(zoo.student("qwen3"))
    plain = tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    off = tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert "system" not in plain and plain.endswith("<|im_start|>assistant\n")
    assert off == plain + "<think>\n\n</think>\n\n"
    hist = tok.apply_chat_template(
        USER + [{"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA"}], tokenize=False
    )
    assert "hmm" not in hist and "<think>\n\n</think>\n\nA<|im_end|>" in hist  # past reasoning is dropped


def test_context_is_about_512_tokens_and_the_data_is_medmcqa(zoo):
    for family in FAMILIES:
        tok = load_tokenizer(zoo.student(family))
        n = len(tok(zoo.context_file.read_text(), add_special_tokens=False)["input_ids"])
        assert 400 <= n <= 700, (family, n)
    items = [json.loads(line) for line in zoo.data.read_text().splitlines()]
    assert len(items) >= 40 and all({"question", "opa", "opb", "opc", "opd", "cop"} <= set(it) for it in items)
    assert {it["cop"] for it in items} == {0, 1, 2, 3}


def test_zoo_is_cached_by_content_hash(zoo, tmp_path):
    assert zoo.root.name == zoo_key() and (zoo.root / "DONE").exists()
    stamp = (zoo.student("qwen3") / "config.json").stat().st_mtime_ns
    assert build_zoo().student("qwen3") == zoo.student("qwen3")  # reused, not rebuilt
    assert (zoo.student("qwen3") / "config.json").stat().st_mtime_ns == stamp
