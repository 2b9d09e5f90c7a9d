"""`mechopd probe NAME`: one verb per registered probe (`mechopd.probes.registry`), its flags generated from two
declarations: the setup's (`mechopd.probes.setup.ProbeSetup`: --run, --task, --option, ...) and the probe's options
dataclass, by the one flag generator (`mechopd.core.options.add_flags`, typed: values parsed by argparse, None unless
given), plus the verb's own --out and --force. Argument binding only: the setup from the flags, then the registration
runs the probe (`ProbeSpec.__call__`) with the flags given (the rest: its options dataclass's defaults)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechopd.cli.common import command, kv, text
from mechopd.core.errors import ConfigError
from mechopd.core.options import option


@dataclass
class ProbeArgs:
    """`mechopd probe NAME`'s own arguments (the rest: the setup's and the probe's options)."""

    out: str | None = option(None, help="output dir (default RUN_DIR/probes, else runs/probes/<probe>)", metavar="DIR")
    force: bool = option(
        False,
        help="replace this probe's files in the output directory; without it an existing one is refused",
        switch=True,
    )


def add_probe_parsers(p: argparse.ArgumentParser) -> None:
    """One subparser per registered probe: the setup flags, --out, the probe's own flags, --force."""
    from mechopd.core.options import add_flags, field_facts
    from mechopd.probes.options import facts_of
    from mechopd.probes.registry import probes
    from mechopd.probes.setup import ProbeSetup

    sub = p.add_subparsers(dest="probe", required=True)
    for spec in probes():
        q = sub.add_parser(spec.name, help=spec.help, description=spec.help)
        own = {f.name: f for f in field_facts(ProbeArgs)}
        force = dataclasses.replace(
            own["force"], help=f"{own['force'].help} ({', '.join(spec.outputs) or 'its tables'})"
        )
        add_flags(q, field_facts(ProbeSetup), typed=True)  # None unless given: they override what --run says
        add_flags(q, [own["out"]], typed=True)
        add_flags(q, facts_of(spec.options), typed=True)  # None unless given: the dataclass's default
        add_flags(q, [force], typed=True)


def setup_from_args(a: Any) -> Any:
    """The `ProbeSetup` the flags describe: ``--run`` first (if given), then every flag that is set on top of it."""
    from mechopd.core.options import field_facts
    from mechopd.probes.setup import ProbeSetup

    base = ProbeSetup.from_run(a.run) if a.run else ProbeSetup()
    if a.task is not None and a.task != base.task:  # another task: the run's options belong to its own task
        base = dataclasses.replace(base, task_options={})
    given = {f.name: getattr(a, f.name) for f in field_facts(ProbeSetup) if f.name != "run"}  # the flagged fields
    given["task_options"] = kv(a.task_options, "--option")
    given["chat_template_kwargs"] = kv(a.chat_template_kwargs, "--chat-template-kwarg")
    given["no_context_system"] = text(a.no_context_system, "--no-context-system")
    return base.replace(**given)


def run_from_args(a: argparse.Namespace) -> list[str]:
    """`mechopd probe <name> ...`: the setup from the flags, the probe's options from its own flags; run it."""
    from mechopd.core.runlock import hold
    from mechopd.probes.options import defaults
    from mechopd.probes.registry import get_probe

    spec = get_probe(a.probe)
    options = {k: v for k in defaults(spec.options) if (v := getattr(a, k)) is not None}  # the flags given
    out = Path(a.out) if a.out else (Path(a.run) / "probes" if a.run else Path("runs/probes") / spec.name)
    if not a.out and a.run:  # the run's own probes/: never written through a link that leads out of the run
        from mechopd.core.runcheck import check_no_escape

        check_no_escape(a.run, out, "--run")
    setup = setup_from_args(a)
    taken = [name for name in spec.outputs if (out / name).exists()]
    if taken and not a.force:  # the run's report and figures read these files
        raise ConfigError(
            f"probe {spec.name}: {out / taken[0]} already exists (a run's report and figures read it); "
            "pass --force to replace the probe's files, or --out DIR to write beside them"
        )
    with hold(out, f"probe {spec.name}"):  # one writer per output directory
        return spec(setup, out, **options)


@command(
    "probe", "mechanistic probes (mechopd probe NAME --run RUN_DIR; NAME: see mechopd probe --help)", add_probe_parsers
)
def _probe(a: argparse.Namespace) -> int:
    for line in run_from_args(a):
        print(line)
    return 0
