"""mechopd: the mechanistic study of on-policy distillation (OPD) of privileged context.

``mechopd.train(config, out_dir)`` trains a run; ``mechopd.evaluate(model_dir, "rules", n=200)`` evaluates a
checkpoint in both views. Both are callable modules (``mechopd.train.trainer``, ``mechopd.evaluate.EvalConfig``
stay importable as usual).
"""

__version__ = "0.1.0"

from mechopd import evaluate, train  # noqa: E402,F401  (callable modules)
