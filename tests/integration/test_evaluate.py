"""Both-view evaluation: deterministic reports, sampled mode, games, split disjointness, bad input."""

from __future__ import annotations

import pytest

from mechopd.core.errors import TaskError
from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks.base import get_task
from tests.conftest import tiny_model


def test_same_organism_twice_gives_identical_reports(tiny_rules_organism):
    m, tok = load_model(tiny_rules_organism), load_tokenizer(tiny_rules_organism)
    task = get_task("rules")
    a = evaluate_model(m, tok, task, EvalConfig(n=16, seed=3, n_boot=50))
    b = evaluate_model(m, tok, task, EvalConfig(n=16, seed=3, n_boot=50))
    assert a == b
    assert a["summary"]["n"] == 16 and {r["uid"] for r in a["records"]} == {e.uid for e in task.examples("test", 16, 3)}
    for r in a["records"]:  # lengths are token counts of the decoded responses' ids
        assert r["len_x"] >= 0 and isinstance(r["correct_x"], bool)


def test_sampled_evaluation_is_seeded(tiny_rules_organism):
    m, tok = load_model(tiny_rules_organism), load_tokenizer(tiny_rules_organism)
    task = get_task("rules")
    cfg = EvalConfig(n=6, seed=1, samples=2, temperature=1.0, n_boot=20)
    a, b = evaluate_model(m, tok, task, cfg), evaluate_model(m, tok, task, cfg)
    assert a["records"] == b["records"] and len(a["records"]) == 12 and not a["settings"]["greedy"]
    c = evaluate_model(m, tok, task, EvalConfig(n=6, seed=2, samples=2, temperature=1.0, n_boot=20))
    assert [r["response_x"] for r in c["records"]] != [r["response_x"] for r in a["records"]]


@pytest.mark.parametrize("game", ["frozenlake", "sokoban"])
def test_games_play_both_views_and_check_disjointness(organism_tokenizer, game):
    task = get_task(game)
    model = tiny_model(organism_tokenizer, seed=5)
    rep = evaluate_model(model, organism_tokenizer, task, EvalConfig(n=4, seed=0, n_boot=10))
    assert len(rep["records"]) == 4
    for r in rep["records"]:
        assert 1 <= r["moves_x"] <= 5 and r["unparseable_x"] <= r["moves_x"]
    assert rep["summary"]["invalid_moves_x"] == sum(r["unparseable_x"] for r in rep["records"])
    test_uids = {e.uid for e in task.examples("test", 4, 0)}
    with pytest.raises(TaskError, match="also appear in training"):
        evaluate_model(model, organism_tokenizer, task, EvalConfig(n=4, seed=0, n_boot=0), train_uids=test_uids)
    train = task.examples("train", 200, 0)
    assert not test_uids & {e.uid for e in train}


def test_empty_set_is_refused():
    with pytest.raises(TaskError, match="empty"):
        EvalConfig(n=0)


def test_package_level_entry_points(tiny_rules_organism, tmp_path):
    import mechopd

    rep = mechopd.run_eval(str(tiny_rules_organism), "rules", n=5, out=tmp_path / "r.json")
    assert rep["summary"]["n"] == 5 and (tmp_path / "r.json").exists() and (tmp_path / "r.csv").exists()
    final = mechopd.run_train(
        {"student": str(tiny_rules_organism), "steps": 1, "batch_size": 4, "max_new_tokens": 6, "pool_size": 16},
        tmp_path / "run",
        progress=False,
    )
    assert (final / "model.safetensors").exists()


def test_lean_and_hf_decoders_evaluate_alike(tiny_rules_organism):
    m, tok = load_model(tiny_rules_organism), load_tokenizer(tiny_rules_organism)
    task = get_task("rules")
    lean = evaluate_model(m, tok, task, EvalConfig(n=6, seed=0, n_boot=0))
    hf = evaluate_model(m, tok, task, EvalConfig(n=6, seed=0, n_boot=0, engine="hf"))
    assert lean["records"] == hf["records"]  # fp32 greedy: the same responses
    with pytest.raises(TaskError, match="engine='sglang' is unknown"):
        EvalConfig(engine="sglang")
