"""Shared machinery of the text games (FrozenLake, Sokoban): actions, parsing, BFS, hashing, episodes, the Task base.

What is non-standard here:
  * A board is an immutable object; the moving parts live in a small hashable *key* (FrozenLake: the player cell;
    Sokoban: the player cell and the sorted box cells). A `GameState` is ``(board, key)``; BFS runs on keys.
  * BFS expands actions in the fixed order up, down, left, right and marks a key on first discovery, so the path it
    returns is the first shortest solution in that order, and following `expert_action` replays that same path.
  * Train/test split by board hash: sha1 of the game name, the size parameters and the rendered initial board;
    bucket ``int(hash[:8], 16) % 10``; bucket 0 is test. Train and test are disjoint by construction.
  * Prompts use a closed vocabulary (`GameTask.vocab`), never echo the model's reply (an unparseable reply is logged
    as "invalid reply"), and never put two punctuation marks side by side, so that grouped and isolated punctuation
    splitting see the same words.
"""

from __future__ import annotations

import hashlib
import inspect
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator
from typing import Any, NamedTuple, Protocol

from mechopd.errors import ConfigError, TaskError
from mechopd.organisms.tokenizer import split_words
from mechopd.tasks.base import Example

ACTIONS: tuple[str, ...] = ("up", "down", "left", "right")
DELTAS: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
ALIASES: dict[str, str] = {"w": "up", "s": "down", "a": "left", "d": "right"}
_ACTION_RE = re.compile(r"\[\s*(up|down|left|right|w|a|s|d)\s*\]", re.IGNORECASE)
SPLITS = ("train", "test")
TEST_BUCKETS = 10  # 1 board in TEST_BUCKETS is held out
MAX_MISSES = 2000  # consecutive duplicate / other-split boards before a board space counts as exhausted
INVALID = "invalid reply, no move"
WEAK_POLICIES = ("random", "greedy")


class Board(Protocol):
    """An immutable game board; `key` values hold the moving parts (see module docstring)."""

    game: str

    def initial_key(self) -> Hashable: ...

    def step(self, key: Hashable, action: str) -> tuple[Hashable, str]:
        """Play `action` from `key`: (next key, outcome phrase from the game's fixed list)."""

    def won(self, key: Hashable) -> bool: ...

    def lost(self, key: Hashable) -> bool: ...

    def render(self, key: Hashable) -> str:
        """Cells separated by single spaces, one row per line."""

    def size_params(self) -> dict[str, int]: ...

    def to_meta(self) -> dict[str, Any]: ...


class GameState(NamedTuple):
    board: Board
    key: Hashable


# ---------------------------------------------------------------- parsing, rendering, hashing


def parse_action(text: str) -> str | None:
    """The last bracketed action in `text`: ``[up]``/``[w]`` ... case-insensitive, spaces inside allowed; else None."""
    found = _ACTION_RE.findall(text)
    if not found:
        return None
    word = found[-1].lower()
    return ALIASES.get(word, word)


def action_text(action: str) -> str:
    """The ideal reply for `action`, e.g. ``[right]``."""
    return f"[{action}]"


def render_cells(rows: list[list[str]]) -> str:
    return "\n".join(" ".join(row) for row in rows)


def board_hash(board: Board) -> str:
    """Stable across processes: sha1 of game name + size parameters + rendered initial board."""
    params = ",".join(f"{k}={v}" for k, v in sorted(board.size_params().items()))
    text = f"{board.game}|{params}\n{board.render(board.initial_key())}"
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def split_of(uid: str) -> str:
    """The split a board hash belongs to: bucket 0 of `TEST_BUCKETS` is "test", the rest "train"."""
    return "test" if int(uid[:8], 16) % TEST_BUCKETS == 0 else "train"


def check_disjoint(a: list[Example], b: list[Example]) -> None:
    """Raise `TaskError` if two example lists share a board (same uid)."""
    shared = sorted({e.uid for e in a} & {e.uid for e in b})
    if shared:
        raise TaskError(
            f"{len(shared)} boards appear in both example lists (e.g. uid {shared[0]}); "
            "draw train and test with examples('train', ...) and examples('test', ...), which split by board hash"
        )


# ---------------------------------------------------------------- search


def bfs_path(board: Board, key: Hashable, max_depth: int | None = None) -> list[str] | None:
    """Shortest action list from `key` to a win (first in action order among ties); None if none within max_depth."""
    if board.won(key):
        return []
    if board.lost(key):
        return None
    parent: dict[Hashable, tuple[Hashable, str] | None] = {key: None}
    frontier, depth = [key], 0
    while frontier and (max_depth is None or depth < max_depth):
        depth += 1
        nxt = []
        for k in frontier:
            for a in ACTIONS:
                k2, _ = board.step(k, a)
                if k2 in parent:
                    continue
                parent[k2] = (k, a)
                if board.won(k2):
                    return _backtrack(parent, k2)
                if not board.lost(k2):
                    nxt.append(k2)
        frontier = nxt
    return None


def _backtrack(parent: dict, key: Hashable) -> list[str]:
    path = []
    while parent[key] is not None:
        key, a = parent[key]
        path.append(a)
    return path[::-1]


def expert_action(state: GameState) -> str | None:
    """The first move of the BFS-optimal solution from `state`; None when won, lost or unsolvable."""
    path = bfs_path(state.board, state.key)
    return path[0] if path else None


def optimal_actions(state: GameState) -> list[str]:
    """Every action that starts some shortest solution from `state` (empty when won, lost or unsolvable)."""
    path = bfs_path(state.board, state.key)
    if not path:
        return []
    out = []
    for a in ACTIONS:
        k2, _ = state.board.step(state.key, a)
        rest = bfs_path(state.board, k2, max_depth=len(path) - 1)
        if rest is not None and len(rest) == len(path) - 1:
            out.append(a)
    return out


# ---------------------------------------------------------------- episodes


def log_line(i: int, action: str | None, outcome: str) -> str:
    return f"move {i}: {action_text(action)} {outcome}." if action else f"move {i}: {INVALID}."


def board_header(step: int, budget: int) -> str:
    return f"Board, move {step} of {budget}:"


def readout_line(board: Board, key: Hashable) -> str:
    """The read-out line under the board: the board's per-move `readout_entries` joined by commas."""
    return " , ".join(board.readout_entries(key))  # type: ignore[attr-defined]


class GameEpisode:
    """One game (implements `mechopd.tasks.base.Episode`). A move is spent per reply, valid or not."""

    def __init__(self, board: Board, intro: str, step_budget: int, readout: bool = False):
        self.board, self.intro, self.step_budget, self.readout = board, intro, step_budget, readout
        self.key = board.initial_key()
        self.steps = 0
        self.invalid_moves = 0
        self.history: list[tuple[str | None, str]] = []  # (action or None for an invalid reply, outcome)
        self.done = False
        self.won = False

    @property
    def state(self) -> GameState:
        return GameState(self.board, self.key)

    def prompt(self) -> str:
        """Instructions, the game log so far and the current board."""
        if self.done:
            raise RuntimeError("the episode is over; check `done` before asking for a prompt")
        log = [log_line(i, a, o) for i, (a, o) in enumerate(self.history, 1)] or ["no moves yet."]
        parts = [self.intro, "Log:", *log, board_header(self.steps + 1, self.step_budget)]
        board = [self.board.render(self.key)]
        if self.readout:  # the per-move read-out line under the board (organism option; see FrozenLakeTask)
            board.append(readout_line(self.board, self.key))
        return "\n".join(parts + board)

    def step(self, response_text: str) -> str | None:
        """Play the last bracketed action of the reply (None: invalid move). Returns the parsed action."""
        action = parse_action(response_text)
        self.play(action)
        return action

    def play(self, action: str | None) -> None:
        if self.done:
            raise RuntimeError("the episode is over; check `done` before playing a move")
        self.steps += 1
        if action is None:
            self.invalid_moves += 1
            self.history.append((None, INVALID))
        else:
            self.key, outcome = self.board.step(self.key, action)
            self.history.append((action, outcome))
        self.won = self.board.won(self.key)
        self.done = self.won or self.board.lost(self.key) or self.steps >= self.step_budget


Policy = Callable[[GameEpisode, random.Random], str]  # (episode, rng) -> reply text


def play(episode: GameEpisode, policy: Policy, rng: random.Random) -> GameEpisode:
    while not episode.done:
        episode.step(policy(episode, rng))
    return episode


# ---------------------------------------------------------------- the Task base


def check_options(name: str, cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """Reject unknown factory options with a `ConfigError` listing the known ones."""
    known = [p for p in inspect.signature(cls).parameters]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"{name} task: unknown option(s) {unknown}; options are {', '.join(known)}")
    return options


def check_int(name: str, field: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name} task: {field}={value!r} is out of range; pass an integer in {lo}..{hi}")
    return value


class GameTask(ABC):
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

    def __init__(self, step_budget: int, context: str | None, weak_policy: str, max_new_tokens: int,
                 temperature: float):
        self.step_budget = check_int(self.name, "step_budget", step_budget, 1, 20)
        if context is not None and (not isinstance(context, str) or not context.strip()):
            raise ConfigError(f"{self.name} task: context={context!r} must be non-empty text; omit it for the default")
        self.context = self.default_context if context is None else context
        if weak_policy not in WEAK_POLICIES:
            raise ConfigError(f"{self.name} task: weak_policy={weak_policy!r}; use one of {WEAK_POLICIES}")
        self.weak_policy_name = weak_policy
        self.max_new_tokens = check_int(self.name, "max_new_tokens", max_new_tokens, 4, 1024)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0:
            raise ConfigError(f"{self.name} task: temperature={temperature!r}; pass a number > 0 (games: 0.7)")
        self.temperature = float(temperature)

    # subclass hooks -------------------------------------------------------
    @abstractmethod
    def generate_board(self, rng: random.Random) -> Board:
        """A random board for the task's options (solvable within the step budget)."""

    @abstractmethod
    def board_from_meta(self, meta: dict[str, Any]) -> Board:
        """The board stored in an example's meta (`TaskError` if malformed)."""

    @abstractmethod
    def greedy_action(self, state: GameState) -> str:
        """A naive move toward the goal that ignores what the experience items teach."""

    @abstractmethod
    def size_params(self) -> dict[str, int]:
        """The size options that enter the board hash and the generator seed."""

    # boards and examples --------------------------------------------------
    def board_stream(self, split: str, seed: int) -> Iterator[tuple[str, Board]]:
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

    def example_for(self, uid: str, board: Board) -> Example:
        path = bfs_path(board, board.initial_key())
        meta = {**board.to_meta(), "optimal_moves": len(path or []), "solution": path,
                "step_budget": self.step_budget}
        prompt = GameEpisode(board, self.intro, self.step_budget, self.readout).prompt()
        return Example(uid=uid, prompt=prompt, context=self.context, answer=None, meta=meta)

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """`n` unique boards of `split` (uid = board hash); a prefix of the list for a larger `n`."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise TaskError(f"{self.name}: asked for n={n!r} examples; pass n >= 1")
        out = []
        for uid, board in self.board_stream(split, seed):
            out.append(self.example_for(uid, board))
            if len(out) == n:
                return out
        raise TaskError(
            f"{self.name}: only {len(out)} unique {split} boards exist for {self.size_params()} "
            f"(asked for {n}); ask for fewer, or use a larger board so that the hash split can hold boards out"
        )

    def new_episode(self, example: Example) -> GameEpisode:
        if example.meta.get("game") != self.name:
            raise TaskError(f"{self.name}: example {example.uid} holds a {example.meta.get('game')!r} board")
        return GameEpisode(self.board_from_meta(example.meta), self.intro, self.step_budget, self.readout)

    def score(self, example: Example, response_text: str) -> bool:
        """Single-turn view of a game: is the reply's action an optimal first move on the example's board?"""
        board = self.board_from_meta(example.meta)
        return parse_action(response_text) in optimal_actions(GameState(board, board.initial_key()))

    # policies -------------------------------------------------------------
    def weak_action(self, state: GameState, rng: random.Random) -> str:
        """The no-context policy of the organism: uniformly random, or greedy (ignores the experience items)."""
        if self.weak_policy_name == "greedy":
            return self.greedy_action(state)
        return rng.choice(ACTIONS)

    def expert_reply(self, state: GameState, action: str) -> str:
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

    def pretrain_corpus(self, n: int, seed: int, invalid_rate: float = 0.05) -> list[tuple[str | None, str, str]]:
        """(context or None, prompt, reply) pairs on train boards (a prefix of ``examples('train', ., seed)``).

        Trajectories mix expert and weak moves (per game a fraction in {0, 1/4, 1/2, 3/4, 1} of expert moves, plus
        `invalid_rate` invalid replies) so the prompts cover the states that play reaches. At every state: with the
        context the reply is the expert move (skipped where none exists); without it, the weak policy's move.
        """
        rng = random.Random(f"{self.name}|corpus|{seed}")
        boards = _cycle(self.board_stream("train", seed))
        out: list[tuple[str | None, str, str]] = []
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


def _cycle(stream: Iterator[tuple[str, Board]]) -> Iterator[tuple[str, Board]]:
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
