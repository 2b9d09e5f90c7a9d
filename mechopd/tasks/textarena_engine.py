"""``engine: textarena``: play the papers' own game engine, TextArena's ``FrozenLake-v0`` / ``Sokoban-v0``.

``--task frozenlake --option engine=textarena`` (or ``task_options: {engine: textarena}``) replaces the embedded board
and text with TextArena's environment: its board generator (seeded), its prompt and board text, its move parser and
its rules, as the reference code plays them. TextArena is an optional extra (``pip install mechopd[textarena]``);
without it this option raises one `ConfigError` naming the install command. The embedded games stay the organisms'.

How a game is played here (docs/method.md §4): one prompt per move holding TextArena's observations so far (its
instructions, every board it showed, every reply and game message, in order); the model's whole reply goes to
``env.step`` as TextArena's own agents send it, so TextArena's parser decides the move (it plays the FIRST bracketed
action, the embedded games the last). A move is spent per reply, valid or not, up to ``step_budget``; TextArena's own
rule that a second consecutive invalid move ends the game (lost) applies. Win = TextArena's reward 1.

Boards: seed ``s`` of a split's stream resets the environment with ``seed=s``; the board is converted to the embedded
`Board` (same cells) only to hash it, so train / test are split by board hash exactly like the embedded games
(`gamecore.split_of`). TextArena seeds Python's global `random` on reset; the global state is restored afterwards.
"""

from __future__ import annotations

import copy
import random
import re
from dataclasses import dataclass
from typing import Any

from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.options import GE0, GE1, GT0, Range, option
from mechopd.tasks import frozenlake, sokoban
from mechopd.tasks.base import SPLITS, BaseTask, Example, TaskOptions
from mechopd.tasks.gamecore import MAX_MISSES, board_hash, register_engine, split_of

INSTALL = "pip install mechopd[textarena]"
SOKOBAN_CELLS = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P"}


def require_textarena() -> Any:
    """The `textarena` module, or a `ConfigError` naming the install command."""
    try:
        import textarena
    except ImportError:
        raise ConfigError(f"engine: textarena needs the optional textarena package; {INSTALL}") from None
    return textarena


def make_env(game: str, size: int, holes_or_boxes: int, step_budget: int) -> Any:
    """A raw TextArena environment (no wrappers) of `game`, the FrozenLake-v0 / Sokoban-v0 classes."""
    require_textarena()
    if game == "frozenlake":
        from textarena.envs.FrozenLake.env import FrozenLakeEnv

        return FrozenLakeEnv(size=size, num_holes=holes_or_boxes, randomize_start_goal=False)
    from textarena.envs.Sokoban.env import SokobanEnv

    return SokobanEnv(dim_room=(size, size), max_turns=step_budget, num_boxes=holes_or_boxes)


def reset(env: Any, seed: int) -> None:
    """``env.reset(seed=seed)`` without leaving Python's global `random` reseeded."""
    state = random.getstate()
    try:
        env.reset(num_players=1, seed=seed)
    finally:
        random.setstate(state)


def board_of(game: str, env: Any) -> Any:
    """The embedded `Board` with the same cells as the environment's current board (for hashing and checks)."""
    if game == "frozenlake":
        grid, n = env.state.game_state["grid"], env.size
        holes = frozenset(r * n + c for r in range(n) for c in range(n) if grid[r][c] == "H")
        (pr, pc), (gr, gc) = env.state.game_state["player_pos"], env.state.game_state["goal_pos"]
        return frozenlake.FrozenLakeBoard(n, holes, pr * n + pc, gr * n + gc)
    rows = [[SOKOBAN_CELLS[int(v)] for v in row] for row in env.room_state]
    for r, row in enumerate(rows):
        for c, s in enumerate(row):
            if s == "P" and int(env.room_fixed[r][c]) == 2:
                rows[r][c] = "S"  # the player standing on a target
    return sokoban.parse_board(rows)


class TextArenaEpisode:
    """One TextArena game (implements `mechopd.tasks.base.Episode`)."""

    def __init__(self, env: Any, step_budget: int):
        self.env, self.step_budget = env, step_budget
        self.log: list[str] = []
        self.steps = self.invalid_moves = 0
        self.done = self.won = False
        self._observe()

    def _observe(self) -> None:
        _, obs = self.env.get_observation()
        self.log += [str(o[1]) for o in obs]

    def prompt(self) -> str:
        if self.done:
            raise RuntimeError("the episode is over; check `done` before asking for a prompt")
        return "\n\n".join(self.log)

    def step(self, response_text: str) -> None:
        if self.done:
            raise RuntimeError("the episode is over; check `done` before playing a move")
        state = self.env.state
        ended, _ = self.env.step(response_text)
        self.steps += 1
        invalid = state.error_count > 0 or bool(state.game_info[0].get("invalid_move"))
        self.invalid_moves += int(invalid)
        self._observe()
        self.won = bool(ended) and state.rewards is not None and state.rewards.get(0) == 1
        self.done = bool(ended) or self.steps >= self.step_budget


class TextArenaGameTask(BaseTask):
    """A game task on TextArena's environment (the `Task` protocol); see the module docstring."""

    placement, is_game = "user", True

    def __init__(
        self, game: str, size: int, count: int, step_budget: int, context: str, max_new_tokens: int, temperature: float
    ):
        self.name, self.size, self.count, self.step_budget = game, size, count, step_budget
        self.context, self.max_new_tokens, self.temperature = context, max_new_tokens, temperature
        self.env_id = {"frozenlake": "FrozenLake-v0", "sokoban": "Sokoban-v0"}[game]
        self._env = make_env(game, size, count, step_budget)
        self._fresh: dict[int, Any] = {}  # seed -> a just-reset environment (Sokoban's generator is slow: reuse it)

    def _board_example(self, seed: int) -> Example:
        reset(self._env, seed)
        self._fresh[seed] = copy.deepcopy(self._env)  # before the episode below consumes its first observations
        board = board_of(self.name, self._env)
        prompt = TextArenaEpisode(self._env, self.step_budget).prompt()
        meta = {**board.to_meta(), "engine": "textarena", "env_id": self.env_id, "ta_seed": seed}
        return Example(uid=board_hash(board), prompt=prompt, context=self.context, meta=meta)

    def examples(self, split: str, n: int, seed: int) -> list[Example]:
        """`n` unique boards of `split` from seeds ``seed * 1_000_003 + i``; TaskError when the space runs out."""
        if split not in SPLITS:
            raise TaskError(f"{self.name}: split must be 'train' or 'test', got {split!r}")
        out: list[Example] = []
        seen: set[str] = set()
        misses, i = 0, 0
        while len(out) < n and misses < MAX_MISSES:
            ex = self._board_example(seed * 1_000_003 + i)
            i += 1
            if ex.uid in seen or split_of(ex.uid) != split:
                misses += 1
                continue
            seen.add(ex.uid)
            misses = 0
            out.append(ex)
        if len(out) < n:
            raise TaskError(
                f"{self.name} (textarena): only {len(out)} unique {split} boards of size {self.size} "
                f"exist (asked for {n}); ask for fewer or use a larger board"
            )
        return out

    def new_episode(self, example: Example) -> TextArenaEpisode:
        if example.meta.get("engine") != "textarena":
            raise TaskError(f"{self.name} (textarena): example {example.uid} was not drawn from TextArena")
        seed = int(example.meta["ta_seed"])
        if seed not in self._fresh:
            self._fresh[seed] = make_env(self.name, self.size, self.count, self.step_budget)
            reset(self._fresh[seed], seed)
        return TextArenaEpisode(copy.deepcopy(self._fresh[seed]), self.step_budget)

    def score(self, example: Example, response_text: str) -> bool:
        raise TaskError(f"{self.name} is a game: play it with new_episode(), not score()")

    def vocab(self) -> list[str]:
        return []  # TextArena's texts are open; the real-model tokenizers are byte-level

    def parse_answer(self, response_text: str) -> str | None:
        """The FIRST bracketed action, as TextArena's own parser plays it (the embedded games play the last)."""
        m = re.search(r"\[\s*([A-Za-z]+)\s*\]", response_text)
        return m.group(1).lower() if m else None

    def split_of(self, example: Example) -> str:
        return split_of(example.uid)  # boards split by hash, as the embedded games


@dataclass(frozen=True)
class TextArenaOptions(TaskOptions):
    """``engine=textarena`` options of ``frozenlake`` / ``sokoban`` (they replace the game's own; the embedded-only
    ones, start, goal, min_path, weak_policy, are refused)."""

    size: int | None = option(None, "board side; null: FrozenLake-v0's 4, Sokoban-v0's 6", range=GE1)
    holes: int = option(3, "FrozenLake's holes", range=GE0)
    boxes: int = option(1, "Sokoban's boxes", range=GE1)
    step_budget: int = option(5, "moves per episode", range=Range(1, 100))
    context: str | None = option(None, "the experience items; null: the game's own")
    max_new_tokens: int = option(1024, "response cap per move", range=Range(4, 4096))
    temperature: float = option(0.7, "rollout temperature", range=GT0)
    readout: bool = option(False, "TextArena's boards have no read-out line: false only")

    def check(self) -> None:
        if self.readout:
            raise ConfigError(
                "readout=true is an embedded-organism option; TextArena's boards have no "
                "read-out line (set readout: false or drop it with engine: textarena)"
            )
        if self.context is not None and not self.context.strip():
            raise ConfigError("context is empty; omit it for the game's own experience items")


@register_engine("textarena", options=TextArenaOptions)
def make_textarena_task(game: str, o: TextArenaOptions) -> TextArenaGameTask:
    """The ``engine: textarena`` variant of ``frozenlake`` / ``sokoban`` (`TextArenaOptions`)."""
    size = o.size if o.size is not None else (4 if game == "frozenlake" else 6)
    default_ctx = frozenlake.CONTEXT if game == "frozenlake" else sokoban.CONTEXT
    return TextArenaGameTask(
        game,
        size,
        o.holes if game == "frozenlake" else o.boxes,
        o.step_budget,
        o.context or default_ctx,
        o.max_new_tokens,
        o.temperature,
    )
