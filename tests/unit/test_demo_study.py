"""The demo's policy lives in its built-in studies (mechopd/data/studies/<task>.yaml): they load and validate as any
study file, the demo resolves from them exactly the configs main's demo.py held as Python (snapshot generated from
that demo.py: `demo_study_snapshot.json`), and `mechopd run` on a copy trains the same runs."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from mechopd.config import TrainConfig
from mechopd.core.errors import ConfigError
from mechopd.organisms.recipes import ORGANISM_RECIPES
from mechopd.pipeline import demo as D
from mechopd.pipeline.spec import STUDIES_DIR, StudySpec, builtin_study

TASKS = ("rules", "frozenlake", "sokoban")
SNAPSHOT = json.loads((Path(__file__).parent / "demo_study_snapshot.json").read_text())


def _train_configs(cfg, monkeypatch) -> dict[str, dict]:
    """Every demo run's resolved TrainConfig, as its training jobs build it (the trainer replaced by a recorder)."""
    from mechopd.pipeline import run as R

    seen: dict[str, dict] = {}
    monkeypatch.setattr(R, "train_resumable", lambda name, out, config, what: seen.setdefault(name, asdict(config())))
    R.train_runs(D.seed_run(cfg, "STUDENT"), Path("STUDENT"), Path("RUN"), cfg.methods())
    return seen


def test_the_built_in_studies_are_valid_study_files():
    named = {
        "smollm2-facts",
        "smollm2-handbooks",
        "qwen-coder-docs",
    }  # `mechopd demo --study NAME` (tests/unit/test_named_study.py); the rest: one per task
    assert sorted(p.stem for p in STUDIES_DIR.glob("*.yaml")) == sorted({*TASKS, *named})
    for task in TASKS:
        spec = StudySpec.load(STUDIES_DIR / f"{task}.yaml")
        assert spec.task == task and spec.student == f"organism:{task}"
        assert spec.seeds == list(range(len(spec.seeds)))  # the demo runs seeds 0..N-1
        follow = {"nca_follow"} if task == "rules" else set()  # a game has no other contexts to follow
        assert set(spec.runs) == {"opd", "nca", "ta_opd", *follow}
        assert spec.first_seed_only == ["patching", "attention"]


@pytest.mark.parametrize("key", sorted(SNAPSHOT))
def test_the_demo_resolves_the_configs_main_held_in_python(key, monkeypatch):
    task, fast = key.removesuffix("-fast"), key.endswith("-fast")
    cfg = D.DemoConfig(task=task, fast=fast, workers=1, out="OUT")
    want = SNAPSHOT[key]
    assert json.loads(json.dumps(asdict(cfg))) == want["config"]
    methods = json.loads(json.dumps(cfg.methods()))
    assert methods == want["methods"]
    assert [list(v) for v in methods.values()] == [list(v) for v in want["methods"].values()]  # key order: demo.json
    got = json.loads(json.dumps(_train_configs(cfg, monkeypatch), default=str))
    assert set(got) == set(want["train_configs"])
    defaults = json.loads(json.dumps(asdict(TrainConfig()), default=str))
    for run, fields in got.items():  # a field added to TrainConfig since the snapshot: the demo leaves its default
        assert {k: v for k, v in fields.items() if k in want["train_configs"][run]} == want["train_configs"][run]
        assert {k: v for k, v in fields.items() if k not in want["train_configs"][run]} == {
            k: defaults[k] for k in fields if k not in want["train_configs"][run]
        }, run


@pytest.mark.parametrize("task", TASKS)
def test_mechopd_run_on_a_copy_trains_the_demos_runs(task, monkeypatch):
    """A copy run resolves the organism recipe under the study: only anchor fields of non-anchor runs may differ
    (no effect on OPD or TA-OPD: they change only anchor terms, organisms/recipes.py)."""
    spec = builtin_study(task)
    demo = _train_configs(D.DemoConfig(task=task, workers=1, out="OUT"), monkeypatch)
    for role in spec.runs:
        run = asdict(spec.train_config(role, 0, "STUDENT"))
        diff = {k for k in run if run[k] != demo[role][k]}
        assert diff <= ({"nca_start", "nca_gate"} if run["method"] != "nca" else set()), (role, diff)


@pytest.mark.parametrize("task", TASKS)
def test_the_studies_agree_with_the_organism_recipes(task):
    """Same lr, estimator, evaluation and task options as the recipe; a game study runs half the recipe's steps
    and batch (the demo's budget) with the sokoban recipe's KL gate on NCA."""
    spec, recipe = builtin_study(task), ORGANISM_RECIPES[task]
    for key in ("lr", "estimator", "eval_every", "eval_n"):
        assert spec.train[key] == recipe[key], key
    assert dict(spec.task_options) == recipe.get("task_options", {})
    if task == "rules":
        assert (spec.train["steps"], spec.train["batch_size"]) == (recipe["steps"], recipe["batch_size"])
        assert spec.runs["nca"]["nca_start"] == recipe["nca_start"] and spec.eval_n == recipe["eval_n"]
    else:
        assert (spec.train["steps"], spec.train["batch_size"]) == (recipe["steps"] // 2, recipe["batch_size"] // 2)
        assert spec.runs["nca"]["nca_gate"] == ORGANISM_RECIPES["sokoban"]["nca_gate"] == D.NCA_GATE


@pytest.mark.parametrize(
    "change, words",
    [
        ({"probe_n": 0}, "probe_n=0"),
        ({"first_seed_only": ["nope"]}, "nope"),
        ({"first_seed_only": "patching"}, "first_seed_only must be a list"),
    ],
)
def test_bad_probe_n_and_first_seed_only_are_refused(change, words):
    doc = {**builtin_study("rules").to_mapping(), **change}
    with pytest.raises(ConfigError, match=words):
        StudySpec.load(doc)


def test_an_empty_out_is_not_a_finished_demo(tmp_path):
    assert not D.demo_done(D.DemoConfig(fast=True, workers=1, out=str(tmp_path / "d")))


def test_fast_takes_its_values_from_the_data_file_and_a_given_value_wins():
    fast = D.fast_values()
    cfg = D.DemoConfig(fast=True, workers=1, out="OUT")
    assert {k: getattr(cfg, k) for k in fast} == fast  # rules: a fixed anchor start, so nca_start too
    assert D.DemoConfig(task="sokoban", fast=True, workers=1, out="OUT").nca_start is None  # a gated anchor stays
    given = D.DemoConfig(fast=True, workers=1, out="OUT", steps=4, eval_n=50, nca_start=1)
    assert (given.steps, given.eval_n, given.nca_start, given.probe_n) == (4, 50, 1, fast["probe_n"])


@pytest.mark.parametrize(
    "text, words", [("stepz: 6\n", "'stepz' is no DemoConfig field"), ("steps: six\n", "steps='six'")]
)
def test_a_bad_fast_file_is_refused_naming_the_key(text, words, tmp_path, monkeypatch):
    (tmp_path / "fast.yaml").write_text(text)
    monkeypatch.setattr(D, "FAST_FILE", tmp_path / "fast.yaml")
    D.fast_values.cache_clear()
    try:
        with pytest.raises(ConfigError, match=words):
            D.fast_values()
    finally:
        D.fast_values.cache_clear()


def test_the_demos_seed_runs_carry_what_it_does_beyond_a_study(tmp_path):
    """One finish job for both runners: the demo's differences are data on its `SeedRun`."""
    from mechopd.pipeline.pool import seed_configs
    from mechopd.pipeline.run import seed_runs

    cfg = D.DemoConfig(fast=True, seeds=2, sweep=True, workers=1, out=str(tmp_path / "d"))
    runs = [D.seed_run(r, tmp_path) for r in seed_configs(cfg)]
    assert [(r.seed, r.first_seed, r.figures) for r in runs] == [(0, True, True), (1, False, False)]
    assert all(r.all_probes and r.sweep == {} and r.spec.seeds == [r.seed] for r in runs)
    assert runs[1].manifest_config == asdict(seed_configs(cfg)[1]) and runs[1].methods() == cfg.methods()
    assert (runs[0].spec.eval_n, runs[0].probe_n, runs[0].spec.train["steps"]) == (24, 8, 6)
    study = seed_runs(builtin_study("rules"), tmp_path / "s", str(tmp_path))
    assert [(r.first_seed, r.figures, r.all_probes, r.sweep) for r in study] == [(True, True, False, None)] + [
        (False, True, False, None)
    ] * (len(builtin_study("rules").seeds) - 1)
