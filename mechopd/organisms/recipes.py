"""The training recipe of each embedded organism: what `mechopd train --student organism:<task>` starts from.

The library's defaults are the papers' (lr 5e-6, batch 128): right for a 1–8B model, far too timid for a 3-layer
organism (see docs/results.md, "Numbers the code's docstrings used to carry"). When the student is ``organism:<task>``, the config
starts from ``ORGANISM_RECIPES[task]`` and every key set explicitly (YAML, ``--set``, a flag) wins over it; any other
student keeps the papers' defaults. These are the values ``training/organisms/<task>.yaml`` use (CPU, minutes per
run); the demo's built-in studies (``mechopd/data/studies/<task>.yaml``) start from them: rules as it is, a game at
half the steps and batch with the lr decaying and NCA gated (below). Method, β and selector are not part of a recipe:
they are the experiment.

``task_options: {rule: reverse}`` (rules): the distilled context is "reverse the items" (the organism is pretrained
on the whole family, so any rule can be distilled). It was chosen for what it measured, not for a mechanism: OPD's
context-induced degradation stands at the end of training on every seed measured (Harm 0.19–0.50 over 5 seeds at lr 2e-3), where shift:1, shift:3 and repeat:2 left it
transient or seed-dependent (docs/results.md, "Choosing the default study"). The harmed replies are not the input
("reverse twice is the identity" does not describe them: 0 of 193 harmed replies of the default run equal the input,
an audit in #44); they are other wrong lists.

``nca_start: 30`` (rules): β = 0 for the first 30 steps, then 0.5. From step 0 the anchor's gradient is hundreds of
times OPD's on this organism (its two views start maximally apart) and erases the context's effect before OPD moves
the no-context view; the KL gate of the previous recipe (open at KL(q_x ‖ f) ≤ 0.1 nats) never opened on a seed
where OPD plateaus (on reverse: about 1 seed in 5 stops at Acc_x ≈ 0.75, the length-6 lists), leaving NCA = OPD
there. A start at step 30 (and at 40) removed the harm on 5 of 5 seeds. It changes only anchor terms (NCA, SymKL).

TA-OPD's support size K is the method's, not the recipe's (the demo's rules study sets K = 2). The answer vocabulary has 11 tokens, so the paper's K = 16 holds all of it,
C ≈ 1 at most tokens, TA-OPD degenerates to "the 10 % highest-divergence tokens" and collapses (0.000 in both views
on every seed measured at lr 1e-3 and 2e-3); K = 2 learns on 3 of 3 seeds at lr 2e-3 (K = 4 on 1 of 3).

``lr: 2e-3``, 100 steps: with the linear decay, OPD reaches Acc_x 1.0 by step 50–75 on most seeds.

``lr_schedule: linear`` (rules): the rate decays linearly to 0 at the last step (the Hugging Face Trainer's default).
At a constant lr 1e-3 (200 times the papers'; the rules recipe now runs at 2e-3) AdamW near convergence can take rare large steps, and a final checkpoint
can be caught in one; the decay keeps the late steps small. It applies to every method alike.
``nca_gate`` (sokoban): a KL gate (0.1 nats over 5 steps), so that NCA does not erase the context's effect before OPD
has moved the no-context view. FrozenLake's recipe keeps the constant β and both game recipes the constant lr (what
`mechopd train organism:<game>` runs); the demo's game studies apply the gate to both games and decay the lr linearly
(``mechopd/data/studies/{frozenlake,sokoban}.yaml``). What these choices were measured to do: docs/results.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechopd.config import TrainConfig, bind_train
from mechopd.core.config_parse import load_yaml, merge
from mechopd.models.spec import organism_task

ORGANISM_RECIPES: dict[str, dict[str, Any]] = {
    "rules": {
        "estimator": "full",
        "batch_size": 32,
        "lr": 2e-3,
        "steps": 100,
        "eval_every": 25,
        "eval_n": 200,
        "save_every": 50,
        "nca_start": 30,
        "lr_schedule": "linear",
        "task_options": {"rule": "reverse"},
    },
    "frozenlake": {
        "estimator": "full",
        "batch_size": 32,
        "lr": 5e-4,
        "steps": 120,
        "eval_every": 20,
        "eval_n": 100,
        "save_every": 60,
    },
    "sokoban": {
        "estimator": "full",
        "batch_size": 32,
        "lr": 5e-4,
        "steps": 120,
        "eval_every": 20,
        "eval_n": 100,
        "save_every": 60,
        "nca_gate": 0.1,
    },
}


def recipe_for(student: str) -> dict[str, Any]:
    """The recipe a student starts from (empty for a non-organism student or an unknown organism task)."""
    task = organism_task(student)
    return dict(ORGANISM_RECIPES.get(task, {})) if task else {}


def resolve_train_data(data: dict[str, Any]) -> dict[str, Any]:
    """Explicit keys over the student's organism recipe (``organism:<task>``; none for other students)."""
    student = data.get("student", TrainConfig.student)
    return merge(recipe_for(student), data)


def load_train_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """A `TrainConfig` from a YAML file, then overrides, then the organism recipe for every key neither sets (the
    recipe is applied here, by the caller of `mechopd.config.bind_train`: config imports nothing above itself)."""
    data = load_yaml(path) if path else {}
    data = resolve_train_data(merge(data, overrides or {}))
    return bind_train(data, source=str(path or "train config"))
