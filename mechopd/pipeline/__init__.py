"""The study runner and the demo: a study file's jobs, the worker pool, the sweep."""
