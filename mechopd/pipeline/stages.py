"""The stages of a seed run's jobs (`run.train_runs`, `run.finish_seed`; `mechopd run` and `mechopd demo` alike): a
training skipped when finished or resumed, every model evaluated in both views (and under the other contexts), the
probes of the study, and the runs' display labels. ``cfg`` is a seed run (`run.SeedRun`) or anything with its
task, task_options, seed, eval_n and probe_n (a `demo.DemoConfig`)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mechopd.config.sections import LoraOptions
from mechopd.core.artifacts import FileSet, mean_kept_fraction, write_json
from mechopd.core.errors import ConfigError, DataError
from mechopd.core.runcheck import check_no_escape
from mechopd.core.runlock import LOCK_NAME
from mechopd.models import load_model, load_tokenizer
from mechopd.models.lora import adapter_label
from mechopd.objectives.labels import RunSettings, estimator_label, plugin_label, rollout_label
from mechopd.pipeline.logline import say
from mechopd.pipeline.pool import finished
from mechopd.runset import STUDY_FILE, EvalReport, RunSet


def _log(msg: str) -> None:
    say(msg)  # [demo ...] / [run ...] (`logline`)


def method_label(name: str, over: dict[str, Any], kept: float | None = None) -> str:
    """The display name of a run: what its plug-ins say of themselves (`objectives.labels`: the method's anchor
    term with its schedule, else its selector with its budget and MEASURED kept fraction; then every added term
    switched on), else ``OPD`` / the run's name; a LoRA student says so with its rank (`models.lora.adapter_label`), and
    rollouts sampled from a bf16 copy with "(bf16 rollouts)" (`objectives.labels.rollout_label`)."""
    run = RunSettings(over, kept)
    head, tail = plugin_label(run)
    head = head or ("OPD" if name == "opd" else name)
    return head + estimator_label(run) + tail + adapter_label(run.section(LoraOptions)) + rollout_label(run)


def labels_for(run: Path, methods: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Labels of every model of a run; selector runs carry the kept fraction read from their metrics.jsonl. The
    report keys its tables by label, so two runs whose settings read alike carry their role names: ``X [nca2]``."""
    labels = {m: method_label(m, *_trained_as(run, m, over)) for m, over in methods.items()}
    shared = {text for text in labels.values() if list(labels.values()).count(text) > 1 or text == "base"}
    return {"base": "base", **{m: f"{text} [{m}]" if text in shared else text for m, text in labels.items()}}


def _trained_as(run: Path, name: str, over: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """A run's training fields and kept fraction: its own (``train/<name>``), or for a given checkpoint
    (``{checkpoint: DIR}``) the config the checkpoint records (``DIR/training.json``, written by `mechopd train`) and
    its training's metrics beside it; a checkpoint that records none is labelled by its role."""
    if "checkpoint" not in over:
        return over, mean_kept_fraction(run / "train" / name)
    given = Path(over["checkpoint"])
    try:
        recorded = json.loads((given / "training.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}, None
    if not isinstance(recorded, dict):
        return {}, None
    try:  # the metrics of a training made elsewhere: unreadable ones leave the label's kept fraction "n/a"
        kept = mean_kept_fraction(given.parent)
    except DataError:
        kept = None
    return recorded, kept


def train_resumable(name: str, out: Path, config: Any, what: Any, root: Path | None = None) -> Path:
    """``out``'s training (``config()``: its TrainConfig) skipped when finished, else resumed or started afresh.
    ``root``: the seed run's directory (default ``out``'s grandparent, ``RUN/train/<name>``): no link under it leads
    out of it, and only the training's own files are deleted."""
    from mechopd.train.checkpoint import latest_checkpoint
    from mechopd.train.trainer import train

    check_own_place(out, out.parent.parent if root is None else root)
    if finished(out):
        _log(f"train {name}: done, skipped")
        return out / "final"
    resume = latest_checkpoint(out) is not None
    if out.exists() and not resume:
        clear_partial(out)  # the study's own partial output from a killed run without a checkpoint
    tc = config()
    _log(f"train {name}: {what} ({'resuming' if resume else 'new'})")
    return train(tc, out, resume=resume)


def check_own_place(out: Path, root: Path) -> None:
    """No link on the way from the seed run's directory ``root`` to ``out`` leads out of it (a link out, or a loop, is
    one ConfigError before anything is written or deleted)."""
    check_no_escape(root, out)


def clear_partial(out: Path) -> None:
    """Delete what a killed training left in ``out`` (its run files and temp dirs) and nothing else: a file the study
    did not write is refused with its name, and nothing is deleted."""
    from mechopd.train.rundir import RUN_FILES, remove_own

    temp = (".tmp-", ".old-")
    foreign = [
        p.name for p in out.iterdir() if p.name not in (*RUN_FILES, LOCK_NAME) and not any(t in p.name for t in temp)
    ]
    if foreign:
        raise ConfigError(
            f"{out} holds {', '.join(sorted(foreign)[:3])}, which no mechopd run wrote; move it out of {out} and "
            "rerun (nothing was deleted)"
        )
    for p in out.iterdir():
        if p.name != LOCK_NAME:
            remove_own(p)


def evaluate_all(
    cfg: Any,
    models: dict[str, Path],
    run: Path,
    spec: Any = None,
    other_contexts: bool = True,
    eval_fields: dict[str, Any] | None = None,
) -> dict[str, EvalReport]:
    """Both views (and the other contexts) of every model; ``spec``: render spec, ``eval_fields``: EvalConfig's."""
    from mechopd.evaluation import following
    from mechopd.evaluation.evaluate import EvalConfig, evaluate_model, format_summary
    from mechopd.tasks.base import get_task

    task = get_task(cfg.task, **(cfg.task_options or {}))
    out = {}
    for name, path in models.items():
        target = run / "eval" / f"{name}.json"
        if FileSet.complete(target.parent, name, (target.name, f"{name}.csv")):  # the whole set, not one file
            out[name] = EvalReport.load(target)
            continue
        ecfg = EvalConfig(n=cfg.eval_n, seed=cfg.seed, **(eval_fields or {}))
        _log(
            f"evaluate {name} ({len(out) + 1} of {len(models)}): {ecfg.n} held-out items x {ecfg.samples} sample(s), "
            f"both views{', then the other contexts' if other_contexts else ''} ..."
        )
        t0 = time.time()
        model, tok = load_model(path), load_tokenizer(path)
        raw = evaluate_model(model, tok, task, ecfg, spec)
        raw["settings"]["model"] = str(Path(path).resolve()) if Path(path).exists() else str(path)  # not cwd-relative
        if other_contexts:
            following.add_following(raw, model, tok, task, ecfg, spec)  # rules: the family's other rules
        rep = EvalReport.from_dict(raw, name)
        rep.save(target)  # the JSON and the CSV as one file set
        out[name] = rep
        print(format_summary(name, rep.summary.to_dict()), flush=True)
        _log(f"evaluate {name}: done ({time.time() - t0:.0f} s)")
    docs = {name: rep.to_dict() for name, rep in out.items()}
    following.apply_retention(docs)  # retention and context-deaf against base (idempotent on reused reports)
    for name, doc in docs.items():
        out[name] = EvalReport.from_dict(doc, name)
        out[name].save(run / "eval" / f"{name}.json")
    if other_contexts:
        print(following.format_following(docs), flush=True)
    return out


def run_probes(
    cfg: Any,
    models: dict[str, Path],
    run: Path,
    chosen: dict[str, Any] | None = None,
    setup_fields: dict[str, Any] | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """Every registered probe that has a place in the demo (`ProbeSpec.demo`: its options, the models by ROLE), on
    the demo's setup (task, probe_n items, seed; models base + methods). The roles are the run's study's
    (``study.yaml``; without one: the labels of ``models``); a probe whose file set is complete, or that needs a role
    the study lacks, is skipped (and says so). ``chosen``: a study's name -> (setup fields, options over the demo's);
    ``skip``: probes not run here (a study's ``first_seed_only`` on a later seed)."""
    from mechopd.probes.registry import demo_options, study_options
    from mechopd.probes.registry import probes as registered
    from mechopd.probes.setup import ProbeSetup

    out = run / "probes"
    study = RunSet.load(run) if (run / STUDY_FILE).is_file() else RunSet.of_models(run, cfg.task, models)
    setup = ProbeSetup(
        task=cfg.task,
        task_options=dict(cfg.task_options or {}),
        n=cfg.probe_n,
        seed=cfg.seed,
        models={k: str(v) for k, v in models.items()},
        run=str(run),
        **(setup_fields or {}),
    )
    for spec in registered():
        own_setup, own = (chosen or {}).get(spec.name, ({}, {}))
        if (spec.demo is None if chosen is None else spec.name not in chosen) or FileSet.complete(
            out, spec.name, spec.outputs
        ):  # not in the demo / the study; all its files there, or it reruns
            continue
        if spec.name in skip:
            continue
        roles = getattr(spec, "role_options", ())
        wanted = {**(spec.demo or {}), **own} if chosen is None else study_options(spec, own)
        options = demo_options(SimpleNamespace(demo=wanted, role_options=roles), _WithTeacher(study, models, spec))
        if options is None:
            _log(
                f"probe {spec.name}: skipped (its roles {getattr(spec, 'role_options', ())} name no run of the study "
                f"{_WithTeacher(study, models, spec).roles})"
            )
            continue
        options.update(_chosen_checkpoints(spec, options, models, run))
        _log(f"probe {spec.name} ({', '.join(f'{k}={v}' for k, v in options.items())})")
        spec(replace(setup, **own_setup) if own_setup else setup, out, **options)


class _WithTeacher:
    """A study's roles as `demo_options` reads them, plus ``teacher`` when the seed run has one and the probe reads it
    (`ProbeSpec.reads_teacher`: a cross-model study's teacher is no run of the study, but a study file may point a
    forward-only probe at it: similarity, lens)."""

    def __init__(self, study: RunSet, models: dict[str, Path], spec: Any):
        self.study, self.teacher = study, "teacher" in models and bool(getattr(spec, "reads_teacher", False))

    def name(self, role: str) -> str | None:
        return "teacher" if role == "teacher" and self.teacher else self.study.name(role)

    @property
    def roles(self) -> list[str]:
        return [*self.study.roles, *(["teacher"] if self.teacher else [])]


def _chosen_checkpoints(spec: Any, options: dict[str, Any], models: dict[str, Path], run: Path) -> dict[str, str]:
    """A probe with a ``checkpoint`` rule (`ProbeSpec.checkpoint`): each role option naming a trained run of ``run``
    -> the checkpoint the rule picks, recorded with its reason in ``RUN/<probe>_checkpoint.json``."""
    from mechopd.probes.registry import resolve

    picked: dict[str, str] = {}
    rule = getattr(spec, "checkpoint", None)  # a registration without the field (an older plug-in) has no rule
    if rule is None:
        return picked
    for opt in getattr(spec, "role_options", ()):
        name = options.get(opt)
        if name in models and name != "base" and (run / "train" / name).is_dir():
            checkpoint, why = resolve(rule)(run / "train" / name)
            write_json(run / f"{spec.name}_checkpoint.json", {"checkpoint": str(checkpoint), "why": why})
            picked[opt] = str(checkpoint)
    return picked


def probes_whole(run: Path, names: Any = None) -> bool:
    """No probe the run runs is half-written: each of ``names`` (None: every probe with a demo entry, the demo's) with
    a file or a manifest in ``run/probes`` has its whole file set there (`FileSet.complete`). A run killed between a
    probe's two files (a ``--force`` rerun's commit) is not done: the demo's and the study's rerun run it again."""
    from mechopd.probes.registry import probes as registered

    out = run / "probes"
    for spec in registered():
        if spec.demo is None if names is None else spec.name not in names:
            continue  # a probe this run does not run: a rerun would not mend it
        started = FileSet.manifest_path(out, spec.name).exists() or any((out / f).exists() for f in spec.outputs)
        if started and not FileSet.complete(out, spec.name, spec.outputs):
            return False
    return True
