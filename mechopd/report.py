"""`report.md`: what a person reads first — the methods × metrics table, each regime verdict with its reason, the
figures inline with captions, and the exact commands that reproduce every number. Reads saved artifacts only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mechopd.aggregate import fmt_stat, metric_lines
from mechopd.removability import compare_table


def _load(p: Path) -> Any:
    return json.loads(p.read_text()) if p.exists() else None


def _probe_lines(run: Path) -> list[str]:
    """Every registered probe's report lines, read from its typed summary under ``run/probes``."""
    from mechopd.probes.registry import report_lines

    return report_lines(run / "probes")


def _figure_lines(run: Path) -> list[str]:
    from mechopd.plots import figure_index

    out = ["## Figures", ""]
    for name, title, caption in figure_index():
        png = run / "figures" / f"{name}.png"
        if png.exists():
            out += [f"### {title}", "", f"![{title}](figures/{name}.png)", "", caption, ""]
    return out


def _demo_flags(cfg: dict[str, Any]) -> str:
    """The `mechopd demo` flags that reproduce a run's organism and stages (beyond --task, --out, --seed)."""
    return ((" --fast" if cfg.get("fast") else "") + (" --sweep" if cfg.get("sweep") else "")
            + (f" --layers {cfg['layers']}" if cfg.get("layers") else ""))


def _lr_text(cfg: dict[str, Any]) -> str:
    schedule = cfg.get("lr_schedule") or "constant"
    return f"lr {cfg.get('lr')}" + ("" if schedule == "constant" else f", {schedule} decay to 0")


def _first_grad_line(run: Path, method: str) -> dict[str, Any] | None:
    for rec in metric_lines(run / "train" / method / "metrics.jsonl"):
        if rec.get("grad/norm/opd") is not None and rec.get("grad/norm/nca") is not None:
            return rec
    return None


def _first_eval_after_start(run: Path, method: str) -> dict[str, Any] | None:
    evals = [r for r in metric_lines(run / "train" / method / "metrics.jsonl")
             if r.get("eval/acc_xc") is not None and r.get("step", 0) > 0]
    return evals[0] if evals else None


def _nca_lines(runs: list[Path], labels: dict[str, str]) -> list[str]:
    """Why constant-β NCA and NCA with a late anchor differ, from the measured gradient norms of the logs (seed mean
    and interval with several runs)."""
    from mechopd.aggregate import seed_stat

    grads = [g for g in (_first_grad_line(r, "nca_const") for r in runs) if g is not None]
    if not grads:
        return []
    n_opd = seed_stat([float(g["grad/norm/opd"]) for g in grads])
    n_nca = seed_stat([float(g["grad/norm/nca"]) for g in grads])
    ratio = seed_stat([float(g["grad/norm/nca"]) / float(g["grad/norm/opd"]) for g in grads
                       if float(g["grad/norm/opd"]) > 0])
    steps = sorted({int(g["step"]) for g in grads})
    text = (f"- **Why the two NCA runs differ.** In {labels.get('nca_const', 'nca_const')} the anchor is on from step "
            f"0, when the two views start maximally apart: at step {'/'.join(map(str, steps))} its gradient norm is "
            f"{fmt_stat(n_nca, 3)} against the OPD term's {fmt_stat(n_opd, 4)} (ratio {fmt_stat(ratio, 1)}; "
            "`grad/norm/*` in `train/nca_const/metrics.jsonl`)")
    if ratio["mean"] is not None:  # the words follow the measured ratio; the numbers are above
        text += (", so the anchor's update dominates" if ratio["mean"] >= 10 else
                 ", the same order as OPD's: on this run the anchor does not dominate by size")
    evals = [e for e in (_first_eval_after_start(r, "nca_const") for r in runs) if e is not None]
    if evals:
        xc = seed_stat([e["eval/acc_xc"] for e in evals])
        x = seed_stat([e["eval/acc_x"] for e in evals])
        text += (f"; at the first evaluation (step {evals[0]['step']}) Acc_xc is {fmt_stat(xc)} and Acc_x "
                 f"{fmt_stat(x)}")
    return [text + _anchor_wait_text(runs, labels.get("nca", "nca")) + "."]


def _gate_opened(run: Path) -> int | None:
    """The step count after which the `nca` run's anchor gate opened (β = 0 before), None if it never did."""
    for rec in metric_lines(run / "train" / "nca" / "metrics.jsonl"):
        if rec.get("nca_gate/open_step") is not None:
            return int(rec["nca_gate/open_step"])
    return None


def _anchor_wait_text(runs: list[Path], label: str) -> str:
    """How long the `nca` run kept β = 0: the gate's level and the measured opening per seed, or a fixed start."""
    over = (_load(runs[0] / "demo.json") or {}).get("runs", {}).get("nca", {})
    if over.get("nca_gate") is not None:
        opened = [_gate_opened(r) for r in runs]
        steps = ", ".join("never (trained as OPD)" if o is None else str(o) for o in opened)
        return (f"; in {label} β = 0 until the mean KL(q_x ‖ f) of the last {over.get('nca_gate_window', 5)} steps "
                f"is at most {over['nca_gate']:g} nats per token (the anchor gate; it opened after step "
                f"{steps}{' in seeds ' + ', '.join(str(k) for k in range(len(runs))) if len(runs) > 1 else ''}), so "
                "OPD brings the no-context view onto the teacher before the anchor pulls the context view toward it")
    if over.get("nca_start"):
        return (f"; in {label} β = 0 for the first {over['nca_start']} steps, so OPD moves the no-context view "
                "before the anchor pulls the context view toward it")
    return ""


def _kept_lines(run: Path, labels: dict[str, str]) -> list[str]:
    runs = (_load(run / "demo.json") or {}).get("runs", {})
    out = []
    for name, over in runs.items():
        if over.get("selector", "full") != "full":
            out.append(f"- **{labels.get(name, name)}**: budget ρ = {over.get('budget')}, the share of response "
                       "positions it actually trained on is the kept fraction (mean of `kept_fraction` over its "
                       f"steps); extra token per response: {'yes' if over.get('min_one_per_response') else 'no'} "
                       "(the paper's rule: none).")
    return out


def _claims_lines(runs: list[Path]) -> list[str]:
    from mechopd.claims import claims_markdown, evaluate_claims

    return ["## The papers' claims", "", claims_markdown(evaluate_claims(runs))]


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
            f"{_lr_text(cfg)}); evaluated greedily on {cfg.get('eval_n')} held-out items in both views "
            "(without the context, and with it re-inserted).", ""]
    if manifest.get("wall_s"):
        out += [f"Wall time of the last `mechopd demo` invocation: {manifest['wall_s']:.0f} s.", ""]
    out += ["## Context removability", "", md_table, ""]
    out += ["## Regimes", ""]
    for k in order:
        if k in evals:
            s = evals[k]["summary"]
            out.append(f"- **{labels.get(k, k)}** — regime {s['regime']}: {s['regime_reason']}")
    out += _kept_lines(run, labels) + _nca_lines([run], labels)
    out += ["", "## Mechanistic probes", ""] + (_probe_lines(run) or ["(no probe output found)"]) + [""]
    out += _claims_lines([run])
    out += _figure_lines(run)
    out += ["## Reproduce", "", "```bash"]
    seed = f" --seed {cfg['seed']}" if cfg.get("seed") else ""
    out.append(f"mechopd demo --task {task} --out {run}{seed}{_demo_flags(cfg)}")
    out.append(f"mechopd figures {run}                 # redraw every figure from the saved artifacts")
    names = " ".join(f"{k}={evals[k]['settings'].get('model')}" for k in order if k in evals)
    out.append(f"mechopd eval --task {task} --n {cfg.get('eval_n')} --seed {cfg.get('seed')} --compare {names}")
    out += ["```", ""]
    path = run / "report.md"
    path.write_text("\n".join(out))
    return path


def _seed_table(summary: dict[str, Any], labels: dict[str, str]) -> list[str]:
    from mechopd.removability import LABELS, METRICS

    head = ["model", "seeds", *(LABELS[m] for m in METRICS), "regime per seed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + [":---:"]) + "|"]
    for name, row in summary["models"].items():
        cells = [labels.get(name, name), str(len(row["regimes"]))]
        cells += [fmt_stat(row[m], signed=m == "delta_len") for m in METRICS]
        lines.append("| " + " | ".join(cells + [" ".join(r or "?" for r in row["regimes"])]) + " |")
    return lines + ["", f"Cells: mean over seeds [{summary['interval']}]; n/a where undefined in every seed."]


def write_aggregate_report(out: str | Path) -> Path:
    """``report.md`` of an aggregate directory (written by `mechopd.aggregate.aggregate`): seed tables, the claims
    table over the seed runs, the seed-band figures, and the commands."""
    out = Path(out)
    manifest = _load(out / "demo.json") or {}
    summary = _load(out / "aggregate.json")
    labels = manifest.get("labels", {})
    runs = [Path(r) for r in manifest.get("seed_runs", [])]
    cfg = manifest.get("config", {})
    lines = [f"# mechopd report — {manifest.get('task')}, {len(runs)} training seeds", "",
             f"Organism: `{manifest.get('organism')}` (one organism; the training seed varies: "
             f"{', '.join(r.name for r in runs)}). Each seed: {cfg.get('steps')} steps × {cfg.get('batch_size')} "
             f"prompts, {_lr_text(cfg)}, {cfg.get('eval_n')} held-out items, greedy. Each seed's own report "
             "(item-bootstrap intervals, probes) is in its directory.", "",
             "## Context removability over seeds", "", *_seed_table(summary, labels), ""]
    lines += (_kept_lines(runs[0], labels) + _nca_lines(runs, labels)) if runs else []
    lines += ["", *_claims_lines(runs), *_figure_lines(out), "## Reproduce", "", "```bash",
              f"mechopd demo --task {manifest.get('task')} --seeds {len(runs)} --out {out}{_demo_flags(cfg)}",
              f"mechopd aggregate {' '.join(str(r) for r in runs)} --out {out}", "```", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
