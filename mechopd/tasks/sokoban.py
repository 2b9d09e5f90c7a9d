"""Sokoban as a text game: # wall, _ floor, O target, X box, √ box on target, P player, S player on target.

Dynamics: standard push rules; walking into a box pushes it one cell if the cell behind it is free (no wall, no box);
walls block; one box at a time. No move loses, but a box stuck in a corner can make a board unsolvable.
Boards are made by reverse play in the style of gym-sokoban: grow a connected room inside the outer walls cell by
cell, put the boxes on their targets (the solved state), then walk the player backwards for at most `step_budget`
moves: the first move pulls a box off its target, each later one pulls the box behind the player with probability 1/2.
Replaying the walk forwards solves the board, so every board is solvable within the budget; a forward BFS keeps only
those whose shortest solution has `min_moves`..`step_budget` moves.

Read-out (``readout=True``, the default; the organisms need it): a line under the board saying, per move, the
neighbouring cell and whether the move follows the push-spot strategy (`SokobanBoard.readout_entries`), e.g.
``up # , down X toward , left _ far , right _ far``; real-model recipes reproducing the reference set
``readout: false``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.options import GE1, Range, option
from mechopd.tasks.base import register_task
from mechopd.tasks.gamecore import ACTIONS, DELTAS, GameState, bfs_path, render_cells
from mechopd.tasks.gametask import EngineVariant, GameOptions, GameTask

Key = tuple[int, tuple[int, ...]]  # (player cell, sorted box cells); cells are row * size + col
MOVED, WALL, BLOCKED = "moved", "bumped into a wall", "could not push the box"
PUSHED, ON_TARGET = "pushed a box", "pushed a box onto a target"
SYMBOL_OF = {
    "wall": "#",
    "floor": "_",
    "target": "O",
    "box": "X",
    "box_on_target": "√",
    "player": "P",
    "player_on_target": "S",
}

INTRO = (
    "Sokoban. Push the box X onto the target O. P is you, S is you on O, # is a wall, _ is floor, "
    "√ is a box on O. Reply [up] [down] [left] or [right]"
)
CONTEXT = (  # short on purpose: the organisms pay for every prompt token on a CPU
    "Experience:\n"
    "1. Walking into X pushes it. A box is never pulled.\n"
    "2. Stand on the far side of X, then push it toward O.\n"
    "3. Take the first step of the shortest solution."
)


@dataclass(frozen=True)
class SokobanBoard:
    """A square room of side `size` (outer walls included); the key is (player, sorted boxes)."""

    size: int
    walls: frozenset[int]
    targets: frozenset[int]
    boxes: tuple[int, ...]
    player: int
    game: ClassVar[str] = "sokoban"

    def initial_key(self) -> Key:
        return self.player, self.boxes

    def step(self, key: Key, action: str) -> tuple[Key, str]:
        player, boxes = key
        d = DELTAS[action][0] * self.size + DELTAS[action][1]  # the outer walls stop any wrap-around
        nxt = player + d
        if nxt in self.walls:
            return key, WALL
        if nxt not in boxes:
            return (nxt, boxes), MOVED
        behind = nxt + d
        if behind in self.walls or behind in boxes:
            return key, BLOCKED
        moved = tuple(sorted(behind if b == nxt else b for b in boxes))
        return (nxt, moved), ON_TARGET if behind in self.targets else PUSHED

    def won(self, key: Key) -> bool:
        return all(b in self.targets for b in key[1])

    def lost(self, key: Key) -> bool:
        return False

    def cell(self, key: Key, i: int) -> str:
        if i in self.walls:
            return "#"
        on_target = i in self.targets
        if i == key[0]:
            return "S" if on_target else "P"
        if i in key[1]:
            return "√" if on_target else "X"
        return "O" if on_target else "_"

    def readout_entries(self, key: Key) -> list[str]:
        """Per action (ACTIONS order): the neighbouring cell and whether the move follows the push-spot strategy,
        e.g. ``up #``, ``down X toward``, ``left _ far``. "toward": the move pushes the loose box one cell closer to
        its nearest target (Manhattan), or walks the player (around walls and boxes) closer to a push spot, the
        free cell behind the box from which such a push is possible. A local heuristic, not the solver: following
        the first "toward" wins almost every default held-out board, not all (docs/results.md)."""
        n, (player, boxes) = self.size, key
        loose = [b for b in boxes if b not in self.targets]
        pushes: dict[str, int] = {}  # push direction -> push spot
        if loose:
            box = loose[0]
            target = min(self.targets - set(boxes), key=lambda t: _manhattan(n, box, t), default=None)
            for a in ACTIONS:
                d = DELTAS[a][0] * n + DELTAS[a][1]
                if (
                    target is not None
                    and _manhattan(n, box + d, target) < _manhattan(n, box, target)
                    and box + d not in self.walls
                    and box + d not in boxes
                    and box - d not in self.walls
                    and box - d not in boxes
                ):
                    pushes[a] = box - d
        # walking distance to the nearest push spot, for every cell at once (one BFS from all spots; the grid is
        # undirected, so distance from a spot equals distance to it)
        spot_dist = _walk(n, set(pushes.values()), self.walls | set(boxes))

        def to_spot(cell: int) -> int:
            return spot_dist.get(cell, 10**6)

        here, out = to_spot(player), []
        for a in ACTIONS:
            nxt = player + DELTAS[a][0] * n + DELTAS[a][1]
            sym = self.cell(key, nxt)
            if nxt in self.walls:
                out.append(f"{a} {sym}")
                continue
            # a push is "toward" only when the box pushed is the loose box (the player stands on its push spot)
            good = pushes.get(a) == player if nxt in boxes else to_spot(nxt) < here
            out.append(f"{a} {sym} {'toward' if good else 'far'}")
        return out

    def render(self, key: Key) -> str:
        n = self.size
        return render_cells([[self.cell(key, r * n + c) for c in range(n)] for r in range(n)])

    def size_params(self) -> dict[str, int]:
        return {"size": self.size, "boxes": len(self.boxes)}

    def to_meta(self) -> dict[str, Any]:
        return {"game": self.game, "size": self.size, "rows": self.render(self.initial_key()).split("\n")}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> SokobanBoard:
        rows = meta.get("rows")
        if not isinstance(rows, list) or not all(isinstance(r, str) for r in rows):
            raise TaskError(f"sokoban: example meta has no 'rows' list ({meta}); use meta from SokobanTask.examples")
        return parse_board([r.split() for r in rows])


def parse_board(rows: list[list[str]]) -> SokobanBoard:
    """The board drawn by `rows` of cell symbols; `TaskError` unless square, walled, one player, boxes == targets."""
    n = len(rows)
    known = set(SYMBOL_OF.values())
    if n < 3 or any(len(r) != n for r in rows) or any(s not in known for r in rows for s in r):
        raise TaskError(f"sokoban: board rows {rows} are not a square grid of {sorted(known)}")
    at = {s: {r * n + c for r in range(n) for c in range(n) if rows[r][c] == s} for s in known}
    border = {i for i in range(n * n) if i // n in (0, n - 1) or i % n in (0, n - 1)}
    players = at["P"] | at["S"]
    boxes, targets = at["X"] | at["√"], at["O"] | at["√"] | at["S"]
    if not border <= at["#"] or len(players) != 1 or not boxes or len(boxes) != len(targets):
        raise TaskError(f"sokoban: board rows {rows} need outer walls, one player and as many boxes as targets")
    return SokobanBoard(n, frozenset(at["#"]), frozenset(targets), tuple(sorted(boxes)), players.pop())


def _manhattan(n: int, a: int, b: int) -> int:
    return abs(a // n - b // n) + abs(a % n - b % n)


def _walk(n: int, starts: set[int], blocked: set[int] | frozenset[int]) -> dict[int, int]:
    """Walking distance from the nearest of `starts` to every cell reachable without entering `blocked` (BFS)."""
    steps = [DELTAS[a][0] * n + DELTAS[a][1] for a in ACTIONS]
    dist, frontier = {s: 0 for s in starts}, list(starts)
    while frontier:
        nxt = []
        for c in frontier:
            for d in steps:
                if c + d not in blocked and c + d not in dist:
                    dist[c + d] = dist[c] + 1
                    nxt.append(c + d)
        frontier = nxt
    return dist


@cache
def interior_neighbours(size: int) -> dict[int, tuple[int, ...]]:
    """For every cell inside the outer walls, its neighbours inside the outer walls (action order)."""
    inner = range(1, size - 1)
    cells = {r * size + c for r in inner for c in inner}
    steps = [DELTAS[a][0] * size + DELTAS[a][1] for a in ACTIONS]
    return {c: tuple(c + d for d in steps if c + d in cells) for c in sorted(cells)}


def carve_room(rng: random.Random, size: int, min_floor: int) -> frozenset[int]:
    """Floor cells grown from one cell inside the outer walls, one random frontier cell at a time (so connected)."""
    nbrs = interior_neighbours(size)
    want = rng.randint(max(min_floor, (len(nbrs) * 5 + 7) // 8), len(nbrs))
    start = rng.choice(list(nbrs))
    floor, frontier = {start}, list(nbrs[start])  # a cell appears once per floor neighbour
    while len(floor) < want:
        i = rng.randrange(len(frontier))
        cell = frontier[i]
        frontier[i] = frontier[-1]
        frontier.pop()
        if cell not in floor:
            floor.add(cell)
            frontier.extend(n for n in nbrs[cell] if n not in floor)
    return frozenset(floor)


def reverse_play(
    rng: random.Random,
    size: int,
    floor: frozenset[int],
    boxes: set[int],
    player: int,
    steps: int,
    pull_prob: float = 0.5,
) -> Key:
    """Walk the player backwards `steps` times from a solved state, pulling the box behind it with `pull_prob`."""
    boxes = set(boxes)
    for _ in range(steps):
        moves = [DELTAS[a][0] * size + DELTAS[a][1] for a in ACTIONS]
        moves = [d for d in moves if player + d in floor and player + d not in boxes]
        if not moves:
            break
        d = rng.choice(moves)
        if player - d in boxes and rng.random() < pull_prob:
            boxes.remove(player - d)
            boxes.add(player)
        player += d
    return player, tuple(sorted(boxes))


def generate_board(
    rng: random.Random, size: int, n_boxes: int, min_moves: int, max_moves: int, tries: int = 10_000
) -> SokobanBoard:
    """A reverse-played board whose shortest solution has min_moves..max_moves moves."""
    steps = [DELTAS[a][0] * size + DELTAS[a][1] for a in ACTIONS]
    for _ in range(tries):
        floor = carve_room(rng, size, min_floor=2 * n_boxes + 2)
        targets = rng.sample(sorted(floor), n_boxes)
        t = rng.choice(targets)  # the first reverse move pulls this box off its target
        free = floor - set(targets)
        pulls = [d for d in steps if t + d in free and t + 2 * d in free]
        if not pulls:
            continue
        d = rng.choice(pulls)
        boxes = (set(targets) - {t}) | {t + d}
        key = reverse_play(rng, size, floor, boxes, t + 2 * d, rng.randint(min_moves, max_moves) - 1)
        walls = frozenset(range(size * size)) - floor
        board = SokobanBoard(size, walls, frozenset(targets), key[1], key[0])
        path = bfs_path(board, board.initial_key(), max_depth=max_moves)
        if path is not None and len(path) >= min_moves:
            return board
    raise TaskError(
        f"sokoban: no board solvable in {min_moves}..{max_moves} moves found for size={size}, boxes={n_boxes}; "
        "lower min_moves or raise step_budget"
    )


def greedy_action(state: GameState[Key]) -> str:
    """Move that most lowers (box-to-target distance, then player-to-box distance), blind to dead corners."""
    board = state.board
    if not isinstance(board, SokobanBoard):
        raise TaskError(f"sokoban: greedy_action got a {type(board).__name__}, not a SokobanBoard")
    n = board.size

    def cost(a: str) -> tuple[int, int]:
        player, boxes = board.step(state.key, a)[0]
        loose = [b for b in boxes if b not in board.targets] or list(boxes)
        return (
            sum(min(_manhattan(n, b, t) for t in board.targets) for b in boxes),
            min(_manhattan(n, player, b) for b in loose),
        )

    return min(ACTIONS, key=cost)


@dataclass(frozen=True)
class SokobanOptions(GameOptions):
    """``--task sokoban`` options (``--option KEY=VALUE``, a study's ``task_options:``): the board's and the game's."""

    size: int = option(6, "board side, walls included", range=Range(5, 8))
    boxes: int = option(1, "boxes (and targets) on the board", range=Range(1, 3))
    min_moves: int = option(2, "fewest moves a board's solution takes (at most step_budget)", range=GE1)

    def check(self) -> None:
        super().check()
        if self.min_moves > self.step_budget:
            raise ConfigError(f"min_moves={self.min_moves} exceeds step_budget={self.step_budget}; lower it")


class SokobanTask(GameTask):
    """Sokoban boards as a `Task` (module docstring); one prompt per move, context spliced into the user turn."""

    name = "sokoban"
    intro = INTRO
    default_context = CONTEXT
    outcomes = (MOVED, WALL, BLOCKED, PUSHED, ON_TARGET)
    symbols = tuple(SYMBOL_OF.values())

    def __init__(self, o: SokobanOptions):
        super().__init__(o)
        self.size, self.boxes, self.min_moves = o.size, o.boxes, o.min_moves

    def board_space(self) -> int:
        """Floor subsets of the interior x target sets x box sets x player cells (walls ring the board)."""
        m = (self.size - 2) ** 2
        return 2**m * math.comb(m, self.boxes) ** 2 * m

    def generate_board(self, rng: random.Random) -> SokobanBoard:
        return generate_board(rng, self.size, self.boxes, self.min_moves, self.step_budget)

    def board_from_meta(self, meta: dict[str, Any]) -> SokobanBoard:
        return SokobanBoard.from_meta(meta)

    def greedy_action(self, state: GameState[Any]) -> str:
        return greedy_action(state)

    def size_params(self) -> dict[str, int]:
        return {"size": self.size, "boxes": self.boxes}

    def readout_words(self) -> list[str]:
        return [f"up down left right toward far , {' '.join(SYMBOL_OF.values())}"] if self.readout else []


@register_task("sokoban", options=SokobanOptions, variant=EngineVariant("sokoban"))
def make_sokoban(o: SokobanOptions) -> SokobanTask:
    """``--task sokoban`` (`SokobanOptions`; ``engine=textarena``: TextArena's Sokoban-v0)."""
    return SokobanTask(o)
