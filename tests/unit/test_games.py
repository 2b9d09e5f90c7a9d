"""FrozenLake and Sokoban: parsing, dynamics, BFS against brute force, generators, hashing/splits, episodes, vocab,
pretraining corpus and the expert / weak policy win rates."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mechopd.core.errors import ConfigError, TaskError
from mechopd.tasks import frozenlake as fl
from mechopd.tasks import sokoban as sk
from mechopd.tasks.base import Episode, Example, check_disjoint, get_task
from mechopd.tasks.gamecore import (
    ACTIONS,
    GameState,
    bfs_path,
    board_hash,
    expert_action,
    optimal_actions,
    parse_action,
    readout_line,
    split_of,
)
from mechopd.tasks.gametask import policy_win_rate
from mechopd.tasks.words import split_words

FROZENLAKE = functools.partial(get_task, "frozenlake")
SOKOBAN = functools.partial(get_task, "sokoban")


def brute_force(board, key, max_len: int) -> list[str] | None:
    """Slow reference: try every action sequence, shortest first, in action order; first that wins (never lost)."""
    for length in range(max_len + 1):
        for seq in itertools.product(ACTIONS, repeat=length):
            k, alive = key, True
            for a in seq:
                if board.won(k) or board.lost(k):
                    alive = False
                    break
                k, _ = board.step(k, a)
            if alive and board.won(k):
                return list(seq)
    return None


def random_frozenlake(rng: random.Random, n: int) -> fl.FrozenLakeBoard:
    cells = list(range(n * n))
    s, g = rng.sample(cells, 2)
    holes = rng.sample([c for c in cells if c not in (s, g)], rng.randint(0, n * n // 3))
    return fl.FrozenLakeBoard(n, frozenset(holes), s, g)


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    "text, action",
    [
        ("[up]", "up"),
        ("I go [left] then [right]", "right"),
        ("[UP]", "up"),
        ("[ right ]", "right"),
        ("[ d ]", "right"),
        ("[w]", "up"),
        ("[a] [s]", "down"),
        ("[down] and then [foo]", "down"),
        ("go right", None),
        ("[upp]", None),
        ("", None),
        ("[]", None),
        ("[r ight]", None),
        ("up]", None),
    ],
)
def test_parse_action(text, action):
    assert parse_action(text) == action


# ------------------------------------------------------------------ dynamics


def test_frozenlake_dynamics():
    board = fl.FrozenLakeBoard(3, frozenset({1}), 0, 8)  # P H F / F F F / F F G
    assert board.render(0) == "P H F\nF F F\nF F G"
    assert board.step(0, "up") == (0, fl.EDGE) and board.step(0, "left") == (0, fl.EDGE)
    key, outcome = board.step(0, "right")
    assert (key, outcome) == (1, fl.HOLE) and board.lost(key)
    assert board.step(7, "right") == (8, fl.GOAL) and board.won(8)
    ep = get_task("frozenlake", size=3, holes=1).new_episode(Example("u", "", "", meta=board.to_meta()))
    ep.step("[right]")
    assert ep.done and not ep.won and ep.steps == 1


def grid(*rows: str) -> sk.SokobanBoard:
    return sk.parse_board([r.split() for r in rows])


def test_sokoban_dynamics_and_rendering():
    rows = ["# # # # # #", "# _ _ _ _ #", "# _ P X O #", "# _ X _ _ #", "# _ O _ _ #", "# # # # # #"]
    board = grid(*rows)
    key = board.initial_key()
    assert board.render(key) == "\n".join(rows)
    pushed, outcome = board.step(key, "right")  # box onto the target
    assert outcome == sk.ON_TARGET and board.render(pushed).split("\n")[2] == "# _ _ P √ #"
    assert not board.won(pushed) and board.won(board.step(board.step(pushed, "left")[0], "down")[0])
    assert board.step(pushed, "right") == (pushed, sk.BLOCKED)  # box against the wall: nothing moves
    down, outcome = board.step(key, "down")
    assert outcome == sk.ON_TARGET and board.render(down).split("\n")[3:5] == ["# _ P _ _ #", "# _ √ _ _ #"]
    assert board.step(board.step(key, "left")[0], "right") == ((key[0], key[1]), sk.MOVED)
    walled = grid("# # # # #", "# P X # #", "# _ O _ #", "# _ _ _ #", "# # # # #")
    assert walled.step(walled.initial_key(), "right") == (walled.initial_key(), sk.BLOCKED)  # box into a wall
    assert walled.step(walled.initial_key(), "up") == (walled.initial_key(), sk.WALL)
    two = grid("# # # # # #", "# P X X O #", "# _ _ _ O #", "# _ _ _ _ #", "# _ _ _ _ #", "# # # # # #")
    assert two.step(two.initial_key(), "right") == (two.initial_key(), sk.BLOCKED)  # a box cannot push a box
    on_target = grid("# # # # #", "# S _ # #", "# _ X _ #", "# _ _ _ #", "# # # # #")
    moved, _ = on_target.step(on_target.initial_key(), "down")
    assert on_target.render(moved).split("\n")[1:3] == ["# O _ # #", "# P X _ #"]
    for bad in (["# #", "# P"], ["# # #", "# P #", "# # #"], ["# # # #", "# P X #", "# X O #", "# # # #"]):
        with pytest.raises(TaskError):
            sk.parse_board([r.split() for r in bad])


# ------------------------------------------------------------------ search


def test_bfs_matches_brute_force_frozenlake():
    rng = random.Random(0)
    boards = [random_frozenlake(rng, n) for n in (3, 3, 4, 4, 4) for _ in range(8)]
    reference = get_task("frozenlake", **fl.REFERENCE)
    boards += [b for split in ("train", "test") for _, b in reference.board_stream(split, 0)]
    found = 0
    for b in boards:
        want = brute_force(b, b.start, 5)
        assert bfs_path(b, b.start, max_depth=5) == want
        found += want is not None
    assert 0 < found < len(boards)  # both solvable and unsolvable boards were compared


def test_bfs_matches_brute_force_sokoban():
    task = get_task("sokoban", boxes=1)
    rng = random.Random(1)
    for ex in task.examples("train", 12, 3) + get_task("sokoban", boxes=2, size=5).examples("train", 6, 3):
        board = sk.SokobanBoard.from_meta(ex.meta)
        floor = [c for c in range(board.size**2) if c not in board.walls and c not in board.boxes]
        for player in [board.player, rng.choice(floor)]:  # also start the player elsewhere
            key = (player, board.boxes)
            assert bfs_path(board, key, max_depth=5) == brute_force(board, key, 5)


def test_expert_replays_bfs_and_optimal_actions_are_shortest():
    for task in (get_task("frozenlake"), get_task("sokoban")):
        for ex in task.examples("test", 10, 0):
            ep = task.new_episode(ex)
            for a in ex.meta["solution"]:
                state = ep.state
                assert expert_action(state) == a
                opt = optimal_actions(state)
                assert a in opt and opt == [x for x in ACTIONS if x in opt]
                rest = len(bfs_path(state.board, state.key))
                for x in ACTIONS:  # slow reference: optimal iff brute force from the successor is one move shorter
                    k2 = state.board.step(state.key, x)[0]
                    sol = brute_force(state.board, k2, rest - 1) if not state.board.lost(k2) else None
                    assert (x in opt) == (sol is not None and len(sol) == rest - 1)
                ep.step(f"[{a}]")
            assert ep.won and ep.steps == ex.meta["optimal_moves"] and expert_action(ep.state) is None


# ------------------------------------------------------------------ generators, hashes, splits


@pytest.mark.parametrize("make", [FROZENLAKE, SOKOBAN])
def test_generators_deterministic_and_prefix_stable(make):
    a = make().examples("train", 40, 5)
    b = make().examples("train", 40, 5)
    assert [(e.uid, e.prompt, e.meta) for e in a] == [(e.uid, e.prompt, e.meta) for e in b]
    assert [e.uid for e in make().examples("train", 10, 5)] == [e.uid for e in a[:10]]
    assert {e.uid for e in make().examples("train", 40, 6)} != {e.uid for e in a}
    assert len({e.uid for e in a}) == 40


def test_generated_boards_satisfy_their_options():
    task = get_task("frozenlake", size=5, holes=4, start=[0, 0], goal="bottom-right", min_path=8, step_budget=9)
    for ex in task.examples("train", 30, 0):
        b = fl.FrozenLakeBoard.from_meta(ex.meta)
        assert (b.start, b.goal, len(b.holes)) == (0, 24, 4) and 8 == ex.meta["optimal_moves"]
    for size, boxes in ((6, 1), (7, 2)):
        for ex in get_task("sokoban", size=size, boxes=boxes).examples("train", 30, 0):
            b = sk.SokobanBoard.from_meta(ex.meta)
            assert len(b.boxes) == len(b.targets) == boxes and b.size == size
            sol = brute_force(b, b.initial_key(), 5)
            assert sol is not None and 2 <= len(sol) == ex.meta["optimal_moves"]


def test_board_hash_is_sha1_of_params_and_render():
    b = fl.FrozenLakeBoard(3, frozenset({1, 5}), 0, 8)
    want = hashlib.sha1(b"frozenlake|holes=2,size=3\nP H F\nF F H\nF F G").hexdigest()
    assert board_hash(b) == want and split_of(want) == ("test" if int(want[:8], 16) % 10 == 0 else "train")


def test_hashes_stable_across_processes():
    code = (
        "from mechopd.tasks import get_task;"
        "print(*[e.uid for t in (get_task('sokoban'), get_task('frozenlake')) for e in t.examples('test', 3, 9)])"
    )
    repo = str(Path(fl.__file__).resolve().parents[2])  # the directory holding mechopd/
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    here = [e.uid for t in (get_task("sokoban"), get_task("frozenlake")) for e in t.examples("test", 3, 9)]
    assert out.stdout.split() == here


@pytest.mark.parametrize("make", [FROZENLAKE, SOKOBAN])
def test_splits_disjoint_by_construction(make):
    task = make()
    train, test = task.examples("train", 300, 0), task.examples("test", 30, 0)
    assert all(split_of(e.uid) == "train" for e in train) and all(split_of(e.uid) == "test" for e in test)
    check_disjoint(train, test)
    with pytest.raises(TaskError):
        check_disjoint(train, test + train[:1])


def test_reference_frozenlake_has_19_boards_and_no_test_split():
    valid = [
        h
        for h in itertools.combinations(range(1, 8), 2)
        if brute_force(fl.FrozenLakeBoard(3, frozenset(h), 0, 8), 0, 8) is not None
    ]
    task = get_task("frozenlake", **fl.REFERENCE)
    n_train, n_test = (len(list(task.board_stream(s, 0))) for s in ("train", "test"))
    assert len(valid) == 19 == n_train + n_test
    for split, count in (("train", n_train), ("test", n_test)):
        with pytest.raises(TaskError, match="unique"):
            task.examples(split, count + 1, 0)


def test_options_validated():
    with pytest.raises(ConfigError, match="size"):
        get_task("frozenlake", size=9)
    with pytest.raises(ConfigError, match="unknown"):
        get_task("sokoban", holes=3)
    with pytest.raises(ConfigError, match="start"):
        get_task("frozenlake", start=[5, 0])
    with pytest.raises(ConfigError, match="weak_policy"):
        get_task("frozenlake", weak_policy="clever")
    with pytest.raises(TaskError):
        get_task("frozenlake").examples("val", 3, 0)
    assert get_task("sokoban", boxes=2).boxes == 2 and get_task("frozenlake", size=5).size == 5


# ------------------------------------------------------------------ episodes, scoring


@pytest.mark.parametrize("make", [FROZENLAKE, SOKOBAN])
def test_episode_plays_solution_from_json_meta(make):
    task = make()
    ex = task.examples("test", 1, 2)[0]
    ex = Example(ex.uid, ex.prompt, ex.context, meta=json.loads(json.dumps(ex.meta)))
    ep = task.new_episode(ex)
    assert isinstance(ep, Episode) and ep.prompt() == ex.prompt
    for i, a in enumerate(ex.meta["solution"], 1):
        assert not ep.done and f"move {i} of 5" in ep.prompt()
        ep.step(f"I think [ {a.upper()} ]")
    assert ep.done and ep.won and ep.invalid_moves == 0 and [a for a, _ in ep.history] == ex.meta["solution"]
    with pytest.raises(RuntimeError):
        ep.prompt()


def test_invalid_moves_count_as_steps():
    task = get_task("sokoban")
    ex = task.examples("train", 1, 0)[0]
    ep = task.new_episode(ex)
    board_text = ex.prompt.split("\n")[-6:]
    ep.step("no idea")
    ep.step("[jump]")
    assert (ep.steps, ep.invalid_moves, ep.done) == (2, 2, False)
    assert ep.prompt().split("\n")[-6:] == board_text and "move 2: invalid reply, no move." in ep.prompt()
    for _ in range(3):
        ep.step("")
    assert ep.done and not ep.won and ep.invalid_moves == 5 == ep.steps


def test_score_is_optimal_first_move():
    task = get_task("frozenlake")
    for ex in task.examples("test", 10, 0):
        board = fl.FrozenLakeBoard.from_meta(ex.meta)
        opt = optimal_actions(GameState(board, board.start))
        assert [a for a in ACTIONS if task.score(ex, f"[{a}]")] == opt and ex.meta["solution"][0] in opt
        assert not task.score(ex, "nothing")


# ------------------------------------------------------------------ vocabulary, corpus, policies


@pytest.mark.parametrize("make", [FROZENLAKE, SOKOBAN])
def test_vocab_covers_all_texts(make):
    task = make(context="Holes end games : avoid them , 2 times .") if make is FROZENLAKE else make()
    vocab = set(task.vocab())
    texts = [task.context, *(t for c, p, r in task.pretrain_corpus(400, 0) for t in (p, r))]
    rng = random.Random(0)
    for ex in task.examples("test", 10, 0):
        ep = task.new_episode(ex)
        while not ep.done:
            texts.append(ep.prompt())
            ep.step(rng.choice(["[up]", "[d]", "[ left ]", "junk"]))
    words = {w for t in texts for w in split_words(t)}
    assert words <= vocab, sorted(words - vocab)
    default_texts = [make().context, make().intro, *texts[1:]]
    assert not [t for t in default_texts if re.search(r"[^\w\s]{2,}", t)]  # never two punctuation marks in a row


@pytest.mark.parametrize("make", [FROZENLAKE, SOKOBAN])
def test_pretrain_corpus(make):
    task = make()
    corpus = task.pretrain_corpus(600, 1)
    assert corpus == task.pretrain_corpus(600, 1) and len(corpus) == 600
    train = {e.prompt: e for e in task.examples("train", 200, 1)}
    test_prompts = {e.prompt for e in task.examples("test", 50, 1)}
    firsts = [(c, p, r) for c, p, r in corpus if "no moves yet." in p]
    assert firsts and all(p in train and p not in test_prompts for _, p, _ in firsts)
    for c, p, r in firsts:
        if c is not None:
            assert c == task.context and r.endswith(f"[{train[p].meta['solution'][0]}]")
            assert r == task.expert_reply(task.new_episode(train[p]).state, train[p].meta["solution"][0])
            assert r.startswith("up ")  # the worked check starts with the first move's read-out entry
    weak = [r for c, _, r in corpus if c is None]
    assert {r for r in weak} == {f"[{a}]" for a in ACTIONS}  # the random policy uses every move
    assert any("invalid reply" in p for _, p, _ in corpus) and any("move 3 of" in p for _, p, _ in corpus)
    assert 0.4 < sum(c is None for c, _, _ in corpus) / len(corpus) < 0.6


@pytest.mark.parametrize("make", [FROZENLAKE, SOKOBAN])
def test_expert_wins_all_and_weak_policy_mostly_loses(make):
    task = make()
    test = task.examples("test", 100, 0)
    assert policy_win_rate(task, task.expert_policy(), test) == 1.0
    weak = policy_win_rate(task, task.weak_policy(), test)
    greedy_task = make(weak_policy="greedy")
    greedy = policy_win_rate(greedy_task, greedy_task.weak_policy(), test)
    print(f"{task.name}: expert 1.00, random weak {weak:.2f}, greedy {greedy:.2f}")
    assert weak <= 0.4


def test_frozenlake_readout_entries_and_worked_reply():
    board = fl.FrozenLakeBoard(4, frozenset({1, 6}), start=5, goal=15)  # P at (1, 1), holes (0, 1) and (1, 2)
    assert board.readout_entries(5) == ["up H far", "down F toward", "left F far", "right H toward"]
    assert readout_line(board, 5) == "up H far , down F toward , left F far , right H toward"
    corner = fl.FrozenLakeBoard(4, frozenset(), start=0, goal=1)
    assert corner.readout_entries(0) == ["up edge", "down F far", "left edge", "right G toward"]
    task = get_task("frozenlake", readout=True)
    state = GameState(board, 5)
    assert task.expert_reply(state, "down") == "up H far , down F toward [down]"
    assert task.expert_reply(state, "up") == "up H far [up]"
    assert get_task("frozenlake", readout=False).expert_reply(state, "down") == "[down]"
    prompt = task.new_episode(task.examples("test", 1, 0)[0]).prompt()
    assert prompt.split("\n")[-1].startswith("up ") and " , right " in prompt.split("\n")[-1]


def test_sokoban_readout_follows_the_push_spot_strategy():
    rows = ["# # # # # #", "# _ _ _ _ #", "# _ P X O #", "# _ _ _ _ #", "# _ _ _ _ #", "# # # # # #"]
    board = sk.parse_board([r.split() for r in rows])
    key = board.initial_key()
    # the box is right of P and the target right of the box: pushing right is the strategy
    assert board.readout_entries(key) == ["up _ far", "down _ far", "left _ far", "right X toward"]
    rows = ["# # # # # #", "# _ _ _ _ #", "# _ X P _ #", "# _ O _ _ #", "# _ _ # _ #", "# # # # # #"]
    board = sk.parse_board([r.split() for r in rows])
    # box must go down: the push spot is above it, reached via up then left (walking around the box)
    assert board.readout_entries(board.initial_key()) == ["up _ toward", "down _ far", "left X far", "right _ far"]
    task = get_task("sokoban", readout=True)
    test = task.examples("test", 100, 0)

    def first_toward(ep, rng):
        entries = ep.board.readout_entries(ep.key)
        return next((f"[{a}]" for a, e in zip(ACTIONS, entries) if e.endswith("toward")), "[up]")

    assert policy_win_rate(task, first_toward, test) >= 0.95  # a strong heuristic, not the solver


def test_sokoban_readout_never_calls_pushing_another_box_toward():
    """Two boxes: the loose one must go right; pushing the box already on its target right is 'far'."""
    rows = ["# # # # # #", "# P √ _ _ #", "# _ _ _ _ #", "# _ X _ O #", "# _ _ _ _ #", "# # # # # #"]
    board = sk.parse_board([r.split() for r in rows])
    assert board.readout_entries(board.initial_key()) == ["up #", "down _ toward", "left #", "right √ far"]
