"""`mechopd explore RUN_DIR`: one self-contained HTML page of what the causal probes saw, item by item.

Reads only saved artifacts (``RUN/probes`` or a probes dir itself): ``lens_tokens.jsonl`` (required: per model and
detail item, the response tokens, per-token KL(p_c ‖ p_x) at every lens site, both views' top tokens at the output),
``lens.csv``, and where present ``patching_tokens.jsonl`` / ``patching.csv`` (per-token KL after the c→x residual
patch at each site) and ``attention_tokens.jsonl`` / ``attention.csv`` (per-token context share per layer).

The page: the tables' numbers (each cell carries the CSV's exact value in ``data-value``), then one block per item with
the models side by side (base / OPD / NCA ...): every response token coloured by the output KL between the views at
the position that predicts it; hovering a token shows both views' top tokens and a sparkline of that token's KL by
depth (and the patched KL and context share where computed); a sparkline per item and model gives the item's mean KL
by depth. No network, no CDN: data, style and script are inline; errors raised by the script are written into the
page (``#errors``) so a headless browser test can read them.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from mechopd.artifacts import atomic_write, read_csv
from mechopd.errors import ConfigError, DataError

PAGE = "explore.html"
ASSETS = Path(__file__).with_name("data") / "explore"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            raise DataError(f"{path} line {i} is not JSON; rerun the probe that wrote it") from None
    return out


def probes_dir(run_dir: str | Path) -> Path:
    """``RUN/probes`` of a run dir, or the dir itself when it holds the probe files."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ConfigError(f"{run} is not a directory; pass a run dir (or its probes/ dir) after mechopd probe lens")
    for d in (run / "probes", run):
        if (d / "lens_tokens.jsonl").is_file():
            return d
    raise ConfigError(f"{run} has no probes/lens_tokens.jsonl; run `mechopd probe lens --run {run}` first")


def _by_item(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["model"], int(r["item"])): r for r in records}


def collect(pdir: Path) -> dict[str, Any]:
    """The page's data: models, sites, per-item per-model token values, and the tables (as strings, exact)."""
    lens = _jsonl(pdir / "lens_tokens.jsonl")
    patch = _by_item(_jsonl(pdir / "patching_tokens.jsonl"))
    attn = _by_item(_jsonl(pdir / "attention_tokens.jsonl"))
    models = list(dict.fromkeys(r["model"] for r in lens))
    items: dict[int, dict[str, Any]] = {}
    for r in lens:
        it = items.setdefault(int(r["item"]), {"uid": r["uid"], "tokens": r["tokens"], "models": {}})
        p, a = patch.get((r["model"], int(r["item"]))), attn.get((r["model"], int(r["item"])))
        it["models"][r["model"]] = {"kl": r["kl"], "top_x": r.get("top_x", []), "top_c": r.get("top_c", []),
                                    "patched": p["kl_patched"] if p else {}, "ctx": a["ctx_share"] if a else {}}
    tables = {}
    for name, cols in (("lens", ("model", "site", "kl_c_x", "top1_agree")),
                       ("patching", ("model", "site", "component", "direction", "recovered")),
                       ("attention", ("model", "layer", "head", "context_share"))):
        path = pdir / f"{name}.csv"
        if path.is_file():
            rows = read_csv(path)
            if name == "patching":
                rows = [r for r in rows if r.get("window", "all") == "all" and r["direction"] == "c_to_x"]
            tables[name] = {"columns": list(cols), "rows": [[r[c] for c in cols] for r in rows]}
    sites = list(next(iter(lens))["kl"]) if lens else []
    return {"models": models, "sites": sites, "items": [items[k] for k in sorted(items)], "tables": tables}


def render(data: dict[str, Any], title: str) -> str:
    """The HTML page (inline data, CSS and script)."""
    css = (ASSETS / "explore.css").read_text()
    js = (ASSETS / "explore.js").read_text()
    blob = json.dumps(data, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{css}</style></head><body><h1>{html.escape(title)}</h1>"
            "<pre id=\"errors\"></pre><div id=\"tip\" class=\"tip\"></div><div id=\"items\"></div>"
            "<details open><summary>the probes' tables</summary><div id=\"tables\"></div></details>"
            f"<script type=\"application/json\" id=\"data\">{blob}</script><script>{js}</script></body></html>\n")


def write_explorer(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the explorer page (default ``RUN/explore.html``); returns its path."""
    pdir = probes_dir(run_dir)
    data = collect(pdir)
    if not data["items"]:
        raise ConfigError(f"{pdir / 'lens_tokens.jsonl'} holds no items; rerun mechopd probe lens with "
                          "--detail-items 1 or more")
    target = Path(out) if out is not None else (pdir.parent if pdir.name == "probes" else pdir) / PAGE
    text = render(data, f"mechopd explorer — {pdir.parent.name if pdir.name == 'probes' else pdir.name}")
    return atomic_write(target, lambda fh: fh.write(text))
