"""Regenerate the committed gallery (``figures/*.png``, ``figures/sample_report*.md``) from the current code, in one
command, and record what it wrote (``figures/gallery.json``)::

    python bench/gallery.py                 # three demos (rules, rules-L8, sokoban; 3 seeds each): ~25 min on 2 cores
    python bench/gallery.py --work DIR      # where the demos run (default runs/gallery; reused: a rerun resumes)

Each gallery file comes from one demo (`GALLERY`): the rules demo's seed 0 gives the single-run figures and
``sample_report.md``, its aggregate ``sample_report_seeds.md`` and the 3-seed figures; the 8-layer rules demo and the
Sokoban demo their aggregate reports and one figure each. ``figures/explorer.png`` is a browser screenshot of
``mechopd explore`` and is not redrawn here.

``figures/gallery.json`` records the date, the commit, the commands, each report's verdict lines (`verdict_lines`) and
a fingerprint of the code that writes verdicts (`verdict_code_fingerprint`): ``tests/unit/test_gallery.py`` fails when
a committed report's verdict lines differ from the recorded ones (a hand edit) or that code changed since (the
gallery no longer says what the code writes): rerun this script.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
RECORD = FIGURES / "gallery.json"

# the code whose change can change a verdict line of a report (the claims, their statistics, the report's assembly)
VERDICT_CODE = ("mechopd/report", "mechopd/core/stats.py", "mechopd/runset")

# demo name -> (its `mechopd demo` arguments, {gallery file: file of the demo's output})
GALLERY: dict[str, tuple[list[str], dict[str, str]]] = {
    "rules": (
        ["--seeds", "3"],
        {
            "sample_report.md": "seed-0/report.md",
            "sample_report_seeds.md": "report.md",
            **{
                f"{name}.png": f"seed-0/figures/{name}.png"
                for name in (
                    "training_curves",
                    "removability",
                    "regime_map",
                    "layer_cosine",
                    "gradient_alignment",
                    "parameter_deltas",
                    "context_following",
                    "teachability",
                    "weightpatch",
                    "localization",
                    "lens_kl",
                    "patching",
                    "attention_context",
                )
            },
            "training_curves_3seeds.png": "figures/training_curves.png",
            "gradient_training_3seeds.png": "figures/gradient_training.png",
            "gradient_training.png": "seed-0/figures/gradient_training.png",
        },
    ),
    "rules-L8": (
        ["--layers", "8", "--seeds", "3"],
        {
            "sample_report_rules_L8_seeds.md": "report.md",
            "parameter_deltas_L8.png": "seed-0/figures/parameter_deltas.png",
        },
    ),
    "sokoban": (
        ["--task", "sokoban", "--seeds", "3"],
        {
            "sample_report_sokoban_seeds.md": "report.md",
            "training_curves_sokoban_3seeds.png": "figures/training_curves.png",
        },
    ),
}

_VERDICT = re.compile(r"^(\d+ of \d+ claims decided|- \*\*[^*]+\*\*:|\| [^|]+ \| \*\*[^|*]+\*\* \|)")


def verdict_lines(report: str) -> list[str]:
    """The lines of a report that state verdicts: the decided count, the findings, the claims table's rows."""
    return [line for line in report.splitlines() if _VERDICT.match(line)]


def verdict_code_fingerprint(root: Path = ROOT) -> str:
    """sha256 over the verdict code's source files (`VERDICT_CODE`), by path and content."""
    h = hashlib.sha256()
    for part in VERDICT_CODE:
        p = root / part
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=str(ROOT / "runs" / "gallery"), help="where the demos run (resumed when there)")
    args = ap.parse_args(argv)
    work = Path(args.work)
    commands, reports = {}, {}
    for name, (demo_args, files) in GALLERY.items():
        out = work / name
        cmd = [sys.executable, "-m", "mechopd.cli", "demo", *demo_args, "--out", str(out)]
        commands[name] = "mechopd demo " + " ".join([*demo_args, "--out", f"runs/gallery/{name}"])
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
        for target, source in files.items():
            if target.endswith(".md") and not (out / source).is_file():
                raise SystemExit(f"{out / source} was not written by `{commands[name]}`; the gallery is left as it was")
        for target, source in files.items():
            if not (out / source).is_file():  # a figure this demo did not draw (e.g. regime_map without a Harm)
                print(f"note: {out / source} not drawn; figures/{target} is left as it was (stale)", flush=True)
                continue
            shutil.copyfile(out / source, FIGURES / target)
            if target.endswith(".md"):
                reports[target] = verdict_lines((FIGURES / target).read_text())
    record = {
        "date": datetime.date.today().isoformat(),
        "commit": _commit(),
        "commands": commands,
        "verdict_code_fingerprint": verdict_code_fingerprint(),
        "verdict_lines": reports,
    }
    RECORD.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(reports)} reports and their figures to {FIGURES}; record {RECORD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
