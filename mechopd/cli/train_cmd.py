"""`mechopd pretrain` and `mechopd train`: thin around `mechopd.pipeline.pretrain.pretrain_organism` and
`mechopd.train.trainer.train`. Registered in the command table of `mechopd.cli.common`; `mechopd.cli` builds the
parser."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechopd.cli.common import add_given, command, given, setup_facts
from mechopd.cli.common import kv_raw as _kv_raw
from mechopd.core.errors import ConfigError
from mechopd.core.options import field_facts, option
from mechopd.core.runlock import hold, lockable
from mechopd.evaluation.config import EVAL_FACTS

# --- pretrain -----------------------------------------------------------------------------------------------------------
PRETRAIN_FIELDS = ("task", "seed", "arch", "steps", "num_layers", "num_heads", "num_kv_heads")  # OrganismConfig's


def _pretrain_facts() -> list[Any]:
    """`mechopd pretrain`'s declared flags: the organism's fields it takes, then the held-out check's ``--n``."""
    from mechopd.organisms.pretrain import organism_facts

    facts = organism_facts()
    return [facts[name] for name in PRETRAIN_FIELDS] + [f for f in EVAL_FACTS if f.name == "n"]


@dataclass
class PretrainArgs:
    """`mechopd pretrain`'s own argument (the rest: `_pretrain_facts`)."""

    out: str | None = option(
        None,
        help="organism directory (default runs/organisms/<task>); an organism already there with the same config is "
        "reused",
        metavar="DIR",
    )


def _pretrain_args(p: argparse.ArgumentParser) -> None:
    add_given(p, field_facts(PretrainArgs) + _pretrain_facts())  # OrganismConfig's (and EvalConfig's n): declared once


@command(
    "pretrain",
    "pretrain (or reuse) an embedded model organism and report its accuracy with/without context",
    _pretrain_args,
)
def _pretrain(a: argparse.Namespace) -> int:
    import time

    from mechopd.organisms.pretrain import OrganismConfig
    from mechopd.pipeline.pretrain import pretrain_organism

    kw = given(a, _pretrain_facts())  # checked by pretrain_organism, as a Python caller's are
    task = kw.pop("task", OrganismConfig.task)
    t0 = time.time()
    path, acc = pretrain_organism(task, a.out, **kw)
    print(f"organism {task}: {path} ({time.time() - t0:.0f} s)")
    print(
        f"accuracy with context {acc['acc_xc']:.3f}, without context {acc['acc_x']:.3f} (n={acc['n']} held-out "
        "items, greedy)"
    )
    return 0


# --- train --------------------------------------------------------------------------------------------------------------
@dataclass
class TrainArgs:
    """`mechopd train`'s own arguments (the config's keys: `train_facts`; --option: the probes' setup's)."""

    config: str | None = option(
        None, help="YAML config (see training/*.yaml); flags override its keys", flag="config", metavar="CONFIG.yaml"
    )
    set: list[str] = option(
        default_factory=list,
        help="override any config key, repeatable (e.g. --set lr=1e-4 --set task_options.rule=shift:2)",
        repeat=True,
        metavar="KEY=VALUE",
    )
    out: str | None = option(
        None,
        help="run directory, new or empty unless --resume (default runs/<config name or task-method-selector>)",
        metavar="DIR",
    )


def _train_args(p: argparse.ArgumentParser) -> None:
    from mechopd.config import train_facts
    from mechopd.core.options import add_flags

    add_given(p, field_facts(TrainArgs) + setup_facts("task_options"))  # --option KEY=VALUE: as eval's and probe's
    # the controls of `train.trainer.train(resume=, progress=, verbose=)`, whose signature holds their defaults
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (metrics.jsonl is written either way)")
    p.add_argument("--verbose", action="store_true", help="print the full resolved config (else one line and its path)")
    add_flags(p, train_facts())  # one flag per config key (mechopd.config: help, range and choices declared once)


def run_name(config: str | None, task: str, method: str, selector: str) -> str:
    """Default run directory name: the config's stem, except for a per-task organism recipe
    (``training/organisms/<task>.yaml``, method as a flag) or no config: ``<task>-<method>-<selector>``."""
    stem = Path(config).stem if config else None
    return stem if stem not in (None, task) else f"{task}-{method}-{selector}"


@command("train", "train one OPD / NCA / TA-OPD / ablation run", _train_args)
def _train(a: argparse.Namespace) -> int:
    if a.out and lockable(a.out) and os.environ.get("RANK", "0") == "0":  # lock first (torchrun: rank 0):
        # a second job on this --out refuses before torch loads
        with hold(a.out, "train"):
            return _train_locked(a)
    return _train_locked(a)


def _train_locked(a: argparse.Namespace) -> int:
    from mechopd.config import train_facts
    from mechopd.core.checks import check_out_dir
    from mechopd.core.config_parse import merge, parse_overrides
    from mechopd.core.options import flag_values
    from mechopd.organisms.recipes import load_train_config
    from mechopd.train.trainer import train

    flags = merge(
        flag_values(a, train_facts()),
        parse_overrides([f"task_options.{kv}" for kv in a.task_options or []], "--option"),
    )
    over = merge(flags, _kv_raw(a.set, "--set"))  # values still text: read once, by each field's type
    cfg = load_train_config(a.config, over)
    out = check_out_dir(a.out or f"runs/{run_name(a.config, cfg.task, cfg.method, cfg.selector)}")
    if (out / "config.json").is_file():
        raise ConfigError(
            f"--out {out} is a model directory (config.json), not a training run; a run writes its own "
            "directory: choose another --out (the model is not touched)"
        )
    final = train(cfg, out, resume=a.resume, progress=not a.no_progress, verbose=a.verbose)
    if os.environ.get("RANK", "0") == "0":  # torchrun: said once, by rank 0
        print(f"final checkpoint: {final}")
    return 0
