"""Configs: recipes parse, overrides coerce to field types, bad values name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechopd.config import TrainConfig, load_train_config, parse_overrides
from mechopd.errors import ConfigError

RECIPES = sorted(Path(__file__).resolve().parents[2].glob("training/**/*.yaml"))
RECIPES = [p for p in RECIPES if "launch" not in p.parts]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_recipe_parses(path):
    cfg = load_train_config(path)
    assert cfg.steps >= 1 and 0 < cfg.budget <= 1


def test_recipes_exist_for_every_organism_and_method():
    names = {p.stem for p in RECIPES}
    for task in ("rules", "frozenlake", "sokoban"):
        for m in ("opd", "nca", "ta_opd", "dual_opd", "sym_kl"):
            assert f"{task}-{m}" in names


def test_overrides_are_coerced_and_nested():
    over = parse_overrides(["lr=1e-3", "steps=7", "task_options.rule=shift:2", "renormalize=true"])
    cfg = load_train_config(None, over)
    assert cfg.lr == 1e-3 and cfg.steps == 7 and cfg.task_options == {"rule": "shift:2"} and cfg.renormalize is True


def test_method_alias_sets_selector():
    cfg = TrainConfig(method="ta_opd")
    assert (cfg.method, cfg.selector) == ("opd", "ta_opd")


@pytest.mark.parametrize("over,needle", [({"steps": 2.5}, "steps"), ({"beta": float("nan")}, "beta"),
                                         ({"estimator": "exact"}, "estimator"), ({"nca_positions": "x"}, "nca_pos"),
                                         ({"sharding": "zero3"}, "sharding='zero3' is unknown; choose one of none, fsdp"),
                                         ({"rollout_engine": "sglang"},
                                          "rollout_engine='sglang' is unknown; choose one of lean, hf, vllm")])
def test_bad_values_name_the_field(over, needle):
    with pytest.raises(ConfigError, match=needle):
        load_train_config(None, over)
