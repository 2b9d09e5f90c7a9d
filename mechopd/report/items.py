"""The reports' links into the explorer page (`mechopd.report.explore`): a run's ``report.md`` gets ``explore.html`` written
beside it and an "## Items" section that lists each model's Harm and Help items, each linked to its block
``explore.html#item-<i>`` (the page opens and scrolls to it); the claims about items (OPD's degradation, NCA's removal
of it, TA-OPD's Harm) link to the Harm filter of each seed's page.

Harm of a model is |{right without c, wrong with c}| / |{right without c}| (docs/method.md §2; `removability`), so the
section's counts reproduce ``eval/<model>.json``'s Harm and Help with one sample per item; with several samples per
item the page and this list show sample 0 (the report's Harm pairs every sample).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mechopd.core.errors import ConfigError, DataError
from mechopd.report.explore import PAGE, collect, write_explorer
from mechopd.report.explore_load import eval_dir

MAX_LINKS = 20  # per model and outcome; the rest behind the page's filter link
# claim key -> (outcome, role) of the items it is about
ITEM_CLAIMS = {"degradation": ("harm", "opd"), "nca_removes": ("harm", "nca"), "ta_opd": ("harm", "ta_opd")}


def _has_eval(root: Path) -> bool:
    d = eval_dir(root)
    return d is not None and any(d.glob("*.json"))


def _outcome_items(data: dict[str, Any], model: str, outcome: str) -> tuple[list[tuple[int, str]], int]:
    """([(page index, uid)] of the items with ``outcome`` for ``model``, the count of the condition's items)."""
    hits, base = [], 0
    for i, it in enumerate(data["items"]):
        o = it["out"].get(model)
        if o is None:
            continue
        cond = o["cx"] if outcome == "harm" else not o["cx"]
        base += bool(cond)
        if cond and o["cx"] != o["cxc"]:
            hits.append((i, it["uid"]))
    return hits, base


def _outcome_text(model: str, outcome: str, hits: list[tuple[int, str]], base: int) -> str:
    name = "Harm" if outcome == "harm" else "Help"
    cond = "right without the context" if outcome == "harm" else "wrong without the context"
    head = f"{name} {len(hits)} of the {base} items {cond}"
    if not hits:
        return head
    links = ", ".join(f"[{i}]({PAGE}#item-{i})" for i, _ in hits[:MAX_LINKS])
    more = f", … [all {len(hits)}]({PAGE}#filter={outcome}&model={model})" if len(hits) > MAX_LINKS else ""
    return f"{head}: {links}{more}"


def items_lines(root: str | os.PathLike, label: Callable[[str], str] = str) -> list[str]:
    """Write ``ROOT/explore.html`` and return the "## Items" section of ``ROOT/report.md`` ([] without eval reports)."""
    root = Path(root)
    if not _has_eval(root):
        return []
    try:
        write_explorer(root)
        data = collect(root)
    except (ConfigError, DataError) as e:  # e.g. eval reports without the per-item answers: said in the report
        return ["## Items", "", f"No explorer page: {e}.", ""]
    out = [
        "## Items",
        "",
        (
            f"The explorer page [`{PAGE}`]({PAGE}) (`mechopd explore {root}`) shows each item's prompt, context, "
            "target and every model's answers without and with the context, with the probes' token views. Harm items "
            "(right without the context, wrong with it) and Help items (the reverse) per model, sample 0 of each item; "
            "each number links to the item on the page."
        ),
        "",
    ]
    for model in data["models"]:
        if not any(model in it["out"] for it in data["items"]):
            continue
        parts = [_outcome_text(model, o, *_outcome_items(data, model, o)) for o in ("harm", "help")]
        out.append(f"- **{label(model)}** (`{model}`): " + "; ".join(parts) + ".")
    return out + [""]


def link_item_claims(rows: Sequence[Any], runs: Sequence[Any], report_dir: str | os.PathLike) -> None:
    """Append to each item claim's ``measured`` cell a link per seed run to its page, filtered to the claim's items
    (only runs whose ``explore.html`` exists, i.e. whose own report was written)."""
    report_dir = Path(report_dir)
    for row in rows:
        if row.key not in ITEM_CLAIMS:
            continue
        outcome, role = ITEM_CLAIMS[row.key]
        links = []
        for study in runs:
            name, page = study.name(role), Path(study.root) / PAGE
            if name is None or not page.is_file():
                continue
            rel = Path(os.path.relpath(page, report_dir)).as_posix()
            tag = study.root.name if len(runs) > 1 else "explorer"
            links.append(f"[{tag}]({rel}#filter={outcome}&model={name})")
        if links:
            row.measured += f"; {outcome.capitalize()} items of {role}: " + ", ".join(links)
