"""mechopd: the mechanistic study of on-policy distillation (OPD) of privileged context.

The Python entry points are plain functions, named after the CLI verbs they mirror:

    import mechopd
    final = mechopd.run_train({"task": "rules", "method": "nca"}, "runs/nca")      # `mechopd train`
    report = mechopd.run_eval("runs/nca/final", "rules", n=200)                     # `mechopd eval`

(``mechopd.train`` and ``mechopd.evaluate`` are the training package and the evaluation module, importable as usual:
``mechopd.train.trainer.train``, ``mechopd.evaluate.EvalConfig``. A function cannot share a name with a submodule:
importing the submodule rebinds the name, which is why the functions are ``run_train`` / ``run_eval``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__version__ = "0.1.0"


def run_train(config: Any, out_dir: str | Path, resume: bool = False, progress: bool = True) -> Path:
    """Train one run (a `mechopd.config.TrainConfig` or a dict of its fields) into ``out_dir``; returns the final
    checkpoint directory (`mechopd.train.trainer.train`)."""
    from mechopd.train.trainer import train

    return train(config, out_dir, resume=resume, progress=progress)


def run_eval(model: Any, task: Any, **options: Any) -> dict[str, Any]:
    """Evaluate a checkpoint (dir, or a loaded model with ``tokenizer=``) in both views on held-out items of ``task``;
    options: n, seed, samples, temperature, spec, tokenizer, task_options, out (`mechopd.evaluate.evaluate`)."""
    from mechopd.evaluate import evaluate

    return evaluate(model, task, **options)


__all__ = ["__version__", "run_eval", "run_train"]
