"""The task interface: what every task (rules organism, games, JSONL QA, user tasks) yields.

A task produces `Example`s. Each example has a privileged `context` c and a `prompt` x (the user-turn text). Single-turn
tasks are scored by `Task.score(example, response_text)`. Game tasks additionally expose `Task.new_episode(example)`,
returning an `Episode` that renders one user prompt per move (the game log so far plus the current board) and consumes
the model's reply for that move.

Context placement (`Task.placement`):
  * ``"system"``: c is a system message (system-prompt QA);
  * ``"user"``: c is spliced in front of the user turn, ``c + "\\n\\n" + x`` (games, as the reference code does).
For tokenizers without a chat template, views.py renders raw text (see views.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from mechopd.errors import TaskError


@dataclass
class Example:
    """One held-out or training item.

    uid:     stable identifier (for games: the board hash), used to pair outcomes across views and models.
    prompt:  the user-turn text x (for games: the first move's prompt; use `Task.new_episode` to play).
    context: the privileged context c (system prompt, hints, experience items).
    answer:  the reference answer for single-turn scoring (None for games).
    meta:    anything else (board, rule parameters, options ...). Must be JSON-serialisable.
    """

    uid: str
    prompt: str
    context: str
    answer: Any = None
    meta: dict = field(default_factory=dict)


@runtime_checkable
class Episode(Protocol):
    """A game in progress. One user prompt per move; `step` consumes the model's reply for that move."""

    done: bool
    won: bool
    invalid_moves: int

    def prompt(self) -> str:
        """The user-turn text for the next move: the game log so far and the current board."""

    def step(self, response_text: str) -> None:
        """Parse the last bracketed action in `response_text`, play it (unparseable = invalid move, counts a step)."""


class Task(Protocol):
    """What the trainer, evaluator and probes need from a task."""

    name: str
    placement: str  # "system" | "user"
    is_game: bool
    max_new_tokens: int  # response cap per prompt (per move for games)
    temperature: float  # rollout temperature (docs/method.md: 1.0 QA, 0.7 games)

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """`n` examples of `split` ("train" | "test"); deterministic for (split, n, seed); train/test disjoint."""

    def score(self, example: Example, response_text: str) -> bool:
        """Single-turn: is the response correct? (games: unused; use episodes)."""

    def new_episode(self, example: Example) -> Episode:
        """Games only: a fresh episode on the example's board."""

    def vocab(self) -> list[str]:
        """Every word the task's prompts, contexts and ideal responses use (for the organism's word-level tokenizer)."""


_REGISTRY: dict[str, Callable[..., Task]] = {}


def register_task(name: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Decorator: make a task factory available as ``--task NAME`` / ``task: NAME``.

    >>> @register_task("my_qa")
    ... def make_my_qa(**options) -> Task: ...
    """

    def deco(factory: Callable[..., Task]) -> Callable[..., Task]:
        _REGISTRY[name] = factory
        return factory

    return deco


def get_task(name: str, **options: Any) -> Task:
    """Build a registered task by name; unknown names raise a `TaskError` listing the known ones."""
    import mechopd.tasks  # noqa: F401  (registers the built-in tasks)

    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise TaskError(f"unknown task {name!r}; known tasks: {known} (register a custom one with @register_task)")
    return _REGISTRY[name](**options)


def task_names() -> list[str]:
    import mechopd.tasks  # noqa: F401

    return sorted(_REGISTRY)
