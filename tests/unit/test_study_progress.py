"""A study says what it does before a long stage (#54): each model's evaluation starts with a line naming the model,
its place in the list and the work, and ends with its time."""

from __future__ import annotations

from types import SimpleNamespace


def test_each_evaluation_says_what_it_does_and_how_long_it_took(tiny_rules_organism, tmp_path, capsys):
    from mechopd.pipeline.stages import evaluate_all

    cfg = SimpleNamespace(task="rules", task_options={"rule": "reverse"}, eval_n=2, seed=0)
    evaluate_all(cfg, {"base": tiny_rules_organism}, tmp_path, other_contexts=False)
    out = capsys.readouterr().out
    assert "evaluate base (1 of 1): 2 held-out items x 1 sample(s), both views ..." in out
    assert "evaluate base: done (" in out
