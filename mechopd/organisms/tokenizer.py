"""The organisms' word-level tokenizer and chat template.

Built with the `tokenizers` library (WordLevel model; pre-tokenization: whitespace split, every punctuation character
isolated, every digit isolated) and wrapped in a `PreTrainedTokenizerFast` with a ChatML-style chat template, so that
the organism goes through exactly the code path of a real model: ``apply_chat_template`` with a system message for the
context, ``save_pretrained`` / ``AutoTokenizer.from_pretrained``. Newlines are kept as a token (``\\n``) so that board
rows stay visible to the model. Decoding joins words with single spaces.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from mechopd.tasks.words import NEWLINE, pre_tokenizer

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "<|im_end|>"
IM_START = "<|im_start|>"
ROLES = ("system", "user", "assistant")

CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def build_tokenizer(words: Iterable[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over `words` (sorted, deduplicated) plus specials, with the chat template."""
    specials = [PAD, UNK, BOS, EOS, IM_START]
    vocab_words = sorted({w for w in words if w and w not in specials} | set(ROLES))
    vocab = {w: i for i, w in enumerate(specials + [NEWLINE] + vocab_words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizer()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([AddedToken(NEWLINE, special=False, normalized=False)])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        additional_special_tokens=[IM_START],
        padding_side="left",  # a constructor argument, so that save_pretrained / from_pretrained keep it
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
