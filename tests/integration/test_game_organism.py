"""A game organism end to end at toy size: pretraining on read-out prompts with worked replies, then OPD on games."""

from __future__ import annotations

import json

import pytest

from mechopd.core.views import RenderSpec, render_prompt_ids
from mechopd.generate.sampler import play_games
from mechopd.generate.settings import SamplingSettings
from mechopd.models import load_model, load_tokenizer
from mechopd.organisms.pretrain import OrganismConfig, pretrain
from mechopd.tasks.base import get_task
from tests.conftest import TINY_ORGANISM


@pytest.mark.parametrize("game", ["frozenlake", "sokoban"])
def test_game_organism_pretrains_and_trains(tmp_path, game):
    path = pretrain(OrganismConfig(task=game, **TINY_ORGANISM), tmp_path / "org", progress=False)
    meta = json.loads((path / "organism.json").read_text())
    assert meta["final_loss"] < 4.4  # falls from ~ln(vocab) = 4.8 in 60 toy steps (the real organism: ~0.1)
    model, tok = load_model(path), load_tokenizer(path)
    task = get_task(game)
    items = task.examples("test", 3, 0)
    spec = RenderSpec(placement=task.placement)

    def render(prompt, context):
        return render_prompt_ids(tok, prompt, context, spec)

    settings = SamplingSettings.for_model(tok, model, max_new_tokens=task.max_new_tokens, greedy=True)
    eps, turns = play_games(model, tok, task, items, render, settings, with_context=True)
    assert len(eps) == 3 and turns and all(t.prompt.split("\n")[-1].startswith("up ") for t in turns)
    assert all(len(t.response) <= task.max_new_tokens for t in turns)

    import mechopd

    final = mechopd.run_train(
        {"task": game, "student": str(path), "method": "nca", "steps": 2, "batch_size": 2, "pool_size": 8, "lr": 1e-3},
        tmp_path / "run",
        progress=False,
    )
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["samples"] >= 2 and "loss/nca" in r for r in rows)
    assert (final / "model.safetensors").exists()
