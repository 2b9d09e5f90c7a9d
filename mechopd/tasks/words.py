"""The word split shared by the tasks and the organisms' tokenizer.

The tasks build their vocabularies with it (`split_words`), and `organisms.tokenizer` pre-tokenizes with the same
`pre_tokenizer`, so a task's word list is exactly what the organism's tokenizer will see. It lives here, below both, so
that `tasks` does not import `organisms` (which imports `tasks` to pretrain).
"""

from __future__ import annotations

from tokenizers import pre_tokenizers

NEWLINE = "\n"  # kept as a token by the organisms' tokenizer, so it separates words here


def pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Whitespace split, every punctuation character isolated, every digit isolated."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Punctuation(behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )


def split_words(text: str) -> list[str]:
    """The words the organism tokenizer will see in `text` (for building and checking vocabularies)."""
    out: list[str] = []
    for chunk in text.split(NEWLINE):
        out.extend(w for w, _ in pre_tokenizer().pre_tokenize_str(chunk))
    return out
