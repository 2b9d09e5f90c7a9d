"""Not a timing: a trained ``facts`` student's no-context accuracy on its own TRAIN paraphrases beside the held-out
ones (issue 52's diagnosis (d): is a held-out failure one of learning or of generalisation?).

Greedy, ``max_new_tokens`` from the run's task options, strict scoring (`FactsTask.score`), no-context view only
(the run's render: its ``no_context_system``). Prints one line per split: n, Acc_x, and the first replies.

    python bench/facts_train_items.py /tmp/facts_pilot/RUN --n 32
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml

from mechopd.core.views import RenderSpec, pad_id, render_prompt_ids
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks import get_task


def accuracy(model, tok, task, spec: RenderSpec, items: list, max_new: int, batch: int = 16) -> tuple[float, list]:
    """Greedy no-context replies of `items` and the share scored right."""
    hits, replies = [], []
    pad = pad_id(tok)
    for i in range(0, len(items), batch):
        chunk = items[i : i + batch]
        ids = [render_prompt_ids(tok, e.prompt, None, spec) for e in chunk]
        width = max(map(len, ids))
        x = torch.tensor([[pad] * (width - len(r)) + r for r in ids])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
        with torch.inference_mode():
            out = model.generate(
                input_ids=x, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=pad
            )
        for e, row in zip(chunk, out[:, width:]):
            text = tok.decode(row, skip_special_tokens=True)
            hits.append(task.score(e, text))
            replies.append((e.uid, e.answer, text))
    return sum(hits) / len(hits), replies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a `mechopd train` run directory (its final/ and config.yaml)")
    parser.add_argument("--n", type=int, default=32, help="items per split (at most the seed's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = yaml.safe_load((args.run / "config.yaml").read_text(encoding="utf-8"))
    opts = dict(cfg.get("task_options") or {})
    task = get_task(cfg["task"], **opts)
    spec = RenderSpec(placement=opts.get("placement", "user"), no_context_system=cfg.get("no_context_system"))
    tok, model = load_tokenizer(args.run / "final"), load_model(args.run / "final")
    seed = int(cfg.get("seed", 0))
    out = {}
    for split in ("train", "test"):
        n = min(args.n, task.max_items(split) or args.n)
        acc, replies = accuracy(model, tok, task, spec, task.examples(split, n, seed), task.max_new_tokens)
        out[split] = {"n": n, "acc_x": acc, "replies": replies}
        print(f"{split}: n={n} Acc_x {acc:.3f}  e.g. {replies[:3]}", flush=True)
    (args.run / "train_items.json").write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
