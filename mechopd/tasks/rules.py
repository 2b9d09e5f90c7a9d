"""The rules organism: system-prompt QA where the context states a rule over a list of digits.

x = "apply the rule to : 3 1 4"; c = "rule : shift every digit by 2 ." (one rule from a family); y = the rule applied.
The base organism follows whichever rule its context states and copies the input (identity) without context; the
distillation target is ONE fixed context (``rule=``). Rules:
  * ``shift:k``  every digit d -> (d + k) mod 10     (length kept)
  * ``repeat:k`` every item repeated k times        (length x k: makes length inflation measurable)
  * ``reverse``  the items in reverse order
A student self-distilled on one rule that keeps its "apply the context's rule on top of what I would do" circuit
applies the rule twice when the context comes back (shift 2k, repeat k^2): context-induced degradation (Regime A).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from dataclasses import dataclass

from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.options import PLACEMENTS, UNIT, Range, option
from mechopd.tasks.base import BaseTask, Corpus, Example, OtherContext, TaskOptions, register_task
from mechopd.tasks.words import split_words

FAMILY = ["shift:1", "shift:2", "shift:3", "shift:4", "shift:5", "repeat:2", "repeat:3", "reverse"]
PROMPT = "apply the rule to : {items}"


def parse_rule(spec: str) -> tuple[str, int]:
    kind, _, arg = spec.partition(":")
    if kind == "reverse" and not arg:
        return kind, 0
    if kind in ("shift", "repeat") and arg.isascii() and arg.isdigit() and int(arg) >= 1:  # not '²': isdigit() only
        return kind, int(arg)
    raise ConfigError(f"rule {spec!r} is not valid; use shift:K, repeat:K (K >= 1) or reverse, e.g. {FAMILY}")


def apply_rule(spec: str, digits: list[int]) -> list[int]:
    kind, k = parse_rule(spec)
    if kind == "shift":
        return [(d + k) % 10 for d in digits]
    if kind == "repeat":
        return [d for d in digits for _ in range(k)]
    return digits[::-1]


def rule_text(spec: str) -> str:
    kind, k = parse_rule(spec)
    if kind == "shift":
        return f"rule : shift every digit by {k} ."
    if kind == "repeat":
        return f"rule : repeat every item {k} times ."
    return "rule : reverse the items ."


def _fmt(digits: list[int]) -> str:
    return " ".join(str(d) for d in digits)


def item_hash(digits: list[int]) -> str:
    return hashlib.sha1(("rules|" + _fmt(digits)).encode()).hexdigest()[:16]


def uid_split(uid: str) -> str:
    """Stable split by hash bucket of an item's uid (`item_hash`): 1 in 10 digit lists is held out."""
    return "test" if int(uid, 16) % 10 == 0 else "train"


def item_split(digits: list[int]) -> str:
    return uid_split(item_hash(digits))


def _expected_items(min_len: int, max_len: int, split: str) -> int:
    total = sum(10**k for k in range(min_len, max_len + 1))
    return total // 10 if split == "test" else total - total // 10


def _count_items(min_len: int, max_len: int, split: str) -> int | None:
    total = sum(10**k for k in range(min_len, max_len + 1))
    test = _count_test(min_len, max_len) if total <= 2_000_000 else None
    return None if test is None else test if split == "test" else total - test


@functools.cache
def _count_test(min_len: int, max_len: int) -> int:
    return sum(
        item_split(list(d)) == "test"
        for k in range(min_len, max_len + 1)
        for d in itertools.product(range(10), repeat=k)
    )


LENGTHS = Range(1, 64)  # digits per item


@dataclass(frozen=True)
class RulesOptions(TaskOptions):
    """``--task rules`` options (``--option KEY=VALUE``, a study's ``task_options:``)."""

    rule: str = option("shift:1", "the distilled rule: shift:K, repeat:K (K >= 1) or reverse")
    min_len: int = option(3, "fewest digits in an item", range=LENGTHS)
    max_len: int = option(6, "most digits in an item", range=LENGTHS)
    family: tuple[str, ...] = option(
        tuple(FAMILY), "the rules the organism learns to follow (pretraining) and the other contexts, as a list"
    )
    context_prob: float = option(0.75, "pretraining: the share of samples that carry a context", range=UNIT)
    placement: str = option("system", "where the rule goes: the system message or the user turn", choices=PLACEMENTS)

    def check(self) -> None:
        parse_rule(self.rule)
        if not isinstance(self.family, (tuple, list)) or not self.family:
            raise ConfigError(f"family={self.family!r} must be a non-empty list of rules, e.g. {FAMILY}")
        for r in self.family:
            if not isinstance(r, str):
                raise ConfigError(f"family entry {r!r} is not text; use rules such as {FAMILY}")
            parse_rule(r)
        if not self.min_len <= self.max_len:
            raise ConfigError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")


class RulesTask(BaseTask):
    """The system-prompt QA organism (see module docstring); `parse_answer` is `BaseTask`'s (the stripped reply)."""

    name = "rules"
    is_game = False
    temperature = 1.0

    def __init__(self, o: RulesOptions) -> None:
        self.rule, self.min_len, self.max_len = o.rule, o.min_len, o.max_len
        self.family: tuple[str, ...] = tuple(o.family)
        self.context_prob = o.context_prob
        self.placement = o.placement

    @property
    def context(self) -> str:
        return rule_text(self.rule)

    @property  # BaseTask's is a plain attribute; here it follows from the rules (read only, as Task declares it)
    def max_new_tokens(self) -> int:  # type: ignore[override]
        longest = max(len(apply_rule(r, [0] * self.max_len)) for r in (*self.family, self.rule))
        return 2 * longest + 2  # room to show a doubled rule application (Regime A), plus the end token

    def _digits(self, rng: random.Random, split: str) -> list[int]:
        while True:
            d = [rng.randrange(10) for _ in range(rng.randint(self.min_len, self.max_len))]
            if item_split(d) == split:
                return d

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        if split not in ("train", "test"):
            raise TaskError(f"split must be 'train' or 'test', got {split!r}")
        if n < 1:
            raise TaskError(f"the evaluation set is empty (n={n}); pass --n 1 or more")
        size = self.max_items(split, n)
        if size is not None and n > size:
            raise TaskError(
                f"task 'rules' has only {size} {split} items (digit lists of length {self.min_len}.."
                f"{self.max_len}, 1 in 10 held out), asked for {n}; ask for at most {size} (eval/probe "
                "--n, train pool_size / eval_n) or widen the space (--option max_len=...)"
            )
        rng = random.Random(f"rules|{split}|{seed}")
        seen: dict[str, Example] = {}
        while len(seen) < n:
            d = self._digits(rng, split)
            uid = item_hash(d)
            if uid not in seen:
                seen[uid] = Example(
                    uid=uid,
                    prompt=PROMPT.format(items=_fmt(d)),
                    context=self.context,
                    answer=_fmt(apply_rule(self.rule, d)),
                    meta={"digits": d, "rule": self.rule},
                )
        return list(seen.values())

    def score(self, example: Example, response_text: str) -> bool:
        return response_text.split() == str(example.answer).split()

    def max_items(self, split: str, need: int = 0) -> int | None:
        """Digit lists of length min_len..max_len in `split`, counted exactly by hash (a few seconds, once per process)
        when `need` exceeds half the expected count; None below that, or beyond 2·10^6 lists."""
        if need <= _expected_items(self.min_len, self.max_len, split) // 2:
            return None
        return _count_items(self.min_len, self.max_len, split)

    def split_of(self, example: Example) -> str:
        return uid_split(example.uid)

    def other_contexts(self, example: Example) -> list[OtherContext]:
        """The family's other rules, labelled by rule (``shift:2``, ``reverse``), each with its output on the item's
        digits and the COMPOSED output (the distilled rule, then the other: what a student that applies its
        internalised rule and then reads the context would say); a rule whose output on this item equals the
        distilled rule's is left out (it would not tell following from sticking)."""
        digits = list(example.meta["digits"])
        own = apply_rule(self.rule, digits)
        return [
            OtherContext(r, rule_text(r), _fmt(apply_rule(r, digits)), _fmt(apply_rule(r, own)))
            for r in dict.fromkeys(self.family)
            if r != self.rule and apply_rule(r, digits) != own
        ]

    def pretrain_corpus(self, n: int, seed: int) -> Corpus:
        """(context or None, prompt, response): with a context any family rule applied; without, the identity."""
        rng = random.Random(f"rules-pretrain|{seed}")
        out: Corpus = []
        for _ in range(n):
            d = self._digits(rng, "train")
            if rng.random() < self.context_prob:
                r = rng.choice(self.family)
                out.append((rule_text(r), PROMPT.format(items=_fmt(d)), _fmt(apply_rule(r, d))))
            else:
                out.append((None, PROMPT.format(items=_fmt(d)), _fmt(d)))
        return out

    def vocab(self) -> list[str]:
        words = set(split_words(PROMPT.format(items="0 1 2 3 4 5 6 7 8 9")))
        for r in set(self.family) | {self.rule}:
            words |= set(split_words(rule_text(r)))
        return sorted(words)


@register_task("rules", options=RulesOptions)
def make_rules(o: RulesOptions) -> RulesTask:
    """``--task rules`` (`RulesOptions`)."""
    return RulesTask(o)
