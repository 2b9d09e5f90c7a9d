"""The objectives: loss terms (`losses`: OPD estimators, NCA, ablations; a term registry) and token selectors
(`select`: TA-OPD and its baselines; the teachability statistics). Shared by the trainer and the probes, so they
live outside `mechopd.train` (docs/method.md has the equations)."""
