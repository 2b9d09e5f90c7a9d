"""Before/after check of the probe verbs: `mechopd probe NAME --help` text and parsed defaults of every probe.

    PYTHONPATH=/work/main python bench/probe_flags.py dump /tmp/before.json     # the old tree
    PYTHONPATH=$PWD       python bench/probe_flags.py dump /tmp/after.json      # this tree
    python bench/probe_flags.py diff /tmp/before.json /tmp/after.json          # differences, per probe

The diff prints every probe whose help text, defaults, demo options or outputs differ, and the figure index (name,
title, caption, report order) when it differs (exit 1), or "identical" (exit 0).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys


def dump(path: str) -> None:
    import os

    os.environ["COLUMNS"] = "120"  # argparse wraps the help at the terminal width
    from mechopd.cli.probe_cmd import add_probe_parsers
    from mechopd.probes.registry import probes

    parser = argparse.ArgumentParser(prog="mechopd probe")
    add_probe_parsers(parser)
    verbs = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    doc = {}
    for spec in probes():
        sub = verbs[spec.name]
        defaults = {k: v for k, v in vars(parser.parse_args([spec.name])).items()}
        doc[spec.name] = {
            "help": sub.format_help(),
            "defaults": {k: repr(v) for k, v in sorted(defaults.items())},
            "demo": repr(spec.demo),
            "outputs": list(spec.outputs),
        }
    from mechopd.plots import figure_index

    doc["(figures)"] = {"index": [list(f) for f in figure_index()]}  # name, title, caption, in report order
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{len(doc)} probes -> {path}")


def diff(a_path: str, b_path: str) -> int:
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    bad = 0
    if list(a) != list(b):
        print(f"probe order differs: {list(a)} -> {list(b)}")
        bad += 1
    for name in a:
        for key in ("help", "defaults", "demo", "outputs", "index"):
            x, y = a[name].get(key), (b.get(name) or {}).get(key)
            if x != y:
                bad += 1
                text = lambda v: (v if isinstance(v, str) else json.dumps(v, indent=1)).splitlines()  # noqa: E731
                print(f"--- {name}.{key}")
                print("\n".join(difflib.unified_diff(text(x), text(y), lineterm="", n=1)))
    print("identical" if not bad else f"{bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(sys.argv[2])
    else:
        sys.exit(diff(sys.argv[2], sys.argv[3]))
