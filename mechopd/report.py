"""`report.md`: what a person reads first — the methods × metrics table, each regime verdict with its reason, the
figures inline with captions, and the exact commands that reproduce every number. Reads saved artifacts only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mechopd.removability import compare_table


def _load(p: Path) -> Any:
    return json.loads(p.read_text()) if p.exists() else None


def _probe_lines(run: Path) -> list[str]:
    """Every registered probe's report lines, read from its typed summary under ``run/probes``."""
    from mechopd.probes.registry import report_lines

    return report_lines(run / "probes")


def write_report_md(run: str | Path) -> Path:
    run = Path(run)
    manifest = _load(run / "demo.json") or {}
    labels = manifest.get("labels", {})
    evals = {p.stem: _load(p) for p in sorted((run / "eval").glob("*.json"))}
    order = ["base"] + [m for m in manifest.get("methods", []) if m in evals]
    order += [k for k in evals if k not in order]
    summaries = {labels.get(k, k): evals[k]["summary"] for k in order if k in evals}
    md_table, _ = compare_table(summaries) if summaries else ("(no evaluation found)", "")
    task = manifest.get("task", "?")
    cfg = manifest.get("config", {})
    out = [f"# mechopd report — {task}", ""]
    out += [f"Organism: `{manifest.get('organism')}`. Every method trained from it with the same seed "
            f"({cfg.get('seed')}), data and steps ({cfg.get('steps')} steps × {cfg.get('batch_size')} prompts, "
            f"lr {cfg.get('lr')}); evaluated greedily on {cfg.get('eval_n')} held-out items in both views "
            "(without the context, and with it re-inserted).", ""]
    if manifest.get("wall_s"):
        out += [f"Wall time of the last `mechopd demo` invocation: {manifest['wall_s']:.0f} s.", ""]
    out += ["## Context removability", "", md_table, ""]
    out += ["## Regimes", ""]
    for k in order:
        if k in evals:
            s = evals[k]["summary"]
            out.append(f"- **{labels.get(k, k)}** — regime {s['regime']}: {s['regime_reason']}")
    out += ["", "## Mechanistic probes", ""] + (_probe_lines(run) or ["(no probe output found)"]) + [""]
    out += ["## Figures", ""]
    from mechopd.plots import figure_index

    for name, title, caption in figure_index():
        png = run / "figures" / f"{name}.png"
        if png.exists():
            out += [f"### {title}", "", f"![{title}](figures/{name}.png)", "", caption, ""]
    out += ["## Reproduce", "", "```bash"]
    fast = " --fast" if cfg.get("fast") else ""
    out.append(f"mechopd demo --task {task} --out {run}{fast}{' --sweep' if cfg.get('sweep') else ''}")
    out.append(f"mechopd figures {run}                 # redraw every figure from the saved artifacts")
    names = " ".join(f"{k}={evals[k]['settings'].get('model')}" for k in order if k in evals)
    out.append(f"mechopd eval --task {task} --n {cfg.get('eval_n')} --seed {cfg.get('seed')} --compare {names}")
    out += ["```", ""]
    path = run / "report.md"
    path.write_text("\n".join(out))
    return path
