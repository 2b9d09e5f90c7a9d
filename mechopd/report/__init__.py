"""`report.md`: what a person reads first — the methods × metrics table, each regime verdict with its reason, the
figures inline with captions, and the exact commands that reproduce every number. Reads saved artifacts only."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mechopd.config import TrainConfig
from mechopd.config.terms import NCAOptions, SelectionOptions
from mechopd.core.artifacts import read_json
from mechopd.core.checks import LABEL
from mechopd.core.stats import fmt_stat, scaled_stat
from mechopd.evaluation.config import EVAL_FACTS
from mechopd.evaluation.removability import LABELS, METRICS, compare_table
from mechopd.objectives.labels import RunSettings
from mechopd.plots import figure_index
from mechopd.probes.registry import report_lines
from mechopd.report.claims import claims_markdown, evaluate_claims, findings, fragile_claims, target_line
from mechopd.report.following_claims import following_table
from mechopd.report.items import items_lines, link_item_claims
from mechopd.report.markup import md_code, sh_arg
from mechopd.report.mechanism_claims import localization_table, weightpatch_table
from mechopd.report.seeds import probe_lines
from mechopd.runset import STUDY_FILE, EvalReport, RunSet, runsets


def student_word(student: Any) -> str:
    """What the report calls the base model: ``Organism`` for a model organism (its directory holds
    ``organism.json``), ``Model`` for any other (a fetched model, a checkpoint, a hub id)."""
    return "Organism" if student and (Path(str(student)) / "organism.json").is_file() else "Model"


def _figure_lines(root: Path) -> list[str]:
    out = ["## Figures", ""]
    for name, title, caption in figure_index():
        png = root / "figures" / f"{name}.png"
        if png.exists():
            out += [f"### {title}", "", f"![{title}](figures/{name}.png)", "", caption, ""]
    return out


SMOKE_NOTE = (
    "SMOKE RUN (mechopd demo --fast): the organism is too small and trains too briefly to learn the rule, so every "
    "model is collapsed and every claim 'not measurable here'; this run checks that the pipeline works, not the "
    "papers' effects. `mechopd demo` (without --fast) shows the effects."
)


def _smoke(cfg: dict[str, Any]) -> list[str]:
    """The report's first line for a `--fast` run (`SMOKE_NOTE`), else nothing."""
    return [f"> **{SMOKE_NOTE}**", ""] if cfg.get("fast") else []


def _demo_flags(cfg: dict[str, Any]) -> str:
    """The `mechopd demo` flags that reproduce a run's organism, budget and float order (beyond --task, --out,
    --seed / --seeds): steps and batch size always (a default may change), job threads when not 1."""
    return (
        (" --fast" if cfg.get("fast") else "")
        + (" --sweep" if cfg.get("sweep") else "")
        + (f" --layers {cfg['layers']}" if cfg.get("layers") else "")
        + "".join(f" --{k.replace('_', '-')} {cfg[k]}" for k in ("steps", "batch_size") if cfg.get(k))
        + (f" --job-threads {cfg['job_threads']}" if cfg.get("job_threads", 1) != 1 else "")
    )


def _study_line(manifest: dict[str, Any], root: Path) -> str | None:
    """`mechopd run STUDY --out DIR` for a run written by `mechopd run` (`mechopd.pipeline.run`), else None."""
    study = manifest.get("study")
    if not study or study == "study":
        return None
    return f"mechopd run {sh_arg(study)} --out {sh_arg(manifest.get('out_dir', root))}"


def _eval_line(task: str, cfg: dict[str, Any], models: dict[str, Any]) -> str:
    """The `mechopd eval --compare` that reproduces the evaluation as it ran: its items, seed, task options, the
    study's other EvalConfig fields (``n_boot``, ...) and ``--other-contexts`` only where they were evaluated."""
    flags = {f.name: f.flag for f in EVAL_FACTS}
    opts = "".join(f" --option {sh_arg(f'{k}={v}')}" for k, v in (cfg.get("task_options") or {}).items())
    more = "".join(f" {flags[k]} {sh_arg(v)}" for k, v in (cfg.get("eval") or {}).items() if k in flags)
    other = " --other-contexts" if cfg.get("other_contexts", True) else ""
    names = " ".join(sh_arg(f"{k}={path}") for k, path in models.items())
    return (
        f"mechopd eval --task {task}{opts} --n {cfg.get('eval_n')} --seed {cfg.get('seed')}{more}{other} "
        f"--compare {names}"
    )


def _lr_text(cfg: dict[str, Any]) -> str:
    schedule = cfg.get("lr_schedule") or "constant"
    return f"lr {cfg.get('lr')}" + ("" if schedule == "constant" else f", {schedule} decay to 0")


def _opening(s: RunSet, cfg: dict[str, Any]) -> str:
    """The report's first sentence: the organism, how its methods were trained (a study's checkpoint runs: given, not
    trained here), how they were evaluated."""
    given = [r.label for r in s if (r.settings or {}).get("checkpoint")]
    trained = not given or len(given) < len(s.methods)  # no checkpoint run: the sentence as it always read
    how = (
        f"{'Every other' if given else 'Every'} method trained from it with the same seed ({cfg.get('seed')}), data "
        f"and steps ({cfg.get('steps')} steps × {cfg.get('batch_size')} prompts, {_lr_text(cfg)})"
        if trained
        else ""
    )
    ready = f"{', '.join(given)}: given checkpoint{'s' if len(given) > 1 else ''}, not trained here" if given else ""
    base = s.manifest.get("organism")
    return (
        f"{student_word(base)}: {md_code(base)}. {'; '.join(x for x in (ready, how) if x)}; evaluated "
        f"greedily on {cfg.get('eval_n')} held-out items in both views (without the context, and with it re-inserted)."
    )


def _first_grad_line(study: RunSet, role: str) -> dict[str, Any] | None:
    for rec in study.metrics(role):
        if rec.get("grad/norm/opd") is not None and rec.get("grad/norm/nca") is not None:
            return rec
    return None


def _first_eval_after_start(study: RunSet, role: str) -> dict[str, Any] | None:
    evals = [r for r in study.metrics(role) if r.get("eval/acc_xc") is not None and r.get("step", 0) > 0]
    return evals[0] if evals else None


def _log_path(study: RunSet, role: str) -> str:
    run = study.run(role)
    assert run is not None  # the caller read this role's grad/norm rows from its metrics log
    path = run.train_dir / "metrics.jsonl"
    return str(path.relative_to(study.root)) if path.is_relative_to(study.root) else str(path)


def _nca_lines(runs: Sequence[RunSet]) -> list[str]:
    """Why constant-β NCA and NCA with a late anchor differ, from the measured gradient norms of the logs (seed mean
    and interval with several runs)."""
    grads = [g for g in (_first_grad_line(r, "nca_const") for r in runs) if g is not None]
    if not grads:  # no constant-β run (the rules study has none): the anchor's schedule alone
        wait = _anchor_wait_text(runs)
        return [f"- **The anchor's schedule**{wait.replace('; in ', ': in ', 1)}."] if wait else []
    n_opd = scaled_stat([float(g["grad/norm/opd"]) for g in grads], "log")  # positive: geometric mean, log interval
    n_nca = scaled_stat([float(g["grad/norm/nca"]) for g in grads], "log")
    ratio = scaled_stat(
        [float(g["grad/norm/nca"]) / float(g["grad/norm/opd"]) for g in grads if float(g["grad/norm/opd"]) > 0], "log"
    )
    steps = sorted({int(g["step"]) for g in grads})
    text = (
        f"- **Why the two NCA runs differ.** In {runs[0].label('nca_const')} the anchor is on from step "
        f"0, when the two views start maximally apart: at step {'/'.join(map(str, steps))} its gradient norm is "
        f"{fmt_stat(n_nca, 3)} against the OPD term's {fmt_stat(n_opd, 4)} (ratio {fmt_stat(ratio, 1)}; "
        f"`grad/norm/*` in `{_log_path(runs[0], 'nca_const')}`)"
    )
    if ratio["mean"] is not None:  # the words follow the measured ratio; the numbers are above
        text += (
            ", so the anchor's update dominates"
            if ratio["mean"] >= 10
            else ", the same order as OPD's: on this run the anchor does not dominate by size"
        )
    evals = [e for e in (_first_eval_after_start(r, "nca_const") for r in runs) if e is not None]
    if evals:
        per = lambda key: " / ".join(f"{e[key]:.3f}" for e in evals)  # noqa: E731  (per seed: no interval to leave [0, 1])
        text += (
            f"; at the first evaluation (step {evals[0]['step']}) Acc_xc is {per('eval/acc_xc')} and Acc_x "
            f"{per('eval/acc_x')} (per seed)"
        )
    return [text + _anchor_wait_text(runs) + "."]


def _gate_opened(study: RunSet) -> int | None:
    """The step count after which the NCA run's anchor gate opened (β = 0 before), None if it never did."""
    for rec in study.metrics("nca"):
        if rec.get("nca_gate/open_step") is not None:
            return int(rec["nca_gate/open_step"])
    return None


def _openings(runs: Sequence[RunSet]) -> str:
    """``"12, never (trained as OPD) in seeds 0, 1"``: the step after which each seed's anchor gate opened."""
    steps = ", ".join("never (trained as OPD)" if o is None else str(o) for o in (_gate_opened(r) for r in runs))
    return steps + (" in seeds " + ", ".join(str(k) for k in range(len(runs))) if len(runs) > 1 else "")


def _anchor_wait_text(runs: Sequence[RunSet]) -> str:
    """How long the NCA run kept β = 0: the gate's level and the measured opening per seed, or a fixed start."""
    nca = runs[0].run("nca")
    if nca is None:
        return ""
    anchor, label = RunSettings(nca.settings or {}).section(NCAOptions), nca.label  # the anchor's typed options
    if anchor.nca_gate_acc is not None:
        return (
            f"; in {label} β = 0 until the no-context view's greedy accuracy on {anchor.nca_gate_n} training items "
            f"(checked every {anchor.nca_gate_window} steps) reaches {anchor.nca_gate_acc:g} × the teacher's with "
            f"the context (the accuracy gate; it opened after step {_openings(runs)}), so the anchor "
            "pulls the context view toward a no-context view that has learned the answers"
        )
    if anchor.nca_gate is not None:
        return (
            f"; in {label} β = 0 until the mean KL(q_x ‖ f) of the last {anchor.nca_gate_window} steps "
            f"is at most {anchor.nca_gate:g} nats per token (the anchor gate; it opened after step "
            f"{_openings(runs)}), so "
            "OPD brings the no-context view onto the teacher before the anchor pulls the context view toward it"
        )
    if anchor.nca_start:
        return (
            f"; in {label} β = 0 for the first {anchor.nca_start} steps, so OPD moves the no-context view "
            "before the anchor pulls the context view toward it"
        )
    return ""


def _kept_lines(study: RunSet) -> list[str]:
    out = []
    for run in study:
        sel = RunSettings(run.settings).section(SelectionOptions) if run.settings else None  # typed, as declared
        if sel is not None and sel.selector != "full":
            out.append(
                f"- **{run.label}**: budget ρ = {sel.budget}, the share of response "
                "positions it actually trained on is the kept fraction (mean of `kept_fraction` over its "
                f"steps); extra token per response: {'yes' if sel.min_one_per_response else 'no'} "
                "(the paper's rule: none)."
            )
    return out


def _findings_lines(rows: Sequence[Any], runs: Sequence[RunSet]) -> list[str]:
    """The report's opening: each claim's verdict in one sentence with its number, and the decided count."""
    decided = sum(c.verdict in ("holds", "does not hold") for c in rows)
    seeds = f"{len(runs)} training seed{'s' if len(runs) != 1 else ''}"
    return [
        "## Findings",
        "",
        f"{decided} of {len(rows)} claims decided over {seeds} (the interval rule; the claims "
        "table below gives each criterion and its numbers). Per-seed numbers change with the CPU's float order; "
        "a decided verdict is one whose whole interval clears its bar.",
        "",
        *findings(rows),
        "",
    ]


def _claims_lines(rows: Sequence[Any], runs: Sequence[RunSet]) -> list[str]:
    """The claims table, what its intervals speak for, and one line naming the rows the interval rule left fragile."""
    out = ["## The papers' claims", "", claims_markdown(rows), target_line(runs), ""]
    fragile = fragile_claims(rows)
    if fragile:
        out += ["**Fragile verdicts** (the interval holds the bar): " + "; ".join(c.claim for c in fragile) + ".", ""]
    return out


def _eval_reports(study: RunSet) -> dict[str, EvalReport]:
    """name -> report: the study's runs in order, then any other ``eval/*.json`` of the root."""
    out = {r.name: rep for r in study if (rep := study.eval(r.role)) is not None}
    for p in sorted((study.root / "eval").glob("*.json")):
        if p.stem not in out and p.stem not in study.names:  # a file's name, not a checked label: shown as text
            out[p.stem if LABEL.match(p.stem) else md_code(p.stem)] = EvalReport.load(p)
    return out


def write_report_md(run: str | os.PathLike | RunSet, study: str | os.PathLike | None = None) -> Path:
    """``report.md`` of a run (a run dir, a study YAML or a `RunSet`; ``study``: a YAML applied to the run dir)."""
    s = run if isinstance(run, RunSet) else RunSet.load(run, study)
    root = s.root
    evals = _eval_reports(s)
    summaries = {s.label(k): rep.summary.to_dict() for k, rep in evals.items()}
    md_table, _ = compare_table(summaries) if summaries else ("(no evaluation found)", "")
    cfg = s.config
    out = [*_smoke(cfg), f"# mechopd report — {s.task}", ""]
    out += [_opening(s, cfg), ""]
    if s.manifest.get("wall_s"):
        out += [f"Wall time of the last `mechopd demo` invocation: {s.manifest['wall_s']:.0f} s.", ""]
    rows = evaluate_claims([s])  # once: the findings and the claims table read the same rows
    out += _findings_lines(rows, [s])
    out += ["## Context removability", "", md_table, ""]
    out += ["## Regimes", ""]
    for k, rep in evals.items():
        out.append(f"- **{s.label(k)}** — regime {rep.summary.regime}: {rep.summary.regime_reason}")
    out += _kept_lines(s) + _nca_lines([s]) + [""]
    out += items_lines(root, s.label)  # writes explore.html beside report.md; Harm / Help items linked
    out += following_table([s])  # context following (`--other-contexts`), when evaluated
    out += ["", "## Mechanistic probes", ""] + (report_lines(s.probes_dir) or ["(no probe output found)"])
    out += [""] + weightpatch_table([s]) + localization_table([s])  # intervention sections (item bootstrap)
    chosen = root / "teachability_checkpoint.json"  # which TA-OPD checkpoint teachability rescored, and why
    if chosen.is_file():
        chosen = read_json(chosen)
        out += [f"- **Teachability checkpoint**: {md_code(chosen['checkpoint'])} — {chosen['why']}."]
    link_item_claims(rows, [s], root)  # the item claims link to explore.html (written by items_lines)
    out += [""] + _claims_lines(rows, [s])
    out += _figure_lines(root)
    out += ["## Reproduce", "", "```bash"]
    seed = f" --seed {cfg.get('seed', TrainConfig.seed)}"  # a chosen seed: a one-seed demo (not the task's default seed count)
    study_flag = f" --study {sh_arg(study)}" if study is not None else ""
    demo = f"mechopd demo --task {s.task} --out {sh_arg(root)}{seed}{_demo_flags(cfg)}"
    out.append(_study_line(s.manifest, root) or demo)
    out.append(
        f"mechopd figures {sh_arg(root)}{study_flag}                 # redraw every figure from the saved artifacts"
    )
    out.append(_eval_line(s.task, cfg, {k: rep.settings.get("model") for k, rep in evals.items()}))
    out += ["```", ""]
    path = root / "report.md"
    path.write_text("\n".join(out))
    return path


def _seed_table(summary: dict[str, Any], study: RunSet) -> list[str]:
    head = ["model", "seeds", *(LABELS[m] for m in METRICS), "regime per seed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + [":---:"]) + "|"]
    for name, row in summary["models"].items():
        cells = [study.label(name), str(len(row["regimes"]))]
        cells += [fmt_stat(row[m], signed=m == "delta_len") for m in METRICS]
        lines.append("| " + " | ".join(cells + [" ".join(r or "?" for r in row["regimes"])]) + " |")
    return lines + ["", f"Cells: mean over seeds [{summary['interval']}]; n/a where undefined in every seed."]


def write_aggregate_report(out: str | Path) -> Path:
    """``report.md`` of an aggregate directory (written by `mechopd.report.aggregate.aggregate`): seed tables, the claims
    table over the seed runs, the seed-band figures, and the commands."""
    out = Path(out)
    agg = RunSet.load(out)
    summary = read_json(out / "aggregate.json")
    runs = runsets(agg.seed_runs, out / STUDY_FILE if (out / STUDY_FILE).is_file() else None)
    cfg = agg.config
    base = agg.manifest.get("organism")
    word = student_word(base)
    lines = [
        *_smoke(cfg),
        f"# mechopd report — {agg.task}, {len(runs)} training seeds",
        "",
        f"{word}: {md_code(base)} (one {word.lower()}; the training seed varies: "
        f"{', '.join(md_code(r.root.name) for r in runs)}). Each seed: {cfg.get('steps')} steps × {cfg.get('batch_size')} "
        f"prompts, {_lr_text(cfg)}, {cfg.get('eval_n')} held-out items, greedy. Each seed's own report "
        "(item-bootstrap intervals, probes) is in its directory.",
        "",
        *_wall_lines(agg),
        *_findings_lines(rows := evaluate_claims(runs), runs),
        "## Context removability over seeds",
        "",
        *_seed_table(summary, agg),
        "",
    ]
    if runs:  # the kept-fraction lines and labels of the aggregate (kept fraction: the seed mean)
        runs[0].runs = {role: _relabelled(r, agg) for role, r in runs[0].runs.items()}
    lines += (_kept_lines(runs[0]) + _nca_lines(runs)) if runs else []
    lines += ["", *following_table(runs), "", *probe_lines(runs)]
    link_item_claims(rows, runs, out)  # each seed's explore.html, filtered to the claim's items
    lines += [
        *_claims_lines(rows, runs),
        *_figure_lines(out),
        "## Reproduce",
        "",
        "```bash",
        _study_line(agg.manifest, out)
        or f"mechopd demo --task {agg.task} --seeds {len(runs)} --out {sh_arg(out)}{_demo_flags(cfg)}",
        f"mechopd aggregate {' '.join(sh_arg(r.root) for r in runs)} --out {sh_arg(out)}",
        "```",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _wall_lines(agg: RunSet) -> list[str]:
    """The demo's wall time (organism included) and its workers, when the aggregate was written by `mechopd demo`."""
    m = agg.manifest
    if not m.get("wall_s"):
        return []
    return [
        f"Wall time of the last `mechopd demo` invocation: {m['wall_s']:.0f} s (organism stage "
        f"{m.get('organism_s', 0):.0f} s; {m.get('workers', 1)} worker process(es), "
        f"{agg.config.get('job_threads', 1)} intra-op thread(s) per job).",
        "",
    ]


def _relabelled(run: Any, agg: RunSet) -> Any:
    return replace(run, label=agg.labels.get(run.name, run.label))
