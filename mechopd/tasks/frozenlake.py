"""FrozenLake as a text game: an n x n lake, not slippery; P player, F frozen, H hole, G goal.

Dynamics: a move off the board keeps the player in place; stepping onto a hole ends the game lost; reaching G wins.
Read-out (``readout=True``, the default; the organisms need it): a line under the board saying, per move, what it
would step onto and whether it brings P closer to G, e.g. ``up H far , down F toward , left F far , right edge``.
With it the organism's context reply is a short worked check (`GameTask.expert_reply`). Without the worked reply the
3-layer organism did not learn to play within its CPU budget (grid alone or grid + read-out with a one-move reply;
docs/gotchas.md, docs/results.md). Real-model recipes that reproduce the reference game set
``readout: false`` (and a longer ``max_new_tokens``), as does ``REFERENCE``.

Boards: `size` 3..6, `holes` holes, start and goal random (or fixed: "top-left", "bottom-right", ... or [row, col]),
kept only if the shortest safe path has `min_path`..`step_budget` moves. The reference setting (docs/method.md section 4)
is ``REFERENCE`` = 3 x 3, 2 holes, start top-left, goal bottom-right: only 19 boards exist, so asking for more than the
few held-out ones raises a `TaskError`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, ClassVar

from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.options import GE0, GE1, Range, option
from mechopd.tasks.base import register_task
from mechopd.tasks.gamecore import ACTIONS, DELTAS, GameState, bfs_path, render_cells
from mechopd.tasks.gametask import EngineVariant, GameOptions, GameTask

REFERENCE: dict[str, Any] = {"size": 3, "holes": 2, "start": "top-left", "goal": "bottom-right", "readout": False}
CORNERS = ("top-left", "top-right", "bottom-left", "bottom-right")
MOVED, EDGE, HOLE, GOAL = "moved", "hit the edge and stayed", "fell into a hole", "reached the goal"

INTRO = "FrozenLake. Move P to the goal G. F is ice, H is a hole. Reply [up] [down] [left] or [right]"
CONTEXT = (  # short on purpose: the organisms pay for every prompt token on a CPU
    "Experience:\n"
    "1. A hole H ends the game.\n"
    "2. Go around H through F.\n"
    "3. Take the first step of the shortest safe path to G."
)


@dataclass(frozen=True)
class FrozenLakeBoard:
    """Cells are ints ``row * size + col``; the key is the player cell."""

    size: int
    holes: frozenset[int]
    start: int
    goal: int
    game: ClassVar[str] = "frozenlake"

    def initial_key(self) -> int:
        return self.start

    def step(self, key: int, action: str) -> tuple[int, str]:
        r, c = divmod(key, self.size)
        dr, dc = DELTAS[action]
        r, c = r + dr, c + dc
        if not (0 <= r < self.size and 0 <= c < self.size):
            return key, EDGE
        nxt = r * self.size + c
        return nxt, HOLE if nxt in self.holes else GOAL if nxt == self.goal else MOVED

    def won(self, key: int) -> bool:
        return key == self.goal

    def lost(self, key: int) -> bool:
        return key in self.holes

    def cell(self, key: int, i: int) -> str:
        if i == key:
            return "P"
        return "H" if i in self.holes else "G" if i == self.goal else "F"

    def readout_entries(self, key: int) -> list[str]:
        """Per action (ACTIONS order): what the move would step onto and whether it brings P closer to G (Manhattan
        distance), e.g. ``up H toward``, ``down F far``, ``left G toward``, ``right edge``."""
        n = self.size
        (pr, pc), (gr, gc) = divmod(key, n), divmod(self.goal, n)
        out = []
        for a in ACTIONS:
            r, c = pr + DELTAS[a][0], pc + DELTAS[a][1]
            if not (0 <= r < n and 0 <= c < n):
                out.append(f"{a} edge")
                continue
            closer = abs(r - gr) + abs(c - gc) < abs(pr - gr) + abs(pc - gc)
            out.append(f"{a} {self.cell(key, r * n + c)} {'toward' if closer else 'far'}")
        return out

    def render(self, key: int) -> str:
        n = self.size
        return render_cells([[self.cell(key, r * n + c) for c in range(n)] for r in range(n)])

    def size_params(self) -> dict[str, int]:
        return {"size": self.size, "holes": len(self.holes)}

    def to_meta(self) -> dict[str, Any]:
        rc = lambda i: list(divmod(i, self.size))  # noqa: E731
        return {
            "game": self.game,
            "size": self.size,
            "holes": [rc(h) for h in sorted(self.holes)],
            "start": rc(self.start),
            "goal": rc(self.goal),
            "rows": self.render(self.start).split("\n"),
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> FrozenLakeBoard:
        try:
            n = int(meta["size"])
            cell = lambda rc: _cell(n, rc, "meta")  # noqa: E731
            board = cls(n, frozenset(cell(h) for h in meta["holes"]), cell(meta["start"]), cell(meta["goal"]))
        except (KeyError, TypeError, ValueError, ConfigError) as e:
            raise TaskError(
                f"frozenlake: example meta is not a board ({e}); use meta from FrozenLakeTask.examples"
            ) from e
        if board.start == board.goal or {board.start, board.goal} & board.holes:
            raise TaskError(f"frozenlake: example meta has start/goal on a hole or on each other: {meta}")
        return board


def _cell(n: int, spec: Any, field: str) -> int:
    """A cell from [row, col] or a corner name."""
    if isinstance(spec, str) and spec in CORNERS:
        return {"top-left": 0, "top-right": n - 1, "bottom-left": n * (n - 1), "bottom-right": n * n - 1}[spec]
    if isinstance(spec, (list, tuple)) and len(spec) == 2 and all(isinstance(x, int) and 0 <= x < n for x in spec):
        return spec[0] * n + spec[1]
    raise ConfigError(f"{field}={spec!r} is invalid; use 'random', one of {CORNERS} or [row, col] inside {n}x{n}")


def shortest_path_length(board: FrozenLakeBoard, max_depth: int | None = None) -> int | None:
    """Moves on the shortest safe path from start to goal (None: no path, or none within `max_depth`)."""
    path = bfs_path(board, board.start, max_depth)
    return None if path is None else len(path)


def generate_board(
    rng: random.Random,
    size: int,
    holes: int,
    start: int | None,
    goal: int | None,
    min_path: int,
    max_path: int,
    tries: int = 10_000,
) -> FrozenLakeBoard:
    """A random board whose shortest safe path has min_path..max_path moves (start/goal None = random)."""
    cells = range(size * size)
    fixed = [c for c in (start, goal) if c is not None]
    for _ in range(tries):
        hole_set = frozenset(rng.sample([c for c in cells if c not in fixed], holes))
        free = [c for c in cells if c not in hole_set]
        s = start if start is not None else rng.choice([c for c in free if c != goal])
        g = goal if goal is not None else rng.choice([c for c in free if c != s])
        board = FrozenLakeBoard(size, hole_set, s, g)
        d = shortest_path_length(board, max_path)
        if d is not None and min_path <= d <= max_path:
            return board
    raise TaskError(
        f"frozenlake: no board with a safe path of {min_path}..{max_path} moves found for size={size}, holes={holes}; "
        "use fewer holes, a lower min_path or a larger step_budget"
    )


def greedy_action(state: GameState[int]) -> str:
    """Step toward G by Manhattan distance, blind to holes (ties: up, down, left, right); the no-context naive move."""
    board = state.board
    if not isinstance(board, FrozenLakeBoard):
        raise TaskError(f"frozenlake: greedy_action got a {type(board).__name__}, not a FrozenLakeBoard")
    n, (gr, gc) = board.size, divmod(board.goal, board.size)

    def dist(a: str) -> int:
        r, c = divmod(state.key, n)
        r, c = r + DELTAS[a][0], c + DELTAS[a][1]
        return abs(r - gr) + abs(c - gc) if 0 <= r < n and 0 <= c < n else 10 * n

    return min(ACTIONS, key=dist)


@dataclass(frozen=True)
class FrozenLakeOptions(GameOptions):
    """``--task frozenlake`` options (``--option KEY=VALUE``, a study's ``task_options:``): the board's and the
    game's."""

    size: int = option(4, "board side", range=Range(3, 6))
    holes: int = option(3, "holes on the board (at most size*size-2)", range=GE0)
    start: str | list[int] = option("random", f"the start cell: random, a corner ({', '.join(CORNERS)}) or [row, col]")
    goal: str | list[int] = option("random", "the goal cell, as start")
    min_path: int = option(3, "fewest moves on a board's shortest safe path (at most step_budget)", range=GE1)

    def check(self) -> None:
        super().check()
        if self.holes > self.size * self.size - 2:
            raise ConfigError(
                f"holes={self.holes} leave no room on a {self.size}x{self.size} board; use at most "
                f"{self.size * self.size - 2}"
            )
        start = None if self.start == "random" else _cell(self.size, self.start, "start")
        goal = None if self.goal == "random" else _cell(self.size, self.goal, "goal")
        if start is not None and start == goal:
            raise ConfigError(f"start={self.start!r} equals goal={self.goal!r}; pick two different cells")
        if self.min_path > self.step_budget:
            raise ConfigError(f"min_path={self.min_path} exceeds step_budget={self.step_budget}; lower it")


class FrozenLakeTask(GameTask):
    """FrozenLake boards as a `Task` (module docstring); one prompt per move, context spliced into the user turn."""

    name = "frozenlake"
    intro = INTRO
    default_context = CONTEXT
    outcomes = (MOVED, EDGE, HOLE, GOAL)
    symbols = ("P", "F", "H", "G")

    def __init__(self, o: FrozenLakeOptions):
        super().__init__(o)
        self.size, self.holes, self.min_path = o.size, o.holes, o.min_path
        self.start = None if o.start == "random" else _cell(o.size, o.start, "start")
        self.goal = None if o.goal == "random" else _cell(o.size, o.goal, "goal")

    def board_space(self) -> int:
        """Hole sets x start cells x goal cells (fixed start / goal: one choice each)."""
        cells, fixed = self.size * self.size, sum(c is not None for c in (self.start, self.goal))
        free = cells - self.holes
        return (
            math.comb(cells - fixed, self.holes)
            * (1 if self.start is not None else free)
            * (1 if self.goal is not None else free - 1)
        )

    def generate_board(self, rng: random.Random) -> FrozenLakeBoard:
        return generate_board(rng, self.size, self.holes, self.start, self.goal, self.min_path, self.step_budget)

    def board_from_meta(self, meta: dict[str, Any]) -> FrozenLakeBoard:
        return FrozenLakeBoard.from_meta(meta)

    def greedy_action(self, state: GameState[Any]) -> str:
        return greedy_action(state)

    def size_params(self) -> dict[str, int]:
        return {"size": self.size, "holes": self.holes}

    def readout_words(self) -> list[str]:
        if not self.readout:
            return []
        return ["up down left right F H G edge toward far ,"]


@register_task("frozenlake", options=FrozenLakeOptions, variant=EngineVariant("frozenlake"))
def make_frozenlake(o: FrozenLakeOptions) -> FrozenLakeTask:
    """``--task frozenlake`` (`FrozenLakeOptions`; ``engine=textarena``: TextArena's FrozenLake-v0). Reference
    setting: ``get_task("frozenlake", **REFERENCE)``."""
    return FrozenLakeTask(o)
