"""The embedded FrozenLake and Sokoban follow TextArena's rules (the papers' engine, FrozenLake-v0 / Sokoban-v0), and
``engine: textarena`` plays TextArena itself. Skipped without the optional extra (pip install mechopd[textarena]).

Cross-check: TextArena generates a seeded board; the embedded `Board` with the same cells plays the same replies; after
every reply both must show the same board (player, boxes), agree on invalid moves, and end the same way. One rule
differs by design and is pinned here: TextArena ends a game (lost) at the SECOND CONSECUTIVE invalid move, the
embedded games just spend the move (docs/method.md §4: a move is spent per reply, up to the step budget).
"""

from __future__ import annotations

import random

import pytest

ta = pytest.importorskip("textarena", reason="textarena is an optional extra: pip install mechopd[textarena]")

from mechopd.tasks import frozenlake, sokoban  # noqa: E402
from mechopd.tasks.gamecore import GameEpisode, parse_action  # noqa: E402
from mechopd.tasks.textarena_engine import board_of, make_env, reset  # noqa: E402

REPLIES = ["[up]", "[down]", "[left]", "[right]", "[w]", "[a]", "[s]", "[d]", "no move", "[UP]"]
INVALID_OUTCOME = {"frozenlake": {frozenlake.EDGE}, "sokoban": {sokoban.WALL, sokoban.BLOCKED}}


def ta_cells(game: str, env) -> list[list[str]]:
    if game == "frozenlake":
        grid, (pr, pc) = env.state.game_state["grid"], env.state.game_state["player_pos"]
        cells = [["F" if s == " " else s for s in row] for row in grid]
        cells[pr][pc] = "P"
        return cells
    cells = [r.split() for r in env.create_board_str(env.room_state).strip().split("\n")]
    r, c = (int(v) for v in env.player_position)
    if int(env.room_fixed[r][c]) == 2:  # TextArena draws the player on a target as P, the embedded game as S
        assert cells[r][c] == "P"
        cells[r][c] = "S"
    return cells


def ours_cells(ep: GameEpisode) -> list[list[str]]:
    return [r.split() for r in ep.board.render(ep.key).split("\n")]


def play_both(game: str, env, seed: int, moves: int = 10) -> dict[str, int]:
    """Play the same seeded replies in TextArena and the embedded game; assert agreement after every reply."""
    ep = GameEpisode(board_of(game, env), "", step_budget=moves + 1)
    rng = random.Random(seed)
    stats = {"moves": 0, "invalid": 0, "won": 0, "lost": 0, "double_invalid": 0}
    prev_invalid = False
    assert ta_cells(game, env) == ours_cells(ep)  # same board
    for _ in range(moves):
        reply = rng.choice(REPLIES) if rng.random() < 0.3 else rng.choice(REPLIES[:4])
        ended, _ = env.step(reply)
        ep.step(reply)
        a, outcome = ep.history[-1]
        ours_invalid = a is None or outcome in INVALID_OUTCOME[game]
        ta_invalid = env.state.error_count > 0 or bool(env.state.game_info[0].get("invalid_move"))
        assert ta_invalid == ours_invalid, (seed, reply, outcome)
        assert ta_cells(game, env) == ours_cells(ep), (seed, reply)  # same positions after the same move
        stats["moves"] += 1
        stats["invalid"] += int(ours_invalid)
        if env.state.game_info[0].get("invalid_move"):  # TextArena: second consecutive invalid move loses
            assert prev_invalid and ours_invalid and not ep.done
            stats["double_invalid"] += 1
            return stats
        ta_won = bool(ended) and env.state.rewards.get(0) == 1
        assert bool(ended) == (ep.won or ep.board.lost(ep.key)), (seed, reply)
        assert ta_won == ep.won
        if ended:
            stats["won" if ep.won else "lost"] += 1
            return stats
        prev_invalid = ours_invalid
    return stats


@pytest.mark.slow
@pytest.mark.parametrize(
    "game,size,count,n",
    [
        ("frozenlake", 4, 3, 300),
        ("frozenlake", 3, 2, 100),
        ("sokoban", 6, 1, 200),
        ("sokoban", 6, 2, 50),
        ("sokoban", 6, 3, 20),
    ],
)
def test_embedded_game_follows_textarena_rules(game, size, count, n):
    """FrozenLake-v0 (4x4, 3 holes), the papers' 3x3 / 2 holes; Sokoban 6x6 with the papers' 1 box, 2, and
    Sokoban-v0's 3 boxes."""
    env = make_env(game, size, count, step_budget=100)
    total: dict[str, int] = {}
    for seed in range(n):
        reset(env, seed)
        for k, v in play_both(game, env, seed).items():
            total[k] = total.get(k, 0) + v
    # the boards exercised every rule: wins, invalid moves, the double-invalid loss (and holes on FrozenLake)
    assert total["invalid"] > 0 and total["double_invalid"] > 0, total
    if count < 3:  # random replies rarely solve three boxes
        assert total["won"] > 0, total
    if game == "frozenlake":
        assert total["lost"] > 0, total


def test_reply_parsing_differences_are_pinned():
    """How a reply is read differs, not the rules: TextArena plays the FIRST bracketed action, the embedded parser
    (the reference code's) the LAST; TextArena's Sokoban refuses spaces inside the brackets (``[ up ]``), its FrozenLake
    and the embedded parser accept them. Single-action replies without spaces (the cross-check's) read the same."""
    env = make_env("frozenlake", 4, 3, 100)
    reset(env, 0)
    start = env.state.game_state["player_pos"]
    env.step("[down] then [right]")
    assert env.state.game_state["player_pos"] == (start[0] + 1, start[1])
    assert parse_action("[down] then [right]") == "right"
    reset(env, 0)
    env.step("[ down ]")
    assert env.state.game_state["player_pos"] == (start[0] + 1, start[1]) and parse_action("[ down ]") == "down"
    box = make_env("sokoban", 6, 1, 100)
    reset(box, 0)
    box.step("[ up ]")
    assert box.state.error_count == 1  # TextArena Sokoban: invalid format


def test_engine_textarena_plays_the_real_environment():
    from mechopd.tasks.base import get_task
    from mechopd.tasks.gamecore import split_of

    for game in ("frozenlake", "sokoban"):
        task = get_task(game, engine="textarena")
        exs = task.examples("test", 3, 0)
        assert all(split_of(e.uid) == "test" for e in exs) and len({e.uid for e in exs}) == 3
        assert not {e.uid for e in exs} & {e.uid for e in task.examples("train", 20, 0)}
        ep = task.new_episode(exs[0])
        first = ep.prompt()
        assert "Current Board" in first and first == exs[0].prompt  # TextArena's own text, replayed by seed
        sol = exs[0].meta.get("rows")
        assert sol and task.context
        ep.step("I will go [up]")
        assert ep.steps == 1 and "I will go [up]" in ep.prompt()
        while not ep.done:
            ep.step("nothing")  # invalid replies: the second in a row ends the game (TextArena's rule)
        assert ep.invalid_moves >= 1 and not ep.won and ep.steps <= 3


def test_engine_textarena_solves_with_the_embedded_solution():
    """Replaying the embedded BFS solution of the converted board wins TextArena's game (same rules, same board)."""
    from mechopd.tasks.gamecore import bfs_path
    from mechopd.tasks.textarena_engine import TextArenaEpisode

    for game, size, count in (("frozenlake", 4, 3), ("sokoban", 6, 1)):
        env = make_env(game, size, count, 100)
        for seed in range(30):
            reset(env, seed)
            path = bfs_path(board_of(game, env), board_of(game, env).initial_key())
            if not path:
                continue
            ep = TextArenaEpisode(env, step_budget=len(path))
            for a in path:
                ep.step(f"[{a}]")
            assert ep.won, (game, seed, path)


@pytest.mark.slow
def test_paper_sokoban_recipe_on_the_textarena_engine(zoo, tmp_path):
    """The paper's Sokoban recipe, as shipped, on TextArena's environment (engine: textarena) with the qwen3 fixture."""
    import json
    from pathlib import Path

    from .helpers import cli

    recipe = Path(__file__).resolve().parents[2] / "training" / "paper" / "qwen3-4b-sokoban-nca.yaml"
    sets = {
        "student": zoo.student("qwen3"),
        "task_options.engine": "textarena",
        "task_options.max_new_tokens": 4,
        "steps": 1,
        "batch_size": 2,
        "max_new_tokens": 4,
        "eval_every": 1,
        "eval_n": 2,
        "save_every": 0,
        "pool_size": 4,
    }
    out = tmp_path / "ta"
    cli("train", recipe, *[x for k, v in sets.items() for x in ("--set", f"{k}={v}")], "--out", out, "--no-progress")
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in recs if "loss" in r][0]
    assert step["samples"] >= 2 and "train_win_rate" in step and any("eval/acc_x" in r for r in recs)


def test_engine_episodes_equal_a_fresh_reset():
    """new_episode reuses a copy of the just-reset environment; it plays exactly like a fresh ``reset(seed)``."""
    from mechopd.tasks.base import get_task
    from mechopd.tasks.textarena_engine import TextArenaEpisode

    task = get_task("sokoban", engine="textarena", step_budget=5)
    for ex in task.examples("train", 8, 1):
        ep, env = task.new_episode(ex), make_env("sokoban", 6, 1, 5)
        reset(env, ex.meta["ta_seed"])
        ref = TextArenaEpisode(env, 5)
        for reply in ("[up]", "[left]", "x", "[down]"):
            assert ep.prompt() == ref.prompt()
            ep.step(reply)
            ref.step(reply)
            assert (ep.done, ep.won, ep.invalid_moves) == (ref.done, ref.won, ref.invalid_moves)
            if ep.done:
                break
