"""The training recipe of each embedded organism: what `mechopd train --student organism:<task>` starts from.

The library's defaults are the papers' (lr 5e-6, batch 128): right for a 1–8B model, far too timid for a 3-layer
organism (100 steps at those values leave Acc_x at 0.000). When the student is ``organism:<task>``, the config
starts from ``ORGANISM_RECIPES[task]`` and every key set explicitly (YAML, ``--set``, a flag) wins over it; any other
student keeps the papers' defaults. These are the values `mechopd demo` and ``training/organisms/<task>.yaml`` use
(CPU, minutes per run). Method, β and selector are not part of a recipe: they are the experiment.
"""

from __future__ import annotations

from typing import Any

ORGANISM_RECIPES: dict[str, dict[str, Any]] = {
    "rules": {"estimator": "full", "batch_size": 32, "lr": 1e-3, "steps": 150, "eval_every": 25, "eval_n": 200,
              "save_every": 75},
    "frozenlake": {"estimator": "full", "batch_size": 32, "lr": 5e-4, "steps": 120, "eval_every": 20, "eval_n": 100,
                   "save_every": 60},
    "sokoban": {"estimator": "full", "batch_size": 32, "lr": 5e-4, "steps": 120, "eval_every": 20, "eval_n": 100,
                "save_every": 60},
}


def organism_task(student: str) -> str | None:
    """``"organism:rules"`` -> ``"rules"``; None for any other student spec."""
    return student.split(":", 1)[1] if isinstance(student, str) and student.startswith("organism:") else None


def recipe_for(student: str) -> dict[str, Any]:
    """The recipe a student starts from (empty for a non-organism student or an unknown organism task)."""
    task = organism_task(student)
    return dict(ORGANISM_RECIPES.get(task, {})) if task else {}
