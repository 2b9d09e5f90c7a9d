"""`mechopd pretrain` as a library call: pretrain (or reuse) an organism, then its held-out accuracy in both views.

    from mechopd.pipeline.pretrain import pretrain_organism
    path, acc = pretrain_organism("rules", n=200)   # acc: {"acc_xc", "acc_x", "n"}, also in path/accuracy.json

Acc_xc and Acc_x are the greedy accuracies with and without the context (docs/method.md §2) on ``n`` held-out items.
Every setting is checked before any work (the evaluation config, the organism config, the output directory).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mechopd.core.artifacts import write_json
from mechopd.core.checks import check_out_dir
from mechopd.core.errors import ConfigError
from mechopd.evaluation.config import EvalConfig
from mechopd.evaluation.evaluate import evaluate_model
from mechopd.models import load_model, load_tokenizer
from mechopd.organisms.pretrain import OrganismConfig, default_config, organism_dir_name, pretrain
from mechopd.tasks.base import get_task

ACCURACY_FILE = "accuracy.json"


def pretrain_organism(
    task: str, out: str | Path | None = None, *, n: int = EvalConfig.n, progress: bool = True, **organism: Any
) -> tuple[Path, dict[str, Any]]:
    """Pretrain (or reuse: same config) the ``task`` organism into ``out`` (default runs/organisms/<task>[-L<n>]),
    evaluate it on ``n`` held-out items and write ``accuracy.json``; returns (its path, the accuracy). ``organism``:
    `OrganismConfig` fields over the task's defaults (`default_config`): ``steps``, ``layers`` (= ``num_layers``),
    ``seed`` (also the held-out check's), ``arch``, ``num_heads``, ..."""
    if "num_layers" in organism:
        organism["layers"] = organism.pop("num_layers")
    ecfg = EvalConfig(n=n, seed=organism.get("seed", OrganismConfig.seed), n_boot=0)  # all checked before any work
    cfg = default_config(task, **{k: organism.pop(k) for k in ("seed", "arch", "steps", "layers") if k in organism})
    known = {f.name for f in dataclasses.fields(OrganismConfig)} - {"task", "num_layers"}
    if set(organism) - known:
        raise ConfigError(
            f"pretrain_organism: unknown organism field(s) {', '.join(sorted(set(organism) - known))}; "
            f"use {', '.join(sorted({*known, 'layers'}))}"
        )
    cfg = dataclasses.replace(cfg, **organism)
    target = check_out_dir(out or f"runs/organisms/{organism_dir_name(task, cfg.num_layers)}")
    path = Path(pretrain(cfg, target, progress=progress))
    rep = evaluate_model(load_model(path), load_tokenizer(path), get_task(task, **cfg.task_options), ecfg)
    s = rep["summary"]
    accuracy = {"acc_xc": s["acc_xc"]["value"], "acc_x": s["acc_x"]["value"], "n": s["n"]}
    write_json(path / ACCURACY_FILE, accuracy)
    return path, accuracy
