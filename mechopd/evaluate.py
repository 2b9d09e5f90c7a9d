"""Context-removability evaluation: run the trained student on held-out items in BOTH views, pair the outcomes.

Per item (game board): correct without context, correct with context, response lengths (tokens, stop token
excluded; games: mean tokens per move), the responses, whether each answer could be parsed, and the item's prompt,
context and target (`item_texts`). The summary
(`removability.summarize`) carries acc_x, acc_xc, harm, help, both_correct, delta_len with paired bootstrap intervals
and the regime. Greedy by default; ``samples > 1`` (with a temperature) evaluates k sampled responses per item and
view, each sample j paired across views (records are (item, j); the bootstrap then resamples those records).

Both views of a single-turn task go through ONE batched generation call (2n prompts); games play all boards of both
views move by move in one batch.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mechopd.checks import check_task_vocab as _check_vocab
from mechopd.config import check_seed, check_temperature
from mechopd.errors import ConfigError, TaskError
from mechopd.removability import RegimeThresholds, compare_table, summarize
from mechopd.tasks.base import Example, check_split
from mechopd.generate.lean import DECODERS
from mechopd.generate.prefix import MODES as PREFIX_MODES
from mechopd.generate.sampler import SamplingSettings, play_games, sample_rows, stable_seed, strip_stop
from mechopd.pinning import check_fits, pin_render
from mechopd.views import RenderSpec, render_prompt_ids


@dataclass
class EvalConfig:
    """n held-out items (split "test"), seed, greedy unless samples > 1, batch_size prompts per generation call."""

    n: int = 200
    seed: int = 0
    samples: int = 1
    temperature: float | None = None
    batch_size: int = 256
    max_new_tokens: int | None = None
    n_boot: int = 1000
    engine: str = "lean"  # sampler.sample's engine: lean (Llama/Qwen2/Qwen3) | hf (model(...) per step) | vllm
    shared_prefix: str = "auto"  # auto: a prompt prefix common to a batch is prefilled once (exact) | off
    thresholds: RegimeThresholds = field(default_factory=RegimeThresholds)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise TaskError(f"the evaluation set is empty (n={self.n}); pass --n 1 or more")
        if self.samples < 1:
            raise TaskError(f"samples={self.samples} must be >= 1")
        if self.engine not in DECODERS:
            raise TaskError(f"engine={self.engine!r} is unknown; choose one of {', '.join(DECODERS)}")
        if self.engine == "vllm":
            from mechopd.generate.vllm_engine import require_vllm

            require_vllm("engine")
        check_seed(self.seed)  # before the evaluation, not after it (the bootstrap seeds numpy with it)
        check_temperature(self.temperature)  # omit it for greedy decoding
        for name, low in (("max_new_tokens", 1), ("batch_size", 1), ("n_boot", 0)):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= low):
                raise ConfigError(f"{name}={value!r} is invalid: must be an integer >= {low}"
                                  + (" (omit it for the task's)" if name == "max_new_tokens" else ""))
        if self.shared_prefix not in PREFIX_MODES:
            raise TaskError(f"shared_prefix={self.shared_prefix!r} is unknown; choose auto or off")


def _check_length(model: Any, tokenizer: Any, task: Any, items: list[Example], cfg: EvalConfig, spec) -> None:
    """`views.check_fits` (the rule training applies too): the longer view plus max_new_tokens within the model's
    maximum (games: the first move's prompt, a lower bound of the later ones)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    check_fits(tokenizer, items, spec, cfg.max_new_tokens or task.max_new_tokens, limit)


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
    return SamplingSettings.for_model(
        tokenizer, model, max_new_tokens=cfg.max_new_tokens or task.max_new_tokens,
        temperature=cfg.temperature or task.temperature, greedy=cfg.samples == 1 and cfg.temperature is None,
        engine=engine if engine is not None else cfg.engine, shared_prefix=cfg.shared_prefix,
        batch_size=cfg.batch_size)


def _single_turn(model, tokenizer, task, items: list[Example], cfg: EvalConfig, spec, st: SamplingSettings):
    render = _renderer(tokenizer, spec)
    jobs = [(i, j, ctx) for j in range(cfg.samples) for i in range(len(items)) for ctx in (False, True)]
    ids = [render(items[i].prompt, items[i].context if c else None) for i, _, c in jobs]
    seeds = None if st.greedy else [hash_seed(cfg.seed, items[i].uid, j, c) for i, j, c in jobs]
    responses = sample_rows(model, ids, seeds, st)
    out = {key: strip_stop(resp, st.stop) for key, resp in zip(jobs, responses)}
    records = []
    for j in range(cfg.samples):
        for i, ex in enumerate(items):
            rec: dict[str, Any] = {"uid": ex.uid, "sample": j}
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
            eps, turns = play_games(model, tokenizer, task, items, render, st, with_context=c,
                                    seeds=None if st.greedy else seeds)
            lens = {g: [] for g in range(len(items))}
            texts = {g: [] for g in range(len(items))}
            for t in turns:
                r = strip_stop(t.response, st.stop)
                lens[t.game].append(len(r))
                texts[t.game].append(tokenizer.decode(r, skip_special_tokens=True))
            res[tag] = (eps, lens, texts)
        for g, ex in enumerate(items):
            rec: dict[str, Any] = {"uid": ex.uid, "sample": j}
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
def evaluate_model(model: Any, tokenizer: Any, task: Any, cfg: EvalConfig | None = None,
                   spec: RenderSpec | None = None, train_uids: set[str] | None = None,
                   engine: Any = None) -> dict[str, Any]:
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
            raise TaskError(f"{len(overlap)} held-out items of task {task.name!r} also appear in training "
                            f"(e.g. {sorted(overlap)[0]}); the split is broken")
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
    settings = {"task": task.name, "n": cfg.n, "seed": cfg.seed, "samples": cfg.samples, "greedy": greedy,
                "temperature": None if greedy else T, "placement": spec.placement,
                "no_context_system": spec.no_context_system, "chat_template_kwargs": dict(spec.chat_template_kwargs),
                "shared_prefix": cfg.shared_prefix}
    return {"summary": summary, "records": records, "settings": settings}


def write_report(report: dict[str, Any], out: str | Path) -> tuple[Path, Path]:
    """JSON report (records + summary) at `out` (``.json``) and the records as CSV next to it."""
    from mechopd.artifacts import FileSet

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

    lines = [f"== {name}: n={s['n']}"] + [cell(k) for k in ("acc_x", "acc_xc", "harm", "help", "both_correct",
                                                            "delta_len")]
    lines.append(f"{'regime':>13}: {s['regime']} — {s['regime_reason']}")
    return "\n".join(lines)


def compare(reports: dict[str, dict[str, Any]], out_dir: str | Path) -> tuple[str, Path, Path]:
    """Side-by-side table of several models' summaries (same items): Markdown + CSV in `out_dir`."""
    md, csv_text = compare_table({k: r["summary"] for k, r in reports.items()})
    from mechopd.artifacts import atomic_write

    out = Path(out_dir)
    atomic_write(out / "compare.md", lambda fh: fh.write(md))
    atomic_write(out / "compare.csv", lambda fh: fh.write(csv_text))
    return md, out / "compare.md", out / "compare.csv"


def evaluate(model: Any, task: Any = None, *, n: int = 200, seed: int = 0, samples: int = 1,
             temperature: float | None = None, spec: RenderSpec | None = None, tokenizer: Any = None,
             task_options: dict[str, Any] | None = None, out: str | Path | None = None,
             max_new_tokens: int | None = None, engine: str = "lean", no_context_system: str | None = None,
             chat_template_kwargs: dict[str, Any] | None = None, other_contexts: bool = False) -> dict[str, Any]:
    """``mechopd.run_eval(model, task, n=..., seed=...)``: `model` a checkpoint dir, hub id or organism:<task> (or a
    loaded model with `tokenizer`), `task` a name (with `task_options`; None: the task the checkpoint's training
    record names) or a task object. A checkpoint goes through `mechopd eval`'s checks (`plan_eval`, `evaluate_plan`:
    its record's task and render, the render checked against the task); `spec` applies to a loaded model only.
    Writes the report to `out` when given."""
    cfg = EvalConfig(n=n, seed=seed, samples=samples, temperature=temperature, max_new_tokens=max_new_tokens,
                     engine=engine)  # every setting validated before any work
    if isinstance(model, (str, Path)) and tokenizer is None and spec is None and not hasattr(task, "examples"):
        plan = plan_eval({"model": str(model)}, task, task_options)
        rep = evaluate_plan(plan, cfg, no_context_system=no_context_system,
                            chat_template_kwargs=chat_template_kwargs, other_contexts=other_contexts)["model"]
    else:
        rep = _evaluate_loaded(model, task, cfg, spec, tokenizer, task_options)
    if out is not None:
        write_report(rep, out)
    return rep


def _evaluate_loaded(model: Any, task: Any, cfg: EvalConfig, spec: RenderSpec | None, tokenizer: Any,
                     task_options: dict[str, Any] | None) -> dict[str, Any]:
    from mechopd.models import load_model, load_tokenizer
    from mechopd.tasks.base import get_task

    if isinstance(model, (str, Path)):
        tokenizer = tokenizer or load_tokenizer(model)
        model = load_model(model)
    if tokenizer is None:
        raise TaskError("evaluate: pass tokenizer= with a loaded model (or pass a checkpoint directory)")
    if task is None:
        raise ConfigError("evaluate: pass task= (a name or a task object) with a loaded model")
    if isinstance(task, str):
        task = get_task(task, **(task_options or {}))
    return evaluate_model(model, tokenizer, task, cfg, spec)


@dataclass
class EvalPlan:
    """What `mechopd eval` and `run_eval` evaluate, read before any model loads: the task (named, else the one every
    model's training record names: `records.recorded_task`), its options, the models by label, their records."""

    task_name: str
    task_options: dict[str, Any]
    task: Any
    models: dict[str, str]
    records: dict[str, Any]


def plan_eval(models: dict[str, str], task: str | None = None, task_options: dict[str, Any] | None = None,
              run: str | Path | None = None) -> EvalPlan:
    """The checked plan of an evaluation of ``models`` (label -> checkpoint dir, hub id or organism:<task>); ``run``:
    a training run whose record (config.yaml) stands for its final/ checkpoint."""
    from mechopd.records import recorded_config, recorded_task
    from mechopd.tasks.base import get_task

    if run is not None and not Path(run, "final", "config.json").is_file():
        raise ConfigError(f"--run {run} holds no final checkpoint (final/); pass a finished training run")
    records = {name: recorded_config(run or path) for name, path in models.items()}
    name, options = recorded_task(records, task, dict(task_options or {}))
    return EvalPlan(name, options, get_task(name, **options), dict(models), records)


def evaluate_plan(plan: EvalPlan, cfg: EvalConfig, *, no_context_system: str | None = None,
                  chat_template_kwargs: dict[str, Any] | None = None,
                  other_contexts: bool = False) -> dict[str, dict[str, Any]]:
    """Every model of ``plan`` in both views (and under the task's other contexts: following, retention against a
    model named base): each checkpoint checked, each render pinned to its training record and checked against the
    task (`records.checked_renders`) before the first model loads. Returns the reports by label (not written)."""
    from mechopd import following
    from mechopd.models import check_model, load_model
    from mechopd.organisms.recipes import resolve_organism
    from mechopd.records import checked_renders

    paths = {name: check_model(resolve_organism(path, pretrain=True)) for name, path in plan.models.items()}
    toks, specs = checked_renders(plan.task, paths, plan.records, no_context_system, dict(chat_template_kwargs or {}),
                                  cfg.seed, cfg.max_new_tokens)
    reports = {}
    for name, path in paths.items():
        model, engine = load_model(path), None
        if cfg.engine == "vllm":
            from mechopd.generate.vllm_engine import VllmEngine

            engine = VllmEngine(path)
        reports[name] = evaluate_model(model, toks[name], plan.task, cfg, specs[name], engine=engine)
        reports[name]["settings"].update(model=str(Path(path).resolve()) if Path(path).exists() else str(path),
                                         task_options=plan.task_options)
        if other_contexts:
            following.add_following(reports[name], model, toks[name], plan.task, cfg, specs[name])
    if other_contexts:
        following.apply_retention(reports)
    return reports
