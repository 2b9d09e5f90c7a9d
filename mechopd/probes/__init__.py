"""Mechanistic probes of two-view models: `ProbeSetup` (setup.py) says what to probe -- task, options, render spec,
sampling, items, models -- from a run dir, CLI flags or Python; `register_probe` (registry.py) adds a probe to
``mechopd probe``, the demo, the figures and the report. Built-ins: similarity, gradients, deltas, teachability.

    from mechopd.probes import ProbeSetup, get_probe
    setup = ProbeSetup.from_run("runs/demo")
    get_probe("similarity")(setup, "runs/demo/probes", models=["base", "opd", "nca"])
"""

from mechopd.probes.registry import ProbeSpec, get_probe, probes, register_probe
from mechopd.probes.setup import ProbeSetup

__all__ = ["ProbeSetup", "ProbeSpec", "get_probe", "probes", "register_probe"]
