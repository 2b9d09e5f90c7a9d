"""`mechopd explore RUN_DIR`: one self-contained HTML page to read a run item by item.

Reads only saved artifacts (`mechopd.report.explore_load` checks each strictly): the evaluation reports ``RUN/eval/*.json``
(or a ``mechopd eval --compare`` directory) and the causal probes' files in ``RUN/probes`` (``lens_tokens.jsonl``,
``patching_tokens.jsonl``, ``attention_tokens.jsonl``, ``lens.csv``, ``patching.csv``, ``attention.csv``); either
kind alone is enough.

The page: the models' summaries (Acc_x, Acc_xc, Harm, Help ... as in the reports, each cell's exact value in
``data-value``); the run's lens and patching curves and each model's per-head context share; then one block per item
(anchor ``#item-<i>``): its prompt, context and target; each model's generation without and with the context side by
side, marked right or wrong, with a word diff of the two views and the item's outcome (Harm: right without the context,
wrong with it; Help: the reverse; both wrong; both right), and the answers under the task's other contexts where the
report has them; where the probes scored the item: its response tokens coloured by the output KL between the views
(hover: both views' top tokens, the token's KL by depth), the item's lens and patching curves with axes, and the
attention from its response tokens onto the context per head. Controls filter by outcome for any or one model, sort by
the item's output KL or uid, and search; the state sits in the URL (``#filter=harm&model=opd&sort=kl&colour=0``).

Safety: the data is inline JSON with ``<``, ``>`` and ``&`` escaped (`page_json`), and the script sets every string
with ``textContent`` (no ``innerHTML``), so a prompt, uid or token that holds markup is shown, never run. No network,
no CDN. Errors raised by the script are written into the page (``#errors``) for the headless browser test.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from mechopd.core.artifacts import atomic_write
from mechopd.core.errors import ConfigError, DataError, MechopdError
from mechopd.plots._common import palette, run_info
from mechopd.report import explore_load as load

PAGE = "explore.html"
SUMMARY_KEYS = ("acc_x", "acc_xc", "harm", "help", "both_correct", "delta_len", "follow_other")
ASSETS = Path(__file__).parent.with_name("data") / "explore"


def probes_dir(run_dir: str | Path) -> Path | None:
    """``RUN/probes`` of a run dir, or the dir itself when it holds the probe files (None: no lens tokens there)."""
    run = Path(run_dir)
    for d in (run / "probes", run):
        if (d / "lens_tokens.jsonl").is_file():
            return d
    return None


def _run_root(run: Path) -> Path:
    return run.parent if run.name == "probes" else run


def _probe_data(pdir: Path | None) -> tuple[list[str], list[str], dict[str, dict[str, Any]]]:
    """(models, lens sites, {uid: {"tokens", "m": {model: per-token values}}}) from the probes' token files."""
    if pdir is None:
        return [], [], {}
    lens = load.lens_records(pdir / "lens_tokens.jsonl")
    n = {(r["model"], r["uid"]): len(r["tokens"]) for r in lens}
    patch = load.side_records(pdir / "patching_tokens.jsonl", "kl_patched", n)
    attn = load.side_records(pdir / "attention_tokens.jsonl", "ctx_share", n)
    items: dict[str, dict[str, Any]] = {}
    for r in lens:
        it = items.setdefault(r["uid"], {"tokens": r["tokens"], "m": {}})
        if it["tokens"] != r["tokens"]:
            raise DataError(
                f"{pdir / 'lens_tokens.jsonl'}: item {r['uid']!r} has different tokens for model "
                f"{r['model']!r}; every model is scored on the same response (rerun mechopd probe lens)"
            )
        a = attn.get((r["model"], r["uid"]), {})
        it["m"][r["model"]] = {
            "kl": r["kl"],
            "top_x": r["top_x"],
            "top_c": r["top_c"],
            "patched": patch.get((r["model"], r["uid"]), {}).get("kl_patched", {}),
            "ctx": a.get("ctx_share", {}),
            "heads": a.get("heads", {}),
            "keys": a.get("keys", {}),
            "ctx_tokens": a.get("ctx_tokens", []),
        }
    sites = list(lens[0]["kl"]) if lens else []
    return list(dict.fromkeys(r["model"] for r in lens)), sites, items


def _eval_data(edir: Path | None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """({model: summary}, {uid: {prompt, context, target, "out": {model: outcomes}}}) from the eval reports."""
    summaries: dict[str, Any] = {}
    items: dict[str, dict[str, Any]] = {}
    for path in sorted(edir.glob("*.json")) if edir is not None else []:
        rep = load.eval_report(path)
        if rep is None:
            continue
        model = path.stem
        summaries[model] = {k: rep["summary"].get(k) for k in SUMMARY_KEYS if k in rep["summary"]}
        summaries[model]["regime"] = rep["summary"].get("regime")
        other: dict[str, list] = {}
        for o in rep["other"]:
            if o.get("sample", 0) == 0:
                other.setdefault(o["uid"], []).append([o["label"], o["response"], o["follow"], o["stick"]])
        for rec in rep["records"]:
            if rec.get("sample", 0) != 0:  # k samples per item: the page shows sample 0 (the report pairs them all)
                continue
            it = items.setdefault(rec["uid"], {"prompt": None, "context": None, "target": None, "out": {}})
            for k in ("prompt", "context", "target"):
                if it[k] is None and rec.get(k) is not None:
                    it[k] = rec[k] if isinstance(rec[k], str) else json.dumps(rec[k])
            it["out"][model] = {
                "x": rec["response_x"],
                "xc": rec["response_xc"],
                "cx": rec["correct_x"],
                "cxc": rec["correct_xc"],
                "other": other.get(rec["uid"], []),
            }
    return summaries, items


def _tables(pdir: Path | None) -> dict[str, Any]:
    tables = {}
    for name, cols in load.TABLES.items():
        path = pdir / f"{name}.csv" if pdir is not None else None
        if path is not None and path.is_file():
            rows = load.read_table(path, cols)
            if name == "patching":
                rows = [r for r in rows if r["window"] == "all" and r["direction"] == "c_to_x"]
            tables[name] = {"columns": list(cols), "rows": [[r[c] for c in cols] for r in rows]}
    return tables


def collect(run_dir: str | Path) -> dict[str, Any]:
    """The page's data: models, eval summaries, items (texts, outcomes per model and view, probe values), tables."""
    run = Path(run_dir)
    pdir = probes_dir(run)
    pmodels, sites, probe_items = _probe_data(pdir)
    summaries, eval_items = _eval_data(load.eval_dir(run))
    models = list(dict.fromkeys([*pmodels, *sorted(summaries, key=lambda m: (m != "base", m))]))
    items = []
    for uid in dict.fromkeys([*eval_items, *probe_items]):
        e = eval_items.get(uid, {})
        items.append(
            {
                "uid": uid,
                "prompt": e.get("prompt"),
                "context": e.get("context"),
                "target": e.get("target"),
                "out": e.get("out", {}),
                "probe": probe_items.get(uid),
            }
        )
    return {
        "models": models,
        "colours": colours_of(run, models),
        "summary": summaries,
        "sites": sites,
        "items": items,
        "tables": _tables(pdir),
    }


def colours_of(run: Path, models: list[str]) -> dict[str, str]:
    """Each model's colour in the figures (`plots._common.palette` over the run's model order, then the page's), as
    ``#rrggbb``: one colour per model on this page and in every figure."""
    try:
        order = run_info(run).models
    except MechopdError:  # a run without a study, demo.json or eval/: the page's own order
        order = []
    pal = palette([*order, *models])
    return {m: "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in pal[m][:3])) for m in models}


def _probe_source(pdir: Path | None) -> str | None:
    path = pdir / "lens.json" if pdir is not None else None
    if path is None or not path.is_file():
        return None
    doc = load.read_json(path)
    src = doc.get("settings", {}).get("responses_from") if isinstance(doc, dict) else None
    return src if isinstance(src, str) else None


def page_json(data: dict[str, Any]) -> str:
    """The data as JSON safe inside a <script> element: no ``<``, ``>``, ``&`` or line separators appear raw, so no
    string of the data can close the element or open a comment (``</script>``, ``<!--``)."""
    blob = json.dumps(data, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        blob = blob.replace(ch, esc)
    return blob


def render(data: dict[str, Any], title: str) -> str:
    """The HTML page (inline data, CSS and script); the script builds every element with textContent."""
    css = (ASSETS / "explore.css").read_text()
    js = "\n".join((ASSETS / name).read_text() for name in ("explore.js", "explore_items.js"))
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{css}</style></head><body><h1>{html.escape(title)}</h1>"
        '<pre id="errors"></pre><div id="tip" class="tip"></div><div id="summary"></div>'
        '<div id="controls"></div><div id="heads"></div><div id="items"></div>'
        "<details><summary>the probes' tables (the CSVs' values)</summary><div id=\"tables\"></div></details>"
        f'<script type="application/json" id="data">{page_json(data)}</script><script>{js}</script>'
        "</body></html>\n"
    )


def write_explorer(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the explorer page (default ``RUN/explore.html``); returns its path."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ConfigError(
            f"{run} is not a directory; pass a run dir (with eval/ or probes/), its probes/ dir or a "
            "mechopd eval --compare directory"
        )
    target = Path(out) if out is not None else _run_root(run) / PAGE
    if target.is_dir():
        raise ConfigError(f"--out {target} is a directory; pass a file name, e.g. --out {target / PAGE}")
    if target.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"--out {target}: the explorer is one HTML page; pass a path ending in .html")
    data = collect(run)
    if not data["items"]:
        raise ConfigError(
            f"{run} holds no evaluation reports (eval/*.json) and no probes/lens_tokens.jsonl with "
            f"items; run `mechopd eval --compare ... --out {run}/eval` or `mechopd probe lens --run {run}`"
            " first"
        )
    data["probe_source"] = _probe_source(probes_dir(run))
    text = render(data, f"mechopd explorer — {_run_root(run).resolve().name}")
    return atomic_write(target, lambda fh: fh.write(text))
