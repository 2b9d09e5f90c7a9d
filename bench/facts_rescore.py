"""Not a timing: the ``facts`` task's ``contains`` sensitivity row beside ``strict`` (issue 52), from saved evaluations.

Every evaluation JSON under the given paths (files, or folders searched recursively: ``mechopd eval --out``, a study's
``RUN/seed-k/...``) whose records are ``facts`` items (uid ``fNNN.qJJ``) is rescored from its saved responses under
both formats (`mechopd.tasks.facts.rescore`; no model is loaded). One line per file: n, Acc_x and Acc_xc under strict
and contains; the difference is what a reply naming several answers (or the other handbook's) changes.

    python bench/facts_rescore.py runs/smollm2-handbooks
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from mechopd.tasks import get_task
from mechopd.tasks.facts import rescore

_UID = re.compile(r"^f\d{3}\.q\d{2}$")


def facts_records(path: Path) -> list[dict] | None:
    """The records of one evaluation JSON if they are facts items, else None."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    records = doc.get("records") if isinstance(doc, dict) else None
    if not records or not all(isinstance(r, dict) and _UID.match(str(r.get("uid", ""))) for r in records):
        return None
    return [r for r in records if "response_x" in r and "response_xc" in r]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    task = get_task("facts")  # the pool's answers (both parts): strict's list of other answers
    files = sorted({f for p in args.paths for f in ([p] if p.is_file() else p.rglob("*.json"))})
    found = 0
    for f in files:
        records = facts_records(f)
        if not records:
            continue
        found += 1
        s, c = rescore(task, records, "strict"), rescore(task, records, "contains")
        print(
            f"{f}: n={len(records)}  strict Acc_x {s['acc_x']:.3f} Acc_xc {s['acc_xc']:.3f}  "
            f"contains Acc_x {c['acc_x']:.3f} Acc_xc {c['acc_xc']:.3f}"
        )
    if not found:
        print(f"error: no facts evaluation under {', '.join(map(str, args.paths))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
