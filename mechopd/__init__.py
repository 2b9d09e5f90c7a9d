"""mechopd: the mechanistic study of on-policy distillation (OPD) of privileged context.

The Python entry points are plain functions, named after the CLI verbs they mirror:

    import mechopd
    final = mechopd.run_train({"task": "rules", "method": "nca"}, "runs/nca")      # `mechopd train`
    report = mechopd.run_eval("runs/nca/final", "rules", n=200)                     # `mechopd eval`

(``mechopd.train`` and ``mechopd.evaluation.evaluate`` are the training package and the evaluation module, importable as usual:
``mechopd.train.trainer.train``, ``mechopd.evaluation.evaluate.EvalConfig``. A function cannot share a name with a submodule:
importing the submodule rebinds the name, which is why the functions are ``run_train`` / ``run_eval``.)
"""

from __future__ import annotations

import re as _re
from pathlib import Path as _Path
from typing import Any as _Any

from mechopd.core import options as _options

__version__ = "0.1.0"


def _fill_registries() -> None:
    """Import the packages that fill `mechopd.core.options`' registries (a config field's choices that a package above
    the config extends): run on the first read of one, so ``import mechopd`` stays light (no torch) and a config built
    from Python (``TrainConfig(method=...)``) is checked against the live names, as one read from the CLI."""
    import mechopd.objectives.losses  # noqa: F401  (the ``method`` registry)
    import mechopd.objectives.select  # noqa: F401  (the ``selector`` registry)


_options.add_registry_loader(_fill_registries)

# a Python caller's words for the CLI's in an error message (the library's errors name the command-line flags)
_PYTHON_WORDS = (
    (r"pass --resume\b", "pass resume=True"),
    (r"--resume\b", "resume=True"),
    (r"new --out\b", "new out_dir"),
    (r"--out\b", "out_dir"),
    (r"--set (\w[\w.]*)=", r"config key \1="),
    (r"--set\b", "a config key"),
)


def _python_words(message: str) -> str:
    for pattern, words in _PYTHON_WORDS:
        message = _re.sub(pattern, words, message)
    return message


def run_train(
    config: _Any, out_dir: str | _Path, resume: bool = False, progress: bool = True, verbose: bool = False
) -> _Path:
    """Train one run (a `mechopd.config.TrainConfig` or a dict of its fields) into ``out_dir``; returns the final
    checkpoint directory (`mechopd.train.trainer.train`). ``resume=True`` continues the run in ``out_dir`` from its
    latest checkpoint (a new directory starts a new run); ``verbose`` prints the full resolved config. A bad input
    raises a `mechopd.core.errors.MechopdError` whose message names these arguments."""
    from mechopd.core.errors import MechopdError
    from mechopd.train.trainer import train

    try:
        return train(config, out_dir, resume=resume, progress=progress, verbose=verbose)
    except MechopdError as e:
        raise type(e)(_python_words(str(e))) from None


def run_eval(model: _Any, task: _Any = None, **options: _Any) -> dict[str, _Any]:
    """Evaluate a checkpoint (dir, hub id, organism:<task>; or a loaded model with ``tokenizer=``) in both views on
    held-out items of ``task`` (None: the task its training record names), with `mechopd eval`'s checks; options: n,
    seed, samples, temperature, max_new_tokens, engine, no_context_system, chat_template_kwargs, other_contexts,
    spec, tokenizer, task_options, out (`mechopd.evaluation.run.evaluate_checkpoint`)."""
    from mechopd.evaluation.run import evaluate_checkpoint

    return evaluate_checkpoint(model, task, **options)


__all__ = ["__version__", "run_eval", "run_train"]


_PUBLIC_MODULES = (
    "config",
    "core",
    "evaluation",
    "models",
    "plots",
    "probes",
    "report",
    "study",
    "tasks",
    "train",
)  # what a caller imports


def __dir__() -> list[str]:
    """The public API only: the entry points and the modules a caller imports (not typing names or helpers)."""
    return sorted(set(__all__) | set(_PUBLIC_MODULES))
