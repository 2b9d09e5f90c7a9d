"""Shared machinery of the text games (FrozenLake, Sokoban): actions, parsing, BFS, hashing, episodes.

The `Task` side of a game (examples, policies, vocabulary, pretraining corpus) is `mechopd.tasks.gametask.GameTask`.

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
import random
import re
from collections.abc import Callable, Hashable
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from mechopd.core.options import register_registry

ACTIONS: tuple[str, ...] = ("up", "down", "left", "right")
DELTAS: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
ALIASES: dict[str, str] = {"w": "up", "s": "down", "a": "left", "d": "right"}
_ACTION_RE = re.compile(r"\[\s*(up|down|left|right|w|a|s|d)\s*\]", re.IGNORECASE)
TEST_BUCKETS = 10  # 1 board in TEST_BUCKETS is held out
MAX_MISSES = 2000  # consecutive duplicate / other-split boards before a board space counts as exhausted
INVALID = "invalid reply, no move"
EMBEDDED = "embedded"
# engine name -> (factory(game, options), its options dataclass); the embedded one is the game's own task
ENGINES: dict[str, tuple[Callable[[str, Any], Any], type]] = {}


K = TypeVar("K", bound=Hashable)  # a board's key type (FrozenLake: int; Sokoban: (player, boxes))


class Board(Protocol[K]):
    """An immutable game board; `key` values (type K) hold the moving parts (see module docstring)."""

    @property
    def game(self) -> str: ...

    def initial_key(self) -> K: ...

    def step(self, key: K, action: str) -> tuple[K, str]:
        """Play `action` from `key`: (next key, outcome phrase from the game's fixed list)."""

    def won(self, key: K) -> bool: ...

    def lost(self, key: K) -> bool: ...

    def render(self, key: K) -> str:
        """Cells separated by single spaces, one row per line."""

    def size_params(self) -> dict[str, int]: ...

    def to_meta(self) -> dict[str, Any]: ...


class GameState(NamedTuple, Generic[K]):
    board: Board[K]
    key: K


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


def board_hash(board: Board[Any]) -> str:
    """Stable across processes: sha1 of game name + size parameters + rendered initial board."""
    params = ",".join(f"{k}={v}" for k, v in sorted(board.size_params().items()))
    text = f"{board.game}|{params}\n{board.render(board.initial_key())}"
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def split_of(uid: str) -> str:
    """The split a board hash belongs to: bucket 0 of `TEST_BUCKETS` is "test", the rest "train"."""
    return "test" if int(uid[:8], 16) % TEST_BUCKETS == 0 else "train"


# ---------------------------------------------------------------- search


def bfs_path(board: Board[K], key: K, max_depth: int | None = None) -> list[str] | None:
    """Shortest action list from `key` to a win (first in action order among ties); None if none within max_depth."""
    if board.won(key):
        return []
    if board.lost(key):
        return None
    parent: dict[K, tuple[K, str] | None] = {key: None}
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


def _backtrack(parent: dict[K, tuple[K, str] | None], key: K) -> list[str]:
    path = []
    link = parent[key]
    while link is not None:
        key, a = link
        path.append(a)
        link = parent[key]
    return path[::-1]


def expert_action(state: GameState[Any]) -> str | None:
    """The first move of the BFS-optimal solution from `state`; None when won, lost or unsolvable."""
    path = bfs_path(state.board, state.key)
    return path[0] if path else None


def optimal_actions(state: GameState[Any]) -> list[str]:
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


def readout_line(board: Board[K], key: K) -> str:
    """The read-out line under the board: the board's per-move `readout_entries` joined by commas."""
    return " , ".join(board.readout_entries(key))  # type: ignore[attr-defined]


class GameEpisode(Generic[K]):
    """One game (implements `mechopd.tasks.base.Episode`). A move is spent per reply, valid or not."""

    def __init__(self, board: Board[K], intro: str, step_budget: int, readout: bool = False):
        self.board, self.intro, self.step_budget, self.readout = board, intro, step_budget, readout
        self.key = board.initial_key()
        self.steps = 0
        self.invalid_moves = 0
        self.history: list[tuple[str | None, str]] = []  # (action or None for an invalid reply, outcome)
        self.done = False
        self.won = False

    @property
    def state(self) -> GameState[K]:
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


Policy = Callable[[GameEpisode[Any], random.Random], str]  # (episode, rng) -> reply text


def play(episode: GameEpisode[K], policy: Policy, rng: random.Random) -> GameEpisode[K]:
    while not episode.done:
        episode.step(policy(episode, rng))
    return episode


# ------------------------------------------------------------------------------------------------------- engines
def register_engine(name: str, options: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``factory(game, options) -> Task`` plays ``--option engine=<name>`` for every game; ``options``:
    the engine's options dataclass (a `TaskOptions`), which then replaces the game's (`gametask.engine_variant`)."""

    def deco(factory: Callable[..., Any]) -> Callable[..., Any]:
        ENGINES[name] = (factory, options)
        return factory

    return deco


register_registry("game_engine", lambda: {EMBEDDED: None, **ENGINES})  # GameOptions.engine's choices
