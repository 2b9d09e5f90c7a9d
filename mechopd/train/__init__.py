"""Training: the one loop, checkpoints, process groups and sharding (losses and selectors: `mechopd.objectives`; rollouts: `mechopd.generate`). ``mechopd.train(config, out_dir)`` runs a training run."""

import sys
import types


class _CallableTrainModule(types.ModuleType):
    """Lets ``mechopd.train(config, out_dir, resume=False)`` call `mechopd.train.trainer.train` (issue API)."""

    def __call__(self, *args, **kwargs):
        from mechopd.train.trainer import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableTrainModule
