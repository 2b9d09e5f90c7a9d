"""Probe items that matter (issue 52): the held-out items a trained model learned or was harmed on.

A probe setup with ``select = LABEL`` (`ProbeSetup.select`; a study's probe entry ``select: opd``) draws its items among
the held-out items of the run's evaluation (``RUN/eval/LABEL.json`` and ``RUN/eval/base.json``, written before any
probe: the state before the probe's intervention):

* **learned**: LABEL right without the context, the base wrong without it;
* **harmed**: LABEL right without the context and wrong with it (Harm's items).

The chosen items are the evaluation's own draw (``task.examples("test", n_eval, seed)``) restricted to those uids, in
that order, so every probe of the seed that selects sees the same items; fewer than the probe's ``n`` are all of them.
`SelectedTask` is the task the probe then reads (`ProbeSetup.make_task`); `selection` is what the probe records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mechopd.core.errors import ConfigError, DataError


def _records(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(
            f"probe items select: {path} not found; evaluate the run first (mechopd run does) or drop select"
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not JSON ({e.msg}); rerun the evaluation") from None
    records = doc.get("records") if isinstance(doc, dict) else None
    if not isinstance(records, list) or not records:
        raise DataError(f"{path}: no 'records'; rerun the evaluation")
    return {str(r["uid"]): r for r in records if int(r.get("sample", 0)) == 0}


def selection(run_dir: str | Path, label: str) -> dict[str, Any]:
    """``{"model", "eval_n", "order", "learned", "harmed"}``: `label`'s learned and harmed uids (module docstring) and
    the evaluation's uid order, from ``run_dir/eval/``."""
    if label == "base":
        raise ConfigError("probe items select=base: name a trained model (learned / harmed are relative to the base)")
    model = _records(Path(run_dir) / "eval" / f"{label}.json")
    base = _records(Path(run_dir) / "eval" / "base.json")
    missing = sorted(set(model) - set(base))
    if missing:
        raise DataError(f"{run_dir}/eval: {label}'s item {missing[0]} has no base record; rerun the evaluation")
    learned = [u for u, r in model.items() if r["correct_x"] and not base[u]["correct_x"]]
    harmed = [u for u, r in model.items() if r["correct_x"] and not r["correct_xc"]]
    return {"model": label, "eval_n": len(model), "order": list(model), "learned": learned, "harmed": harmed}


class SelectedTask:
    """A task whose test items are only the selected ones (every other member forwarded to the wrapped task)."""

    def __init__(self, task: Any, chosen: dict[str, Any]) -> None:
        self._task = task
        self.chosen = chosen
        self._uids = set(chosen["learned"]) | set(chosen["harmed"])

    def __getattr__(self, name: str) -> Any:
        if name in ("_task", "_uids", "chosen"):  # not set yet (copy / unpickle): no recursion
            raise AttributeError(name)
        return getattr(self._task, name)

    def examples(self, split: str, n: int, seed: int) -> list:
        if split != "test":
            raise ConfigError(
                f"probe items select={self.chosen['model']}: the selection is of held-out items; drop split={split}"
            )
        drawn = [e for e in self._task.examples("test", self.chosen["eval_n"], seed) if e.uid in self._uids]
        if not drawn:
            raise ConfigError(
                f"probe items select={self.chosen['model']}: the model learned no item and was harmed on none of the "
                f"{self.chosen['eval_n']} evaluated; drop select (nothing to probe) or train further"
            )
        return drawn[:n]

    def max_items(self, split: str, need: int = 0) -> int | None:
        return len(self._uids) if split == "test" else 0
