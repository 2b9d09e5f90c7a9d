"""Every paper recipe (training/paper/*.yaml) runs: the YAML as shipped, through `mechopd train`, with only the model
swapped for the zoo fixture of its family and the scale shrunk (1 step, 2 prompts, 4 new tokens, 2 eval items).
Every other key (method, selector, estimator, dtype, render spec, task options ...) is the recipe's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from .helpers import cli

PAPER = Path(__file__).resolve().parents[2] / "training" / "paper"
RECIPES = sorted(PAPER.glob("*.yaml"))
SHRINK = {
    "steps": 1,
    "batch_size": 2,
    "max_new_tokens": 4,
    "eval_every": 1,
    "eval_n": 2,
    "save_every": 1,
    "pool_size": 8,
}


def family_of(recipe: dict) -> str:
    name = str(recipe["student"]).lower()
    for key, family in (("qwen3", "qwen3"), ("qwen2", "qwen2"), ("llama", "llama")):
        if key in name:
            return family
    raise AssertionError(f"recipe student {recipe['student']!r} is of no zoo family")


def test_there_are_paper_recipes():
    assert len(RECIPES) >= 4


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_paper_recipe_dry_run(path, zoo, tmp_path):
    recipe = yaml.safe_load(path.read_text())
    family = family_of(recipe)
    sets = {"student": zoo.student(family), **SHRINK}
    if recipe.get("teacher"):
        sets["teacher"] = zoo.teacher(family)  # cross-model: same tokenizer, padded vocabulary
    if recipe["task"] == "jsonl":
        sets.update({f"task_options.{k}": v for k, v in zoo.jsonl_options().items()})
    if "max_new_tokens" in recipe.get("task_options", {}):
        sets["task_options.max_new_tokens"] = 4
    out = tmp_path / path.stem
    cli("train", path, *[x for k, v in sets.items() for x in ("--set", f"{k}={v}")], "--out", out, "--no-progress")
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    for key, value in recipe.items():  # the recipe's keys survive, only the shrunk / swapped ones differ
        if key in sets or key in ("teacher", "task_options"):
            continue
        assert resolved[key] == value, (key, resolved[key], value)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in r for r in recs) and any("eval/acc_x" in r for r in recs)
    assert (out / "checkpoints" / "step-1").is_dir() and (out / "final" / "config.json").exists()
