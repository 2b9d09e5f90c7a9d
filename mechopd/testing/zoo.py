"""A fixture zoo: tiny models of the real architectures with real tokenizer mechanics, built offline, cached.

What a researcher brings is a Qwen3, Qwen2.5 or Llama-3 checkpoint with a byte-level BPE tokenizer and a chat template
that adds things of its own. No checkpoint can be downloaded here, so the zoo builds that path from parts:

* the model: transformers' own `Qwen3Config` / `Qwen2Config` / `LlamaConfig` (2 layers, hidden 32, random weights,
  vocabulary rows padded past the tokenizer as the real checkpoints are), written with ``save_pretrained``;
* the tokenizer: a byte-level BPE trained on the spot with `tokenizers` (ByteLevel pre-tokenizer and decoder) on the
  zoo's own MedMCQA-style data, with the family's special tokens (Qwen ``<|im_start|>``, ``<|im_end|>``,
  ``<|endoftext|>``, Qwen3 ``<think>`` / ``</think>``; Llama-3 ``<|begin_of_text|>``, ``<|start_header_id|>``,
  ``<|end_header_id|>``, ``<|eot_id|>``), wrapped in a `PreTrainedTokenizerFast`;
* the chat template, written here with the behaviour that matters for privileged context: Qwen2.5 inserts a default
  system prompt when none is given; Llama-3 always renders a system block with a date header (``date_string``, else
  today's date); Qwen3 renders ``<think>`` blocks and honours ``enable_thinking``;
* a teacher per family: same tokenizer, a different seed and a vocabulary padded to a different size (cross-model);
* a real-size head (`Zoo.padded`, Qwen2.5 only): Qwen2.5-0.5B-3B's 151936 rows over the zoo's small tokenizer, on a
  2-layer hidden-16 model (2.4M parameters), as the real checkpoints pad 151665 tokens to 151936 rows;
* data: a generated MedMCQA-layout JSONL (question, opa..opd, cop) and a shared context file of about 512 tokens.

`build_zoo()` builds everything once into a directory keyed by a content hash (this file's source plus the
transformers / tokenizers versions) under ``$MECHOPD_ZOO_CACHE`` or the system temp dir, and reuses it afterwards.
The build is atomic (a temporary directory renamed into place), so parallel test sessions never see half a zoo.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mechopd.testing.families import EXTRA_FAMILIES, TOKENIZER_SPECS, tiny_config

FAMILIES = ("qwen3", "qwen2", "llama")
ALL_FAMILIES = FAMILIES + EXTRA_FAMILIES  # the zoo also builds Mistral, Gemma-2/3, Phi-3, GPT-2, GPT-NeoX, OLMo-2
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
CONTEXT_TOKENS = 512  # target length of the shared context under the zoo's BPE
VOCAB = 640  # BPE merges stop here (a small vocabulary keeps the models tiny and the context long in tokens)
N_ITEMS = 60
PADDED_HEAD = {"qwen2": 151936}  # rows of the real checkpoints' heads (Qwen2.5-0.5B..3B), hidden 16 to stay light

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN3_SPECIALS = QWEN_SPECIALS + ["<think>", "</think>"]
LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
]

QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n" + QWEN_DEFAULT_SYSTEM + "<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{%- if not (m['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

QWEN3_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'assistant' and '</think>' in m['content'] %}"
    "{%- set content = m['content'].split('</think>')[-1].lstrip('\\n') %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message + '<|eot_id|>' }}"
    "{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class Family:
    """How one architecture family's tokenizer and model are made."""

    name: str
    config_class: str
    specials: tuple[str, ...]
    template: str
    bos: str | None
    eos: str
    pad: str | None  # None: the checkpoint ships without a pad token (Llama-3); mechopd falls back to eos
    tie: bool


FAMILY = {
    "qwen3": Family(
        "qwen3", "Qwen3Config", tuple(QWEN3_SPECIALS), QWEN3_TEMPLATE, None, "<|im_end|>", "<|endoftext|>", True
    ),
    "qwen2": Family(
        "qwen2", "Qwen2Config", tuple(QWEN_SPECIALS), QWEN25_TEMPLATE, None, "<|im_end|>", "<|endoftext|>", True
    ),
    "llama": Family(
        "llama", "LlamaConfig", tuple(LLAMA_SPECIALS), LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>", None, True
    ),
}


FAMILY.update({name: Family(name, "", *TOKENIZER_SPECS[name]) for name in EXTRA_FAMILIES})


@dataclass(frozen=True)
class Zoo:
    """Paths of one built zoo. ``student(f)`` / ``teacher(f)`` are save_pretrained directories (model + tokenizer)."""

    root: Path
    data: Path  # MedMCQA-layout JSONL
    context_file: Path  # shared context, about CONTEXT_TOKENS tokens

    def student(self, family: str) -> Path:
        return self.root / family / "student"

    def teacher(self, family: str) -> Path:
        return self.root / family / "teacher"

    def padded(self, family: str = "qwen2") -> Path:
        """The family's real-size head (``PADDED_HEAD`` rows) over the zoo's tokenizer; Qwen2.5 only."""
        if family not in PADDED_HEAD:
            raise KeyError(f"the zoo has a real-size head for {', '.join(PADDED_HEAD)} only")
        return self.root / family / "padded"

    def jsonl_options(self, **extra) -> dict:
        """``task_options`` of the zoo's JSONL task (short responses: the models are random)."""
        return {"path": str(self.data), "context_file": str(self.context_file), **extra}


# ----------------------------------------------------------------------------------------------------------- data
_DRUGS = [
    "arvelin",
    "bostrazine",
    "calumet",
    "dorvanide",
    "elquinol",
    "fentrazole",
    "gavimab",
    "hextorin",
    "isoprane",
    "jorvadil",
    "kelmisone",
    "lutrexin",
]
_CONDITIONS = [
    "migraine",
    "gout",
    "asthma",
    "angina",
    "eczema",
    "anaemia",
    "vertigo",
    "psoriasis",
    "sepsis",
    "glaucoma",
    "rickets",
    "tetanus",
]
_ROUTES = ["oral", "intravenous", "topical", "inhaled"]


def context_text(sentences: int) -> str:
    """The shared privileged context: a fictional formulary, one rule per sentence (deterministic)."""
    lines = ["Formulary of the Northgate clinic. Follow these rules when answering."]
    for i in range(sentences):
        d, c, r = _DRUGS[i % 12], _CONDITIONS[(i * 5) % 12], _ROUTES[i % 4]
        lines.append(
            f"Rule {i + 1}: for {c}, the first-line drug is {d}, given by the {r} route, "
            f"at {10 * (i % 7 + 1)} mg every {4 + i % 3 * 2} hours."
        )
    return "\n".join(lines)


def medmcqa_items(n: int = N_ITEMS, seed: int = 0) -> list[dict]:
    """`n` MedMCQA-layout items (question, opa..opd, cop 0-3) about the formulary."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        c = _CONDITIONS[i % 12]
        right = _DRUGS[(i * 7) % 12]
        wrong = rng.sample([d for d in _DRUGS if d != right], 3)
        opts = wrong[:]
        cop = rng.randrange(4)
        opts.insert(cop, right)
        items.append(
            {
                "question": f"Case {i}: which drug is first-line for {c} at the Northgate clinic?",
                "opa": opts[0],
                "opb": opts[1],
                "opc": opts[2],
                "opd": opts[3],
                "cop": cop,
            }
        )
    return items


def training_text(context: str, items: list[dict]) -> list[str]:
    """What the BPE is trained on: the context, the rendered items and the answer format."""
    lines = context.split("\n")
    for it in items:
        lines.append(it["question"])
        lines += [f"{k.upper()}. {it[f'op{k}']}" for k in "abcd"]
        lines.append(f"<answer>{'ABCD'[it['cop']]}</answer>")
    lines += [
        "[INST] [/INST] model: <start_of_turn> <end_of_turn> <|system|> <|user|> <|assistant|> <|end|>",
        "Think it through, then give the letter of the correct option inside <answer> and </answer>.",
        "system",
        "user",
        "assistant",
        QWEN_DEFAULT_SYSTEM,
        "Cutting Knowledge Date: December 2023",
        "Today Date: 26 Jul 2024",
        "[up] [down] [left] [right]",
        "0123456789 shift repeat reverse",
    ]
    return lines


# ------------------------------------------------------------------------------------------------------ tokenizer
def train_bpe(texts: list[str], specials: list[str], vocab_size: int = VOCAB, use_regex: bool = True):
    """A byte-level BPE `tokenizers.Tokenizer` trained on `texts` (specials first, ids 0..).

    use_regex=False: no GPT-2 pre-split, so merges may span word and whitespace boundaries (the alignment tests use it
    to build merges across the prompt/response boundary).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def wrap_tokenizer(tok, family: Family):
    """The HF tokenizer a checkpoint of `family` ships: special tokens named, chat template set."""
    from transformers import PreTrainedTokenizerFast

    kw = {"eos_token": family.eos, "bos_token": family.bos, "pad_token": family.pad}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, clean_up_tokenization_spaces=False, **{k: v for k, v in kw.items() if v is not None}
    )
    fast.add_special_tokens({"additional_special_tokens": [s for s in family.specials if s not in kw.values()]})
    fast.chat_template = family.template
    return fast


# ---------------------------------------------------------------------------------------------------------- models
def padded(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def tiny_model(family: Family, tokenizer, vocab_size: int, seed: int, hidden: int = 32, layers: int = 2):
    """A randomly initialised decoder of `family` (transformers' own config class), eval mode."""
    import torch
    import transformers

    ids = {
        name: tokenizer.convert_tokens_to_ids(tok)
        for name, tok in (("bos_token_id", family.bos), ("eos_token_id", family.eos), ("pad_token_id", family.pad))
        if tok
    }
    if family.name in EXTRA_FAMILIES:  # their own config classes and key names (`mechopd.testing.families`)
        extra = {"bos_token_id": None, "pad_token_id": None, **ids}
        torch.manual_seed(seed)
        cfg = tiny_config(family.name, vocab_size, hidden, layers, tie=family.tie, **extra)
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        model.generation_config.eos_token_id = ids["eos_token_id"]
        return model
    cls = getattr(transformers, family.config_class)
    cfg = cls(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=2048,
        tie_word_embeddings=family.tie,
        **ids,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = ids["eos_token_id"]
    return model


def _build_family(family: Family, texts: list[str], out: Path) -> None:
    tok = wrap_tokenizer(train_bpe(texts, list(family.specials)), family)
    n = len(tok)
    for role, vocab, seed in (("student", padded(n, 8) + 8, 0), ("teacher", padded(n, 64) + 64, 1)):
        model = tiny_model(family, tok, vocab, seed)
        model.save_pretrained(out / role)
        tok.save_pretrained(out / role)
    if family.name in PADDED_HEAD:
        tiny_model(family, tok, PADDED_HEAD[family.name], seed=2, hidden=16).save_pretrained(out / "padded")
        tok.save_pretrained(out / "padded")


def _context_for_target(items: list[dict]) -> tuple[str, int]:
    """A context whose length under the trained qwen3 BPE is close to CONTEXT_TOKENS (grown sentence by sentence)."""
    fam = FAMILY["qwen3"]
    probe = train_bpe(training_text(context_text(40), items), list(fam.specials))
    per_sentence = len(probe.encode(context_text(40)).ids) / 41
    sentences = max(4, round(CONTEXT_TOKENS / per_sentence) - 1)
    ctx = context_text(sentences)
    return ctx, len(probe.encode(ctx).ids)


# ------------------------------------------------------------------------------------------------------------ zoo
def zoo_key() -> str:
    """Content hash of what the zoo is built from: this file and the library versions that build it."""
    import tokenizers
    import transformers

    h = hashlib.sha1(Path(__file__).read_bytes())
    h.update(Path(__file__).with_name("families.py").read_bytes())
    h.update(f"{transformers.__version__}|{tokenizers.__version__}".encode())
    return h.hexdigest()[:16]


def zoo_root() -> Path:
    base = os.environ.get("MECHOPD_ZOO_CACHE") or os.path.join(tempfile.gettempdir(), "mechopd-zoo")
    return Path(base) / zoo_key()


def build_zoo(root: str | os.PathLike | None = None) -> Zoo:
    """Build (or reuse) the zoo at `root` (default `zoo_root()`); returns its paths."""
    root = Path(root) if root is not None else zoo_root()
    zoo = Zoo(root, root / "data" / "medmcqa.jsonl", root / "data" / "context.txt")
    if (root / "DONE").exists():
        return zoo
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".zoo-", dir=root.parent))
    try:
        items = medmcqa_items()
        ctx, n_ctx = _context_for_target(items)
        (tmp / "data").mkdir()
        (tmp / "data" / "medmcqa.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
        (tmp / "data" / "context.txt").write_text(ctx + "\n")
        texts = training_text(ctx, items)
        for name in ALL_FAMILIES:
            _build_family(FAMILY[name], texts, tmp / name)
        (tmp / "zoo.json").write_text(
            json.dumps(
                {"key": zoo_key(), "families": list(ALL_FAMILIES), "context_tokens_qwen3_probe": n_ctx}, indent=1
            )
        )
        (tmp / "DONE").write_text("ok\n")
        try:
            os.rename(tmp, root)
        except OSError:  # another session finished first: theirs is identical
            if not (root / "DONE").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return zoo
