"""Recipes that are recipes: one organism recipe per task (method as a flag), probe recipes per study."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from mechopd.config import TrainConfig
from mechopd.organisms.pretrain import ORGANISM_TASKS
from mechopd.organisms.recipes import load_train_config

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
STUDY_PROBES = {"similarity", "gradients", "deltas", "teachability"}


def test_probe_recipes_exist_for_both_studies():
    assert {"sokoban-study", "rules-study"} <= {p.stem for p in PROBE_RECIPES}


def _checkpoints_made_here(path: Path, where: Path) -> tuple[Path, dict]:
    """The recipe copied to ``where/probes/`` (a test's ``tmp_path``) with its student and checkpoint directories made,
    empty, beside it as the file names them (relative to its folder): what `StudySpec.load` checks is there. The
    checkout's own ``runs/`` (which `mechopd demo` writes) decides nothing."""
    from mechopd.core.config_parse import load_yaml

    copy_ = where / "probes" / path.name
    copy_.parent.mkdir(parents=True, exist_ok=True)
    copy_.write_text(path.read_text())
    doc = load_yaml(copy_)
    for d in [doc["student"], *(entry["checkpoint"] for entry in doc["runs"].values())]:
        (copy_.parent / d).mkdir(parents=True, exist_ok=True)
    return copy_, doc


@pytest.mark.parametrize("path", PROBE_RECIPES, ids=lambda p: p.name)
def test_probe_recipe_is_a_study_of_checkpoints(path, tmp_path, monkeypatch):
    """A probe recipe is a study file read by `StudySpec.load`: every run a checkpoint (nothing trained), every probe
    of the papers' study with options its probe accepts and roles the study has (both checked by the reader). Its
    paths are read against its own folder, from any current directory (#54)."""
    from mechopd.pipeline.spec import StudySpec

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    copied, _ = _checkpoints_made_here(path, tmp_path)
    spec = StudySpec.load(copied)
    assert spec.task in ORGANISM_TASKS and spec.teacher is None
    assert spec.trained == [] and set(spec.checkpoints()) == {"opd", "nca", "ta_opd"}
    runs = (tmp_path / "runs").resolve()
    assert all(Path(d).is_relative_to(runs) for d in spec.checkpoints().values())
    assert Path(spec.student).resolve().is_relative_to(runs)
    assert set(spec.probes) == STUDY_PROBES  # the papers' study: every probe


@pytest.mark.parametrize("path", PROBE_RECIPES, ids=lambda p: p.name)
def test_probe_recipe_is_refused_with_a_bad_option_a_missing_role_or_checkpoint(path, tmp_path, monkeypatch):
    from mechopd.core.errors import ConfigError
    from mechopd.pipeline.spec import StudySpec

    monkeypatch.chdir(tmp_path)
    lone = tmp_path / "lone" / path.name
    lone.parent.mkdir()
    lone.write_text(path.read_text())
    with pytest.raises(ConfigError, match=rf"student {tmp_path}/runs/organisms/\S+ does not exist"):
        StudySpec.load(lone)  # beside an empty folder: the models are not there; the error names where it looked
    copied, doc = _checkpoints_made_here(path, tmp_path)
    doc = {**doc, "student": str(copied.parent / doc["student"])}
    doc["runs"] = {r: {"checkpoint": str(copied.parent / e["checkpoint"])} for r, e in doc["runs"].items()}
    bad = copy.deepcopy(doc)
    bad["probes"]["similarity"]["colour"] = 1
    with pytest.raises(ConfigError, match=r"probes\.similarity.*colour"):
        StudySpec.load(bad, source=str(path))
    bad = copy.deepcopy(doc)
    bad["probes"]["gradients"]["model"] = "nca_follow"
    with pytest.raises(ConfigError, match=r"probes\.gradients reads the role\(s\) nca_follow"):
        StudySpec.load(bad, source=str(path))


def test_runs_of_a_task_recipe_are_named_by_their_method():
    from mechopd.cli.train_cmd import run_name

    assert run_name("training/organisms/rules.yaml", "rules", "nca", "full") == "rules-nca-full"
    assert run_name("training/organisms/rules.yaml", "rules", "opd", "ta_opd") == "rules-opd-ta_opd"
    assert run_name(None, "sokoban", "opd", "full") == "sokoban-opd-full"
    assert run_name("training/paper/qwen3-4b-sokoban-nca.yaml", "sokoban", "nca", "full") == "qwen3-4b-sokoban-nca"


def test_the_recipe_is_applied_by_the_caller_not_by_config():
    import mechopd.config as config
    from mechopd.config import bind_train

    assert not hasattr(config, "load_train_config") and not hasattr(config, "resolve_train_data")  # issue 56
    assert bind_train({}).lr == TrainConfig.lr == 5e-6  # config alone: the papers' defaults
    assert load_train_config(None, {}).lr == 2e-3  # the caller applies organism:rules' recipe
