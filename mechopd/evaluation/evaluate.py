"""Context-removability evaluation: run the trained student on held-out items in BOTH views, pair the outcomes.

Per item (game board): correct without context, correct with context, response lengths (tokens, stop token
excluded; games: mean tokens per move), the responses, whether each answer could be parsed, and the item's prompt,
context and target (`item_texts`), and the item's cluster where the task names one (`item_cluster`). The summary
(`removability.summarize`) carries acc_x, acc_xc, harm, help, both_correct, delta_len with paired bootstrap intervals
and the regime. Greedy by default; ``samples > 1`` (with a temperature) evaluates k sampled responses per item and
view, each sample j paired across views (records are (item, j); the bootstrap then resamples those records).

Both views of a single-turn task go through ONE batched generation call (2n prompts); games play all boards of both
views move by move in one batch.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import torch

from mechopd.core.artifacts import FileSet, atomic_write
from mechopd.core.checks import check_task_vocab as _check_vocab
from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.views import RenderSpec, render_prompt_ids
from mechopd.evaluation.config import EvalConfig
from mechopd.evaluation.pinning import check_fits, pin_render
from mechopd.evaluation.removability import compare_table, summarize
from mechopd.generate.sampler import play_games, sample_rows, stable_seed, strip_stop
from mechopd.generate.settings import SamplingSettings, task_default
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks.base import Example, check_split, get_task


def _check_length(model: Any, tokenizer: Any, task: Any, items: list[Example], cfg: EvalConfig, spec) -> None:
    """`views.check_fits` (the rule training applies too): the longer view plus max_new_tokens within the model's
    maximum (games: the first move's prompt, a lower bound of the later ones)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    check_fits(tokenizer, items, spec, task_default(cfg.rollout(), task, "max_new_tokens"), limit)


def _renderer(tokenizer: Any, spec: RenderSpec):
    cache: dict[tuple, list[int]] = {}

    def render(prompt: str, context: str | None) -> list[int]:
        key = (prompt, context)
        if key not in cache:
            cache[key] = render_prompt_ids(tokenizer, prompt, context, spec)
        return cache[key]

    return render


def sampling_settings(model: Any, tokenizer: Any, task: Any, cfg: EvalConfig, engine: Any = None) -> SamplingSettings:
    """The evaluation's `SamplingSettings`: greedy unless ``samples > 1`` or a temperature is given; `engine`: the
    `engines.RolloutEngine` object behind ``cfg.engine == "vllm"`` (e.g. the trainer's colocated vLLM)."""
    if cfg.engine == "vllm" and engine is None:
        raise ConfigError("engine=vllm: pass the vLLM engine to evaluate_model(..., engine=VllmEngine(model_dir))")
    greedy = cfg.samples == 1 and cfg.temperature is None
    return SamplingSettings.from_section(
        cfg.rollout(), task, tokenizer, model, engine=engine, greedy=greedy, batch_size=cfg.batch_size
    )


def _single_turn(model, tokenizer, task, items: list[Example], cfg: EvalConfig, spec, st: SamplingSettings):
    render = _renderer(tokenizer, spec)
    jobs = [(i, j, ctx) for j in range(cfg.samples) for i in range(len(items)) for ctx in (False, True)]
    ids = [render(items[i].prompt, items[i].context if c else None) for i, _, c in jobs]
    seeds = None if st.greedy else [hash_seed(cfg.seed, items[i].uid, j, c) for i, j, c in jobs]
    responses = sample_rows(model, ids, seeds, st, charge_decode=True)  # groups charged their decode steps
    out = {key: strip_stop(resp, st.stop) for key, resp in zip(jobs, responses)}
    records = []
    for j in range(cfg.samples):
        for i, ex in enumerate(items):
            rec: dict[str, Any] = {"uid": ex.uid, "sample": j, **item_cluster(ex)}
            for c, tag in ((False, "x"), (True, "xc")):
                resp = out[(i, j, c)]
                text = tokenizer.decode(resp, skip_special_tokens=True)
                rec[f"correct_{tag}"] = bool(task.score(ex, text))
                rec[f"len_{tag}"] = len(resp)
                rec[f"response_{tag}"] = text
                rec[f"unparseable_{tag}"] = _unparseable(task, text)
            records.append({**rec, **item_texts(ex)})
    return records


def item_texts(ex: Example) -> dict[str, Any]:
    """What a reader of one record needs besides the outcomes (the explorer shows them): the prompt (games: the first
    move's), the context and the target (the reference answer; None for games), last in the record's columns."""
    target = ex.answer if ex.answer is None or isinstance(ex.answer, (str, int, float, bool)) else str(ex.answer)
    return {"prompt": ex.prompt, "context": ex.context, "target": target}


def item_cluster(ex: Example) -> dict[str, Any]:
    """``{"cluster": id}`` for an item whose task names its cluster (``meta["cluster"]``: the fact a paraphrase asks
    about), else nothing: a task without clusters writes the records it always wrote."""
    return {"cluster": str(ex.meta["cluster"])} if "cluster" in ex.meta else {}


def _unparseable(task: Any, text: str) -> bool:
    return task.parse_answer(text) is None


def hash_seed(seed: int, uid: str, j: int, ctx: bool) -> int:
    return stable_seed(seed, uid, j, int(ctx))


def _games(model, tokenizer, task, items: list[Example], cfg: EvalConfig, spec, st: SamplingSettings):
    render = _renderer(tokenizer, spec)
    records = []
    for j in range(cfg.samples):
        res = {}
        for c, tag in ((False, "x"), (True, "xc")):
            seeds = [hash_seed(cfg.seed, ex.uid, j, c) % (2**31) for ex in items]
            eps, turns = play_games(
                model, tokenizer, task, items, render, st, with_context=c, seeds=None if st.greedy else seeds
            )
            lens: dict[int, list[int]] = {g: [] for g in range(len(items))}
            texts: dict[int, list[str]] = {g: [] for g in range(len(items))}
            for t in turns:
                r = strip_stop(t.response, st.stop)
                lens[t.game].append(len(r))
                texts[t.game].append(tokenizer.decode(r, skip_special_tokens=True))
            res[tag] = (eps, lens, texts)
        for g, ex in enumerate(items):
            rec: dict[str, Any] = {"uid": ex.uid, "sample": j, **item_cluster(ex)}
            for tag in ("x", "xc"):
                eps, lens, texts = res[tag]
                rec[f"correct_{tag}"] = bool(eps[g].won)
                rec[f"len_{tag}"] = sum(lens[g]) / max(1, len(lens[g]))
                rec[f"response_{tag}"] = " || ".join(texts[g])
                rec[f"unparseable_{tag}"] = int(eps[g].invalid_moves)
                rec[f"moves_{tag}"] = len(lens[g])
            records.append({**rec, **item_texts(ex)})
    return records


@torch.inference_mode()
def evaluate_model(
    model: Any,
    tokenizer: Any,
    task: Any,
    cfg: EvalConfig | None = None,
    spec: RenderSpec | None = None,
    train_uids: set[str] | None = None,
    engine: Any = None,
) -> dict[str, Any]:
    """Both-view evaluation of one model on `cfg.n` held-out items; returns {"summary", "records", "settings"}.

    train_uids: if given, the held-out items are checked to be disjoint from them (games: board hashes).
    engine: the rollout engine object for ``cfg.engine == "vllm"`` (`sampling_settings`).
    """
    cfg = cfg or EvalConfig()
    spec = spec or RenderSpec(placement=task.placement)
    _check_vocab(tokenizer, task)
    items = task.examples("test", cfg.n, cfg.seed)
    if not items:
        raise TaskError(f"task {task.name!r} produced no held-out items; check the task's data")
    spec, _ = pin_render(tokenizer, spec, items[0].prompt, items[0].context)  # the CLI pinned (and said so) already
    _check_length(model, tokenizer, task, items, cfg, spec)
    check_split(task, items, "test")  # held-out items: checked by the task's own split rule, not assumed
    if train_uids is not None:
        overlap = {ex.uid for ex in items} & set(train_uids)
        if overlap:
            raise TaskError(
                f"{len(overlap)} held-out items of task {task.name!r} also appear in training "
                f"(e.g. {sorted(overlap)[0]}); the split is broken"
            )
    st = sampling_settings(model, tokenizer, task, cfg, engine)
    greedy, T = st.greedy, st.temperature
    was_training = model.training
    model.eval()
    run = _games if task.is_game else _single_turn
    records = run(model, tokenizer, task, items, cfg, spec, st)
    if was_training:
        model.train()
    summary = summarize(records, n_boot=cfg.n_boot, seed=cfg.seed, thresholds=cfg.thresholds)
    key = "invalid_moves" if task.is_game else "unparseable"
    summary[f"{key}_x"] = int(sum(int(r["unparseable_x"]) for r in records))
    summary[f"{key}_xc"] = int(sum(int(r["unparseable_xc"]) for r in records))
    settings = {
        "task": task.name,
        "n": cfg.n,
        "seed": cfg.seed,
        "samples": cfg.samples,
        "greedy": greedy,
        "temperature": None if greedy else T,
        "placement": spec.placement,
        "no_context_system": spec.no_context_system,
        "chat_template_kwargs": dict(spec.chat_template_kwargs),
        "shared_prefix": cfg.shared_prefix,
    }
    return {"summary": summary, "records": records, "settings": settings}


def write_report(report: dict[str, Any], out: str | Path) -> tuple[Path, Path]:
    """JSON report (records + summary) at `out` (``.json``) and the records as CSV next to it."""
    out = Path(out)
    if out.suffix != ".json":
        out = out.with_suffix(".json")
    rows = report["records"]
    with FileSet(out.parent, out.stem) as stage:  # the JSON and the CSV land as one set (`FileSet.complete`)
        (stage.dir / out.name).write_text(json.dumps(report, indent=1))
        with open(stage.dir / f"{out.stem}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
    return out, out.with_suffix(".csv")


def format_summary(name: str, s: dict[str, Any]) -> str:
    """One screen: the six metrics with intervals, n, regime and its reason."""

    def cell(k: str) -> str:
        e = s[k]
        if e["value"] is None:
            return f"{k:>13}: n/a"
        ci = "" if e.get("low") is None else f"  [{e['low']:.3f}, {e['high']:.3f}]"
        return f"{k:>13}: {e['value']:.3f}{ci}"

    lines = [f"== {name}: n={s['n']}"] + [
        cell(k) for k in ("acc_x", "acc_xc", "harm", "help", "both_correct", "delta_len")
    ]
    lines.append(f"{'regime':>13}: {s['regime']} — {s['regime_reason']}")
    return "\n".join(lines)


def compare(reports: dict[str, dict[str, Any]], out_dir: str | Path) -> tuple[str, Path, Path]:
    """Side-by-side table of several models' summaries (same items): Markdown + CSV in `out_dir`."""
    md, csv_text = compare_table({k: r["summary"] for k, r in reports.items()})
    out = Path(out_dir)
    atomic_write(out / "compare.md", lambda fh: fh.write(md))
    atomic_write(out / "compare.csv", lambda fh: fh.write(csv_text))
    return md, out / "compare.md", out / "compare.csv"


def evaluate(
    model: Any,
    task: Any,
    *,
    n: int = EvalConfig.n,
    seed: int = EvalConfig.seed,
    samples: int = EvalConfig.samples,
    temperature: float | None = EvalConfig.temperature,
    spec: RenderSpec | None = None,
    tokenizer: Any = None,
    task_options: dict[str, Any] | None = None,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """A loaded model (with `tokenizer`) or a checkpoint dir, `task` a name (with `task_options`) or a task object,
    in both views with the render ``spec`` as given (no training record read: `mechopd.run_eval` and `mechopd eval`
    read it, `mechopd.evaluation.run`). Writes the report to `out` when given."""
    if isinstance(model, (str, Path)):
        tokenizer = tokenizer or load_tokenizer(model)
        model = load_model(model)
    if tokenizer is None:
        raise TaskError("evaluate: pass tokenizer= with a loaded model (or pass a checkpoint directory)")
    if isinstance(task, str):
        task = get_task(task, **(task_options or {}))
    rep = evaluate_model(
        model, tokenizer, task, EvalConfig(n=n, seed=seed, samples=samples, temperature=temperature), spec
    )
    if out is not None:
        write_report(rep, out)
    return rep
