"""Training: the one loop, checkpoints, process groups and sharding (losses and selectors: `mechopd.objectives`;
rollouts: `mechopd.generate`). ``mechopd.train.trainer.train(config, out_dir)`` (or ``mechopd.run_train``) runs a
training run."""
