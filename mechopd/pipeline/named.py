"""`mechopd demo --study NAME`: a built-in study file chosen by name (``mechopd/data/studies/NAME.yaml``) and run as
`mechopd run` runs a study file (`mechopd.pipeline.run.run_study`), into ``runs/NAME`` by default.

``--fast`` makes it a smoke run: one seed (the study's first), and the schedule, evaluation and probe items of
``mechopd/data/demo_fast.yaml`` (`demo.fast_values`: steps, batch_size, eval_every, eval_n, probe_n), under a study's
own ``mechopd/data/studies/fast/NAME.yaml`` where it has one (a real model's smoke run is smaller); a run's fixed
anchor start becomes the file's ``nca_start``, a KL-gated anchor its ``nca_gate`` / ``nca_gate_window``, an
accuracy-gated anchor checks every step on ``eval_n`` training items, weight patching reverts at every layer at once
only, and a run's own
``save_every`` goes (one checkpoint at half the steps, removed once the run's final model is written). ``steps`` /
``batch_size`` given by the caller win.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechopd.core.config_parse import load_yaml
from mechopd.core.errors import ConfigError
from mechopd.pipeline.demo import DemoConfig, fast_values
from mechopd.pipeline.spec import STUDIES_DIR, StudySpec

_FAST_TRAIN = ("steps", "batch_size", "eval_every", "eval_n")


def study_names() -> list[str]:
    """The built-in studies' names (the files' stems)."""
    return sorted(p.stem for p in STUDIES_DIR.glob("*.yaml"))


def study_file(name: str) -> Path:
    """The built-in study file called `name`; an unknown name is one line listing the known ones."""
    path = STUDIES_DIR / f"{name}.yaml"
    if "/" in name or "\\" in name or not path.is_file():
        raise ConfigError(
            f"demo --study {name!r}: no built-in study of that name; choose one of {', '.join(study_names())}"
        )
    return path


def study_fast_values(name: str) -> dict[str, Any]:
    """A study's own ``--fast`` values (``mechopd/data/studies/fast/NAME.yaml``; {} without one), each a key of
    demo_fast.yaml and a number >= 0."""
    path = STUDIES_DIR / "fast" / f"{name}.yaml"
    if not path.is_file():
        return {}
    doc, known = load_yaml(path), set(fast_values())
    for key, value in doc.items():
        if key not in known:
            raise ConfigError(f"{path}: {key!r} is no --fast value; use {', '.join(sorted(known))}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"{path}: {key}={value!r} must be a number >= 0")
    return dict(doc)


def shrink(
    spec: StudySpec, fast: bool, steps: int | None = DemoConfig.steps, batch_size: int | None = DemoConfig.batch_size
) -> dict[str, Any]:
    """The study as a mapping, shrunk by ``--fast`` (module docstring) and by the caller's ``steps`` / ``batch_size``."""
    doc = spec.to_mapping()
    train = dict(doc["train"])
    if fast:
        values = {**fast_values(), **study_fast_values(Path(spec.source).stem)}
        train.update({k: values[k] for k in _FAST_TRAIN if k in values})
        doc["seeds"] = doc["seeds"][:1]
        doc["eval"] = {**doc["eval"], "n": min(int(values["eval_n"]), spec.eval_n)}
        train["eval_n"] = doc["eval"]["n"]
        doc["probe_n"] = values["probe_n"]
        doc["runs"] = {role: _fast_run(run, values) for role, run in doc["runs"].items()}
        doc["probes"] = {  # a smoke run's 2-step model has learned nothing to select (probes.informative): all items
            name: _fast_probe(name, opts or {}) for name, opts in doc["probes"].items()
        }
        train.pop("save_every", None)
    for key, value in (("steps", steps), ("batch_size", batch_size)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"demo --{key.replace('_', '-')} {value!r}: pass an integer >= 1")
            train[key] = value
    doc["train"] = train
    return doc


def load_named(name: str) -> StudySpec:
    """The built-in study `name`, read and checked by `StudySpec.load`: its data files are named relative to the file
    (``../smollm2_facts.jsonl``) and read against its folder, so it runs from any directory."""
    return StudySpec.load(study_file(name))


def _fast_probe(name: str, opts: dict[str, Any]) -> dict[str, Any]:
    """A probe's options in the smoke run: every item (no ``select``), and weight patching reverts each module
    group at every layer at once only (``layers: all``): each group is exercised, in 1 patched model of the file's
    5 x its layer sets (smollm2-handbooks: 5 of 25, 110 s of a 381 s smoke run)."""
    opts = {k: v for k, v in opts.items() if k != "select"}
    return {**opts, "layers": "all"} if name == "weightpatch" and "layers" in opts else opts


def _fast_run(run: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    run = {k: v for k, v in run.items() if k != "save_every"}
    if "nca_start" in run:
        run["nca_start"] = values["nca_start"]
    if "nca_gate" in run:
        run.update(nca_gate=values["nca_gate"], nca_gate_window=values["nca_gate_window"])
    if "nca_gate_acc" in run:  # the accuracy gate checks every step, on the smoke run's evaluation items' count
        run.update(nca_gate_window=1, nca_gate_n=values["eval_n"])
    return run


def run_named_study(
    name: str,
    out: str | Path | None = None,
    fast: bool = DemoConfig.fast,
    workers: int | None = DemoConfig.workers,
    steps: int | None = DemoConfig.steps,
    batch_size: int | None = DemoConfig.batch_size,
) -> Path:
    """Run the built-in study `name` (``--fast``: its smoke run) into `out` (default ``runs/NAME``, ``-fast`` added
    with ``fast``); returns the report path."""
    from mechopd.pipeline.run import run_study

    doc = shrink(load_named(name), fast, steps, batch_size)
    target = Path(out) if out is not None else Path("runs") / (f"{name}-fast" if fast else name)
    if fast:  # first: a newcomer must not read the undecided claims as a broken study
        train = doc["train"]
        print(
            f"SMOKE RUN (mechopd demo --study {name} --fast): one seed, {train['steps']} steps x "
            f"{train['batch_size']} prompts, {doc['eval']['n']} evaluation items: it checks that every stage runs; "
            f"it is too small to decide a claim. `mechopd demo --study {name}` runs the study.",
            flush=True,
        )
    return run_study(doc, target, workers)
