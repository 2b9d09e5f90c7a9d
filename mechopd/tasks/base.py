"""The task interface: what every task (rules organism, games, JSONL QA, user tasks) yields.

A task produces `Example`s. Each example has a privileged `context` c and a `prompt` x (the user-turn text). Single-turn
tasks are scored by `Task.score(example, response_text)`. Game tasks additionally expose `Task.new_episode(example)`,
returning an `Episode` that renders one user prompt per move (the game log so far plus the current board) and consumes
the model's reply for that move.

`Task` lists EVERY member a caller uses (trainer, evaluation, probes, organism pretraining): nothing is duck-typed.
`BaseTask` gives the defaults, so a custom task is a name, `examples` and `score` (README, "Your own data and tasks");
`get_task` checks that what a factory returns satisfies `Task` and names any missing member.

Context placement (`Task.placement`):
  * ``"system"``: c is a system message (system-prompt QA);
  * ``"user"``: c is spliced in front of the user turn, ``c + "\\n\\n" + x`` (games, as the reference code does).
For tokenizers without a chat template, core/views.py renders raw text (see core/views.py).

Split rule (`Task.split_of`): every task says which split an example belongs to, from the example alone, so that the
evaluation can CHECK that its held-out items are held out (`check_split`) instead of assuming it. `BaseTask`'s default
is a content hash of the uid (sha1, the first 60 bits read as a fraction, test iff < `test_fraction`).

Other contexts (`Task.other_contexts`): contexts OTHER than the distilled one, each with a label and the target it
implies (`OtherContext`), for the context-following study (`mechopd.evaluation.following`, docs/method.md "Context following").
`BaseTask`'s default is none: context-following is then "not measurable" for the task.

Options (`register_task(name, options=XOptions)`): a task's options are a `TaskOptions` dataclass of `option(...)`
fields (`mechopd.core.options`: default, help and range declared once). `get_task` binds ``--option KEY=VALUE`` / a
study's ``task_options:`` into it (`bind_task_options`: coerced, range-checked, cross-field rules, one line naming the
task) and hands the object to the factory; ``--help`` (`task_options_help`) and docs/config.md (`task_options_docs`)
are generated from the same classes. A ``variant`` (a game's ``engine=``) swaps in another factory and options class.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import textwrap
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.options import check_fields, coerce, docs_table, field_facts, limits, type_text

SPLITS = ("train", "test")
Corpus = list[tuple[str | None, str, str]]  # (context or None, prompt, response) triples for organism pretraining


@dataclass
class Example:
    """One held-out or training item.

    uid:     stable identifier (for games: the board hash), used to pair outcomes across views and models.
    prompt:  the user-turn text x (for games: the first move's prompt; use `Task.new_episode` to play).
    context: the privileged context c (system prompt, hints, experience items).
    answer:  the reference answer for single-turn scoring (None for games).
    meta:    anything else (board, rule parameters, options ...). Must be JSON-serialisable. ``meta["cluster"]``, where
             items are paraphrases of one fact (or otherwise not independent), names the item's cluster: evaluation
             records save it and the claims' intervals resample whole clusters (docs/method.md §8).
    """

    uid: str
    prompt: str
    context: str
    answer: Any = None
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OtherContext:
    """A context other than the distilled one for one example, and the answer it implies.

    label:   names the context across items (rules: the rule, e.g. ``shift:2``); per-context tables group by it.
    context: the context text, placed where the distilled context goes (`Task.placement`).
    answer:  the target under this context, in the form `Task.score` reads from ``Example.answer``.
    composed: optional; the answer of the distilled context's rule and then this one (rules: apply the distilled rule,
             then the other), where a task can say it: a reply equal to it MIXES both contexts (`mechopd.evaluation.following`).
    """

    label: str
    context: str
    answer: Any
    composed: Any = None

    def example(self, example: Example) -> Example:
        """`example` with this context and its answer (what `Task.score` then scores against)."""
        return Example(
            uid=example.uid,
            prompt=example.prompt,
            context=self.context,
            answer=self.answer,
            meta={**example.meta, "other_label": self.label},
        )


@runtime_checkable
class Episode(Protocol):
    """A game in progress. One user prompt per move; `step` consumes the model's reply for that move."""

    done: bool
    won: bool
    invalid_moves: int

    def prompt(self) -> str:
        """The user-turn text for the next move: the game log so far and the current board."""

    def step(self, response_text: str) -> str | None:
        """Parse the last bracketed action in `response_text`, play it (unparseable = invalid move, counts a step);
        returns the action played (None: an invalid move)."""


@runtime_checkable
class Task(Protocol):
    """What the trainer, the evaluation, the probes and the organism pretraining need from a task."""

    name: str
    placement: str  # "system" | "user"
    is_game: bool
    temperature: float  # rollout temperature (docs/method.md §1: 1.0 QA, 0.7 games)

    @property
    def max_new_tokens(self) -> int:
        """Response cap per prompt (per move for games); read only (an attribute or a property)."""

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """`n` examples of `split` ("train" | "test"); deterministic for (split, n, seed); train/test disjoint."""

    def score(self, example: Example, response_text: str) -> bool:
        """Single-turn: is the response correct? (games: is the reply's move an optimal first move?)"""

    def parse_answer(self, response_text: str) -> str | None:
        """What `score` reads from a response (an answer span, a move); None = unparseable (counted by evaluation)."""

    def split_of(self, example: Example) -> str:
        """The split ("train" | "test") `example` belongs to, from the example alone (checked at evaluation)."""

    def new_episode(self, example: Example) -> Episode:
        """Games only: a fresh episode on the example's board (single-turn tasks raise `TaskError`)."""

    def vocab(self) -> list[str]:
        """Every word the task's prompts, contexts and ideal responses use (for the organism's word-level tokenizer)."""

    def pretrain_corpus(self, n: int, seed: int) -> Corpus:
        """`n` (context or None, prompt, response) triples on train items for organism pretraining (organism tasks
        only; others raise `TaskError`): with the context the ideal response, without it the weak one."""

    def max_items(self, split: str, need: int = 0) -> int | None:
        """How many distinct items `split` holds (its item space), or None: unknown, too large to count, or certainly
        at least `need` (a cheap answer for a small request). A request for more is refused with this number
        (`runcheck.check_item_count`, `examples`) instead of searching for items that do not exist."""

    def other_contexts(self, example: Example) -> list[OtherContext]:
        """Contexts other than the distilled one for `example`, each with its target ([] = none defined)."""


def uid_fraction(uid: str) -> float:
    """A uid's position in [0, 1): sha1 of the uid, its first 60 bits read as a fraction."""
    return int(hashlib.sha1(uid.encode("utf-8")).hexdigest()[:15], 16) / float(16**15)


class BaseTask(ABC):
    """Defaults for every `Task` member but `examples` and `score`: a single-turn system-prompt task.

    Override the class attributes as needed (``name``, ``placement``, ``max_new_tokens``, ``temperature``,
    ``test_fraction``), and any method whose default does not fit.
    """

    name: str = "task"
    placement: str = "system"
    is_game: bool = False
    max_new_tokens: int = 64
    temperature: float = 1.0
    test_fraction: float = 0.2  # the default split rule's share of held-out items

    @abstractmethod
    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """`n` examples of `split`; keep them consistent with `split_of` (e.g. filter on ``self.split_of(e)``)."""

    @abstractmethod
    def score(self, example: Example, response_text: str) -> bool:
        """Is the response correct?"""

    def parse_answer(self, response_text: str) -> str | None:
        """Default: the whole stripped response; None when it is empty (nothing to score)."""
        return response_text.strip() or None

    def split_of(self, example: Example) -> str:
        """Default: "test" iff `uid_fraction(example.uid)` < `test_fraction` (stable; adding items moves none)."""
        return "test" if uid_fraction(example.uid) < self.test_fraction else "train"

    def new_episode(self, example: Example) -> Episode:
        raise TaskError(f"task {self.name!r} is single-turn: it has no episodes; use score()")

    def vocab(self) -> list[str]:
        """Default: no words (only an organism's word-level tokenizer needs them; real tokenizers cover any text)."""
        return []

    def max_items(self, split: str, need: int = 0) -> int | None:
        """Default: unknown (None)."""
        return None

    def other_contexts(self, example: Example) -> list[OtherContext]:
        """Default: none (the context-following study then says "not measurable" for this task)."""
        return []

    def pretrain_corpus(self, n: int, seed: int) -> Corpus:
        raise TaskError(
            f"task {self.name!r} has no organism pretraining corpus; organisms exist for rules, "
            "frozenlake and sokoban: pass a real model as --student"
        )


def check_split(task: Task, examples: list[Example], split: str) -> None:
    """Raise `TaskError` if any of `examples` belongs to another split by the task's own rule (`Task.split_of`)."""
    leaked = [ex.uid for ex in examples if task.split_of(ex) != split]
    if leaked:
        raise TaskError(
            f"{len(leaked)} {split} items of task {task.name!r} belong to another split by the task's "
            f"split_of (e.g. uid {leaked[0]}); the task's examples() and split_of() disagree"
        )


def check_disjoint(a: list[Example], b: list[Example]) -> None:
    """Raise `TaskError` if two example lists share an item (same uid; for games: the same board)."""
    shared = sorted({e.uid for e in a} & {e.uid for e in b})
    if shared:
        raise TaskError(
            f"{len(shared)} items appear in both example lists (e.g. uid {shared[0]}); "
            "draw train and test with examples('train', ...) and examples('test', ...), which split by hash"
        )


def missing_members(obj: Any) -> list[str]:
    """The `Task` members `obj` lacks (attributes, or methods that are not callable)."""
    methods = [n for n, v in vars(Task).items() if inspect.isfunction(v) and not n.startswith("_")]
    attrs = list(Task.__annotations__) + [n for n, v in vars(Task).items() if isinstance(v, property)]
    gaps = [n for n in attrs if not hasattr(obj, n)]
    return gaps + [n for n in methods if not callable(getattr(obj, n, None))]


class TaskOptions:
    """The base of a task's options dataclass (`register_task`'s ``options=``): every field an `option(...)` (its
    default, help and range declared once: the one range language, `mechopd.core.options.Range`); construction
    checks every field (`check_fields`) and then the cross-field rules (`check`). `get_task` binds ``--option
    KEY=VALUE`` / a study's ``task_options:`` into it (`bind_task_options`)."""

    def __post_init__(self) -> None:
        check_fields(self)
        self.check()

    def check(self) -> None:
        """Cross-field rules (e.g. ``min_moves <= step_budget``), each refused with one line; none by default."""


class Variant(Protocol):
    """Another factory and options class for some raw options (a game's ``engine=``): `register_task`'s
    ``variant``."""

    def __call__(self, options: dict[str, Any]) -> tuple[TaskEntry, dict[str, Any]] | None:
        """The entry that builds the task for these raw options, and the options it takes; None: the task's own."""

    def labelled(self) -> dict[str, type]:
        """Each variant's options dataclass by label (``engine=textarena``), for ``--help`` and the docs."""


@dataclass(frozen=True)
class TaskEntry:
    """A registered task: its factory (called with the bound options object, or with nothing when ``options`` is
    None) and its options dataclass; ``variant(options)``: another entry for these raw options (a game's
    ``engine=``: the engine's factory and options), with the options it takes, or None."""

    factory: Callable[..., Task]
    options: type | None = None
    variant: Variant | None = None


_REGISTRY: dict[str, TaskEntry] = {}


def register_task(
    name: str, options: type | None = None, variant: Variant | None = None
) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Decorator: make a task factory (a function or a `BaseTask` subclass) available as ``--task NAME``. A task
    with options declares them as a `TaskOptions` dataclass of `option(...)` fields; the factory then receives the
    bound, checked options object (``--option KEY=VALUE``, a study's ``task_options:``); without ``options`` it is
    called with none.

    >>> @register_task("my_qa", options=MyQaOptions)
    ... def make_my_qa(o: MyQaOptions) -> Task: ...
    """
    if options is not None and not (dataclasses.is_dataclass(options) and issubclass(options, TaskOptions)):
        raise TypeError(f"task {name!r}: options must be a TaskOptions dataclass, got {options!r}")

    def deco(factory: Callable[..., Task]) -> Callable[..., Task]:
        _REGISTRY[name] = TaskEntry(factory, options, variant)
        return factory

    return deco


def bind_task_options(name: str, cls: type, options: Mapping[str, Any]) -> Any:
    """``options`` (already typed: YAML values, or ``--option`` values read by `config_parse.scalar`) as ``cls``:
    unknown keys refused listing the task's keys; each value coerced (`coerce`: a path-like is text, a bool takes 0 /
    1 too) and checked (`check_value`), then the cross-field rules; every refusal one line naming the task."""
    facts = {f.name: f for f in field_facts(cls)}
    unknown = sorted(set(options) - set(facts))
    if unknown:
        raise ConfigError(
            f"{name} task: unknown option {', '.join(map(repr, unknown))}; the task's options are "
            f"{', '.join(facts)} (mechopd train --help lists them)"
        )
    values = {}
    for key, value in options.items():
        f = facts[key]
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if _parts_of(f.hint) is bool and type(value) is int and value in (0, 1):
            value = bool(value)
        values[key] = coerce(f, value, f"{name} task")
    try:
        return cls(**values)
    except ConfigError as e:
        raise ConfigError(f"{name} task: {e}") from None


def _parts_of(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 else hint


def get_task(name: str, **options: Any) -> Task:
    """Build a registered task by name; unknown names raise a `TaskError` listing the known ones, options outside
    the task's options dataclass a `ConfigError` (`bind_task_options`), and a result that does not satisfy `Task` a
    `TaskError` naming the gaps."""
    # the built-in tasks are registered: importing this module imports the package mechopd.tasks first
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise TaskError(f"unknown task {name!r}; known tasks: {known} (register a custom one with @register_task)")
    entry = _REGISTRY[name]
    if entry.variant is not None and (alt := entry.variant(options)) is not None:
        entry, options = alt
    if entry.options is None:
        if options:
            raise ConfigError(
                f"task {name!r} takes no options (given: {', '.join(sorted(options))}); declare them: "
                f"register_task({name!r}, options=YourOptions)"
            )
        task = entry.factory()
    else:
        task = entry.factory(bind_task_options(name, entry.options, options))
    gaps = missing_members(task)
    if gaps:
        raise TaskError(
            f"task {name!r} lacks {', '.join(gaps)} of the Task protocol; subclass "
            "mechopd.tasks.base.BaseTask for the defaults"
        )
    return task


def task_names() -> list[str]:
    return sorted(_REGISTRY)


def option_sets() -> list[tuple[str, type]]:
    """Every registered task's options dataclass and its variants', labelled (``rules``, ``sokoban engine=textarena``)."""
    out: list[tuple[str, type]] = []
    for name in task_names():
        entry = _REGISTRY[name]
        if entry.options is not None:
            out.append((name, entry.options))
        for label, cls in (entry.variant.labelled() if entry.variant is not None else {}).items():
            out.append((f"{name} {label}", cls))
    return out


def task_options_help(width: int = 100) -> str:
    """The ``--help`` epilog of the verbs that take ``--option``: each task's options with type, range, choices and
    default (`limits`: the words docs/config.md shows)."""
    lines = ["task options (--option KEY=VALUE, a study's task_options:):"]
    for label, cls in option_sets():
        items = []
        for f in field_facts(cls):
            shown = ", ".join(x for x in (type_text(f.hint), limits(f), f"default {f.default!r}") if x)
            items.append(f"{f.name} ({shown})")
        lines += textwrap.wrap(f"{label}: " + "; ".join(items), width, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)


def task_options_docs() -> str:
    """docs/config.md's task-option tables (`docs_table`, one per task and variant; the flag is ``--option``)."""
    parts = []
    for label, cls in option_sets():
        facts = [dataclasses.replace(f, flag=f"--option {f.name}=VALUE") for f in field_facts(cls)]
        parts.append(f"## {label}\n\n" + docs_table(facts, sections=False))
    return "\n".join(parts)
