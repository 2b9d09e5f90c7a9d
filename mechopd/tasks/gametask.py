"""The `Task` of a board game (`GameTask`): examples by board hash, policies, vocabulary, the pretraining corpus.

Boards, parsing, search and episodes are `mechopd.tasks.gamecore`; a game (FrozenLake, Sokoban) subclasses `GameTask`
with its board generator and texts. Split rule: `gamecore.split_of` on the board hash (the uid).
"""

from __future__ import annotations

import functools
import random
from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.options import TEMPERATURE_RANGE, Range, option
from mechopd.tasks.base import SPLITS, BaseTask, Corpus, Example, TaskEntry, TaskOptions
from mechopd.tasks.gamecore import (
    ACTIONS,
    ALIASES,
    EMBEDDED,
    ENGINES,
    INVALID,
    MAX_MISSES,
    Board,
    GameEpisode,
    GameState,
    Policy,
    action_text,
    bfs_path,
    board_hash,
    board_header,
    expert_action,
    log_line,
    optimal_actions,
    parse_action,
    play,
    split_of,
)
from mechopd.tasks.words import split_words

WEAK_POLICIES = ("random", "greedy")


@dataclass(frozen=True)
class GameOptions(TaskOptions):
    """The options every embedded game takes (a game's options dataclass adds its board's)."""

    step_budget: int = option(5, "moves per episode", range=Range(1, 20))
    context: str | None = option(None, "the experience items; null: the game's own")
    weak_policy: str = option("random", "the organism's play without the context", choices=WEAK_POLICIES)
    max_new_tokens: int = option(24, "response cap per move", range=Range(4, 1024))
    temperature: float = option(0.7, "rollout temperature", range=TEMPERATURE_RANGE)
    readout: bool = option(True, "the per-move read-out line under the board")
    engine: str = option(
        EMBEDDED, "the game's engine: the embedded organism or a registered one", registry="game_engine"
    )

    def check(self) -> None:
        if self.context is not None and not self.context.strip():
            raise ConfigError(f"context={self.context!r} must be non-empty text; omit it for the game's own")


class EngineVariant:
    """`register_task`'s ``variant`` for a game: ``engine=<registered engine>`` builds the task with that engine's
    factory and options (`gamecore.register_engine`); the embedded engine is the game's own entry."""

    def __init__(self, game: str):
        self.game = game

    def __call__(self, options: dict[str, Any]) -> tuple[TaskEntry, dict[str, Any]] | None:
        engine = options.get("engine", EMBEDDED)
        if engine == EMBEDDED or not isinstance(engine, str) or engine not in ENGINES:
            return None  # the game's own options check the engine's name
        factory, cls = ENGINES[engine]
        rest = {k: v for k, v in options.items() if k != "engine"}
        return TaskEntry(functools.partial(factory, self.game), cls), rest

    def labelled(self) -> dict[str, type]:
        return {f"engine={name}": cls for name, (_, cls) in ENGINES.items()}


class GameTask(BaseTask):
    """The `Task` protocol for a board game; subclasses give the board generator and the game's texts."""

    name = "game"
    placement = "user"
    is_game = True
    intro = ""  # instructions at the top of every prompt
    default_context = ""  # the experience items
    outcomes: tuple[str, ...] = ()  # every outcome phrase `Board.step` can return
    symbols: tuple[str, ...] = ()  # every board cell symbol
    readout: bool = False  # the per-move read-out line under the board (subclasses that support it expose an option)

    def readout_words(self) -> list[str]:
        """Texts the read-out line can contain (for the vocabulary); none when the task has no read-out."""
        return []

    def __init__(self, o: GameOptions):
        if o.engine != EMBEDDED:  # another engine is its own task (`EngineVariant`), never this one silently
            raise TaskError(f"{self.name}: engine={o.engine!r} is built by get_task({self.name!r}, engine=...)")
        self.step_budget = o.step_budget
        self.context = self.default_context if o.context is None else o.context
        self.weak_policy_name = o.weak_policy
        self.max_new_tokens = o.max_new_tokens
        self.temperature = o.temperature
        self.readout = o.readout

    # subclass hooks -------------------------------------------------------
    @abstractmethod
    def generate_board(self, rng: random.Random) -> Board[Any]:
        """A random board for the task's options (solvable within the step budget)."""

    @abstractmethod
    def board_from_meta(self, meta: dict[str, Any]) -> Board[Any]:
        """The board stored in an example's meta (`TaskError` if malformed)."""

    @abstractmethod
    def greedy_action(self, state: GameState[Any]) -> str:
        """A naive move toward the goal that ignores what the experience items teach."""

    @abstractmethod
    def size_params(self) -> dict[str, int]:
        """The size options that enter the board hash and the generator seed."""

    def board_space(self) -> int | None:
        """An upper bound on the distinct boards the options allow (None: not bounded by a subclass)."""
        return None

    def max_items(self, split: str, need: int = 0) -> int | None:
        """The board-space bound (`board_space`, counted over both splits: an upper bound of either) when `need`
        exceeds it, else None (the exact count of solvable boards is not computed)."""
        bound = self.board_space()
        return bound if bound is not None and need > bound else None

    # boards and examples --------------------------------------------------
    def board_stream(self, split: str, seed: int) -> Iterator[tuple[str, Board[Any]]]:
        """Unique (uid, board) of `split` in a fixed order for `seed`; ends when the board space looks exhausted."""
        if split not in SPLITS:
            raise TaskError(f"{self.name}: split must be 'train' or 'test', got {split!r}")
        params = ",".join(f"{k}={v}" for k, v in sorted(self.size_params().items()))
        rng = random.Random(f"{self.name}|{params}|budget={self.step_budget}|{split}|{seed}")
        seen: set[str] = set()
        misses = 0
        while misses < MAX_MISSES:
            board = self.generate_board(rng)
            uid = board_hash(board)
            if uid in seen or split_of(uid) != split:
                misses += 1
                continue
            seen.add(uid)
            misses = 0
            yield uid, board

    def example_for(self, uid: str, board: Board[Any]) -> Example:
        path = bfs_path(board, board.initial_key())
        meta = {**board.to_meta(), "optimal_moves": len(path or []), "solution": path, "step_budget": self.step_budget}
        prompt = GameEpisode(board, self.intro, self.step_budget, self.readout).prompt()
        return Example(uid=uid, prompt=prompt, context=self.context, answer=None, meta=meta)

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """`n` unique boards of `split` (uid = board hash); a prefix of the list for a larger `n`."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise TaskError(f"{self.name}: asked for n={n!r} examples; pass n >= 1")
        if self.max_items(split, n) is not None:
            raise TaskError(
                f"{self.name}: at most {self.board_space()} boards exist for {self.size_params()} (asked "
                f"for {n} {split} boards); ask for fewer, or use a larger board (--option size=...)"
            )
        out = []
        for uid, board in self.board_stream(split, seed):
            out.append(self.example_for(uid, board))
            if len(out) == n:
                return out
        raise TaskError(
            f"{self.name}: only {len(out)} unique {split} boards exist for {self.size_params()} "
            f"(asked for {n}); ask for fewer, or use a larger board so that the hash split can hold boards out"
        )

    def new_episode(self, example: Example) -> GameEpisode[Any]:
        if example.meta.get("game") != self.name:
            raise TaskError(f"{self.name}: example {example.uid} holds a {example.meta.get('game')!r} board")
        return GameEpisode(self.board_from_meta(example.meta), self.intro, self.step_budget, self.readout)

    def score(self, example: Example, response_text: str) -> bool:
        """Single-turn view of a game: is the reply's action an optimal first move on the example's board?"""
        board = self.board_from_meta(example.meta)
        return parse_action(response_text) in optimal_actions(GameState(board, board.initial_key()))

    def parse_answer(self, response_text: str) -> str | None:
        """The move a reply plays: its last bracketed action (`gamecore.parse_action`); None = an invalid move."""
        return parse_action(response_text)

    def split_of(self, example: Example) -> str:
        """By board hash (`gamecore.split_of`): 1 board in 10 is held out."""
        return split_of(example.uid)

    # policies -------------------------------------------------------------
    def weak_action(self, state: GameState[Any], rng: random.Random) -> str:
        """The no-context policy of the organism: uniformly random, or greedy (ignores the experience items)."""
        if self.weak_policy_name == "greedy":
            return self.greedy_action(state)
        return rng.choice(ACTIONS)

    def expert_reply(self, state: GameState[Any], action: str) -> str:
        """The organism's reply with the context when it plays `action`. Without the read-out: the bracketed action.
        With it: the read-out entries checked in order up to the chosen move, then the move, e.g.
        ``up H toward , down F far , left F toward [left]`` (a short worked check: the organism learns the strategy
        through copy-like steps, and the context view's replies are longer, so length inflation is measurable)."""
        if not self.readout:
            return action_text(action)
        entries = state.board.readout_entries(state.key)  # type: ignore[attr-defined]
        return " , ".join(entries[: ACTIONS.index(action) + 1]) + " " + action_text(action)

    def expert_policy(self) -> Policy:
        return lambda ep, rng: self.expert_reply(ep.state, expert_action(ep.state) or ACTIONS[0])

    def weak_policy(self) -> Policy:
        return lambda ep, rng: action_text(self.weak_action(ep.state, rng))

    # vocabulary and pretraining corpus ------------------------------------
    def vocab(self) -> list[str]:
        texts = [self.intro, self.context, "Log:", "no moves yet.", *self.symbols, *self.readout_words()]
        texts += [action_text(a) for a in (*ACTIONS, *ALIASES)]
        for i in range(1, self.step_budget + 1):
            texts.append(board_header(i, self.step_budget))
            texts.append(log_line(i, None, INVALID))
            texts += [log_line(i, a, o) for a in ACTIONS for o in self.outcomes]
        return sorted({w for t in texts for w in split_words(t)})

    def pretrain_corpus(self, n: int, seed: int, invalid_rate: float = 0.05) -> Corpus:
        """(context or None, prompt, reply) pairs on train boards (a prefix of ``examples('train', ., seed)``).

        Trajectories mix expert and weak moves (per game a fraction in {0, 1/4, 1/2, 3/4, 1} of expert moves, plus
        `invalid_rate` invalid replies) so the prompts cover the states that play reaches. At every state: with the
        context the reply is the expert move (skipped where none exists); without it, the weak policy's move.
        """
        rng = random.Random(f"{self.name}|corpus|{seed}")
        boards = _cycle(self.board_stream("train", seed))
        out: Corpus = []
        while len(out) < n:
            episode = GameEpisode(next(boards)[1], self.intro, self.step_budget, self.readout)
            p_expert = rng.choice((0.0, 0.25, 0.5, 0.75, 1.0))
            while not episode.done and len(out) < n:
                prompt, expert = episode.prompt(), expert_action(episode.state)
                weak = self.weak_action(episode.state, rng)
                if expert is not None:
                    out.append((self.context, prompt, self.expert_reply(episode.state, expert)))
                out.append((None, prompt, action_text(weak)))
                if rng.random() < invalid_rate:
                    episode.play(None)
                elif expert is not None and rng.random() < p_expert:
                    episode.play(expert)
                else:
                    episode.play(self.weak_action(episode.state, rng))
        return out[:n]


def _cycle(stream: Iterator[tuple[str, Board[Any]]]) -> Iterator[tuple[str, Board[Any]]]:
    """Yield the stream, then repeat what it yielded (small board spaces run out)."""
    seen = []
    for item in stream:
        seen.append(item)
        yield item
    if not seen:
        raise TaskError("no train boards could be generated; check the task options")
    while True:
        yield from seen


def policy_win_rate(task: GameTask, policy: Policy, examples: list[Example], seed: int = 0) -> float:
    """Fraction of `examples` that `policy` wins within the step budget (one game per example)."""
    if not examples:
        raise TaskError(f"{task.name}: policy_win_rate needs at least one example")
    rng = random.Random(f"{task.name}|play|{seed}")
    wins = sum(play(task.new_episode(ex), policy, rng).won for ex in examples)
    return wins / len(examples)
