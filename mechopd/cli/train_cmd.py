"""`mechopd pretrain` and `mechopd train`: thin around `mechopd.pipeline.pretrain.pretrain_organism` and
`mechopd.train.trainer.train`. Registered in the command table of `mechopd.cli.common`; `mechopd.cli` builds the
parser."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mechopd.cli.common import command
from mechopd.cli.common import kv_raw as _kv_raw
from mechopd.core.errors import ConfigError
from mechopd.core.runlock import hold, lockable
from mechopd.evaluation.config import EvalConfig


# --- pretrain -----------------------------------------------------------------------------------------------------------
def _pretrain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, metavar="TASK", help="organism task: rules | frozenlake | sokoban")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="organism directory (default runs/organisms/<task>); "
        "an organism already there with the same config is reused",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="INT",
        help="seed of the corpus, the initial weights and the held-out check (default 0)",
    )
    p.add_argument("--arch", default="qwen3", metavar="ARCH", help="decoder architecture: qwen3 (default) | llama")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="INT",
        help="pretraining steps, >= 1 (default: the organism's measured schedule)",
    )
    p.add_argument(
        "--n",
        type=int,
        default=EvalConfig.n,
        metavar="INT",
        help=f"held-out items of the with/without-context accuracy check, >= 1 (default {EvalConfig.n})",
    )
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        metavar="INT",
        help="decoder layers (default 3; e.g. 8 for layer studies; cached as runs/organisms/<task>-L<n>)",
    )
    p.add_argument(
        "--num-heads",
        type=int,
        default=None,
        metavar="INT",
        help="attention heads (default 4: head_dim 24; 3 gives head_dim 32, a size vLLM's CPU attention accepts)",
    )
    p.add_argument(
        "--num-kv-heads",
        type=int,
        default=None,
        metavar="INT",
        help="key/value heads (default 2; must divide --num-heads)",
    )


@command("pretrain", "pretrain (or reuse) an embedded model organism and report its accuracy with/without context")
def _pretrain(a: argparse.Namespace) -> int:
    import time

    from mechopd.pipeline.pretrain import pretrain_organism

    t0 = time.time()
    path, acc = pretrain_organism(
        a.task,
        a.out,
        seed=a.seed,
        arch=a.arch,
        steps=a.steps,
        n=a.n,
        layers=a.layers,
        num_heads=a.num_heads,
        num_kv_heads=a.num_kv_heads,
    )
    print(f"organism {a.task}: {path} ({time.time() - t0:.0f} s)")
    print(
        f"accuracy with context {acc['acc_xc']:.3f}, without context {acc['acc_x']:.3f} (n={acc['n']} held-out "
        "items, greedy)"
    )
    return 0


# --- train --------------------------------------------------------------------------------------------------------------
def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        nargs="?",
        default=None,
        metavar="CONFIG.yaml",
        help="YAML config (see training/*.yaml); flags override its keys",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, repeatable (e.g. --set lr=1e-4 --set task_options.rule=shift:2)",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="run directory, new or empty unless --resume (default runs/<config name or task-method-selector>)",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task option, repeatable (e.g. "
        "rule=shift:2); same as --set task_options.KEY=VALUE, and as eval's and probe's --option",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (metrics.jsonl is written either way)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="print the full resolved config (default: one line and the path of the run's config.yaml)",
    )
    from mechopd.config import train_facts
    from mechopd.core.options import add_flags

    add_flags(p, train_facts())  # one flag per config key (mechopd.config: help, range and choices declared once)


def run_name(config: str | None, task: str, method: str, selector: str) -> str:
    """Default run directory name: the config's stem, except for a per-task organism recipe
    (``training/organisms/<task>.yaml``, method as a flag) or no config: ``<task>-<method>-<selector>``."""
    stem = Path(config).stem if config else None
    return stem if stem not in (None, task) else f"{task}-{method}-{selector}"


@command("train", "train one OPD / NCA / TA-OPD / ablation run")
def _train(a: argparse.Namespace) -> int:
    if a.out and lockable(a.out) and os.environ.get("RANK", "0") == "0":  # lock first (torchrun: rank 0):
        # a second job on this --out refuses before torch loads
        with hold(a.out, "train"):
            return _train_locked(a)
    return _train_locked(a)


def _train_locked(a: argparse.Namespace) -> int:
    from mechopd.config import merge, train_facts
    from mechopd.core.checks import check_out_dir
    from mechopd.core.config_parse import parse_overrides
    from mechopd.core.options import flag_values
    from mechopd.organisms.recipes import load_train_config
    from mechopd.train.trainer import train

    flags = merge(flag_values(a, train_facts()), parse_overrides([f"task_options.{kv}" for kv in a.option], "--option"))
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
