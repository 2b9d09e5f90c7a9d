"""Recipes that are recipes: one organism recipe per task (method as a flag), probe recipes per study."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mechopd.config import TrainConfig, load_train_config
from mechopd.organisms.pretrain import ORGANISM_TASKS

ROOT = Path(__file__).resolve().parents[2]
ORGANISMS = ROOT / "training" / "organisms"
# keys of an organism recipe that are not its schedule: which task and model, and the default experiment (OPD)
EXPERIMENT_KEYS = {"task", "student", "teacher", "method", "selector", "seed"}
METHODS = [  # (overrides, what the resolved config must say): every method of the papers runs on one recipe
    ({}, ("opd", "full")),
    ({"method": "nca", "beta": 0.5}, ("nca", "full")),
    ({"selector": "ta_opd", "budget": 0.1}, ("opd", "ta_opd")),
    ({"method": "ta_opd"}, ("opd", "ta_opd")),
    ({"method": "nca", "selector": "ta_opd"}, ("nca", "ta_opd")),
    ({"method": "dual_opd"}, ("dual_opd", "full")),
    ({"method": "sym_kl"}, ("sym_kl", "full")),
    ({"selector": "random", "budget": 0.1}, ("opd", "random")),
]


def test_one_organism_recipe_per_task():
    assert sorted(p.stem for p in ORGANISMS.glob("*.yaml")) == sorted(ORGANISM_TASKS)


@pytest.mark.parametrize("task", ORGANISM_TASKS)
@pytest.mark.parametrize("over, want", METHODS, ids=lambda x: str(x))
def test_every_method_runs_on_the_task_recipe(task, over, want):
    path = ORGANISMS / f"{task}.yaml"
    base = load_train_config(path)
    cfg = load_train_config(path, over)
    assert (cfg.task, cfg.student) == (task, f"organism:{task}")
    assert (cfg.method, cfg.selector) == want
    schedule = ("estimator", "batch_size", "lr", "steps", "eval_every", "eval_n", "save_every", "seed")
    assert [getattr(cfg, k) for k in schedule] == [
        getattr(base, k) for k in schedule
    ]  # the flags change the method only


@pytest.mark.parametrize("task", ORGANISM_TASKS)
def test_recipe_matches_organism_recipes(task):
    """The YAML is ORGANISM_RECIPES[task] (what `mechopd demo` trains with), plus which task, model and method."""
    recipes = pytest.importorskip("mechopd.organisms.recipes")
    data = yaml.safe_load((ORGANISMS / f"{task}.yaml").read_text())
    recipe = recipes.ORGANISM_RECIPES[task]
    assert {k: data[k] for k in recipe} == recipe
    assert set(data) - set(recipe) <= EXPERIMENT_KEYS, "a schedule key the organism recipe does not hold"


@pytest.mark.parametrize("task", ORGANISM_TASKS)
def test_recipe_leaves_the_papers_defaults_for_the_method(task):
    """β, ρ, K and the estimator's knobs are not part of an organism recipe: the config's (the papers') defaults."""
    data = yaml.safe_load((ORGANISMS / f"{task}.yaml").read_text())
    assert not {"beta", "budget", "k", "topk", "nca_positions"} & set(data)
    cfg = load_train_config(ORGANISMS / f"{task}.yaml")
    assert (cfg.beta, cfg.budget, cfg.k) == (TrainConfig.beta, TrainConfig.budget, TrainConfig.k)


# ------------------------------------------------------------------------------------------------- probe recipes
PROBE_RECIPES = sorted((ROOT / "probes").glob("*.yaml"))
SETUP_KEYS = {
    "task",
    "task_options",
    "placement",
    "no_context_system",
    "chat_template_kwargs",
    "temperature",
    "max_new_tokens",
    "n",
    "seed",
    "batch_size",
    "split",
    "responses_from",
    "models",
    "run",
}  # ProbeSetup
STUDY_PROBES = {"similarity", "gradients", "deltas", "teachability"}


def _labels(value) -> list[str]:
    """Model labels an option names: a label, a list of labels, or ``a,b`` (the pair/terms syntax)."""
    items = value if isinstance(value, list) else [value]
    return [p for item in items for p in str(item).split(",")]


def test_probe_recipes_exist_for_both_studies():
    assert {"sokoban-study", "rules-study"} <= {p.stem for p in PROBE_RECIPES}


@pytest.mark.parametrize("path", PROBE_RECIPES, ids=lambda p: p.name)
def test_probe_recipe_keys_and_labels(path):
    data = yaml.safe_load(path.read_text())
    assert set(data) - {"out", "probes"} <= SETUP_KEYS
    assert data["task"] in ORGANISM_TASKS and "base" in data["models"]
    assert set(data["probes"]) == STUDY_PROBES  # the papers' study: every probe
    model_options = {"models", "model", "trained", "student", "base", "pair"}
    for name, options in data["probes"].items():
        for key in model_options & set(options):
            assert set(_labels(options[key])) <= set(data["models"]), (name, key)


@pytest.mark.parametrize("path", PROBE_RECIPES, ids=lambda p: p.name)
def test_probe_recipe_builds_a_setup_and_valid_probe_options(path, tmp_path, monkeypatch):
    """With the probe setup and registry present, the recipe is a `ProbeSetup` and every probe accepts its options.
    Run from an empty directory: `ProbeSetup` records a model path that exists as absolute, so the checkout's own
    `runs/` (which `mechopd demo` writes) must not decide what the recipe's labels read."""
    monkeypatch.chdir(tmp_path)
    setup_mod = pytest.importorskip("mechopd.probes.setup")
    registry = pytest.importorskip("mechopd.probes.registry")
    data = yaml.safe_load(path.read_text())
    probes = data.pop("probes")
    data.pop("out")
    setup = setup_mod.ProbeSetup(**data)
    assert setup.task == data["task"] and setup.models == data["models"]
    for name, options in probes.items():
        registry.get_probe(name).options(**options)  # unknown options raise ConfigError


def test_runs_of_a_task_recipe_are_named_by_their_method():
    from mechopd.cli.train_cmd import run_name

    assert run_name("training/organisms/rules.yaml", "rules", "nca", "full") == "rules-nca-full"
    assert run_name("training/organisms/rules.yaml", "rules", "opd", "ta_opd") == "rules-opd-ta_opd"
    assert run_name(None, "sokoban", "opd", "full") == "sokoban-opd-full"
    assert run_name("training/paper/qwen3-4b-sokoban-nca.yaml", "sokoban", "nca", "full") == "qwen3-4b-sokoban-nca"
