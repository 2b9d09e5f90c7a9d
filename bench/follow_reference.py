"""`mechopd eval --other-contexts` against an independent greedy decoder (the #20 acceptance check), on the rules task.

For each model: `mechopd eval --task rules --other-contexts --compare base=... NAME=PATH ...` writes
``OUT/<name>.json``; the reference decodes the same held-out items under each other rule of the family with
transformers' own ``generate`` (greedy, batched, left-padded; no mechopd sampler, views or scorer), scores each reply
against that rule's output, leaves out a rule whose output on an item equals the distilled rule's (as
`tasks.rules.RulesTask.other_contexts`), and averages over the rules. It prints both numbers and PASS when they agree
within 0.05 (the issue's bar); exit 1 otherwise.

    python bench/follow_reference.py --n 200 --out runs/follow_check base=runs/organisms/rules \
        opd=runs/demo/seed-0/train/opd/final nca=runs/demo/seed-0/train/nca/final
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from mechopd.cli import main as mechopd_main
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks.base import get_task
from mechopd.tasks.rules import apply_rule, rule_text

BAR = 0.05


def reference_follow(path: str, items: list, task) -> float:
    """Mean over the other rules of the share of items whose greedy reply (transformers' generate) is that rule's."""
    model, tok = load_model(path).eval(), load_tokenizer(path)
    tok.padding_side = "left"
    stops = [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
    per_rule = []
    for rule in dict.fromkeys(task.family):
        if rule == task.rule:
            continue
        own = [apply_rule(task.rule, ex.meta["digits"]) for ex in items]
        keep = [(ex, o) for ex, o in zip(items, own) if apply_rule(rule, ex.meta["digits"]) != o]
        if not keep:
            continue
        texts = [
            tok.apply_chat_template(
                [{"role": "system", "content": rule_text(rule)}, {"role": "user", "content": ex.prompt}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for ex, _ in keep
        ]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(
                **enc, do_sample=False, max_new_tokens=24, eos_token_id=stops, pad_token_id=tok.pad_token_id
            )
        replies = tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        right = [
            r.split() == [str(d) for d in apply_rule(rule, ex.meta["digits"])] for r, (ex, _) in zip(replies, keep)
        ]
        per_rule.append(sum(right) / len(right))
    return sum(per_rule) / len(per_rule)


def run(models: dict[str, str], n: int, out: Path) -> bool:
    code = mechopd_main(
        [
            "eval",
            "--task",
            "rules",
            "--n",
            str(n),
            "--other-contexts",
            "--compare",
            *[f"{k}={v}" for k, v in models.items()],
            "--out",
            str(out),
        ]
    )
    if code != 0:
        raise SystemExit(code)
    task = get_task("rules")
    items = task.examples("test", n, 0)
    ok = True
    print(f"{'model':>10}  mechopd follow_other  reference (generate)  |diff|   deaf?")
    for name, path in models.items():
        summary = json.loads((out / f"{name}.json").read_text())["summary"]
        mine, ref = summary["follow_other"]["value"], reference_follow(path, items, task)
        agree = abs(mine - ref) <= BAR
        ok &= agree
        deaf = "context-deaf" if summary.get("context_deaf") else ""
        print(
            f"{name:>10}  {mine:20.3f}  {ref:20.3f}  {abs(mine - ref):.3f}  {deaf:12s} "
            f"{'PASS' if agree else 'FAIL'} (bar {BAR})"
        )
    return ok


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="NAME=PATH; the first is the base (retention, context-deaf)")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--out", default="runs/follow_check")
    a = p.parse_args()
    pairs = dict(m.split("=", 1) for m in a.models)
    sys.exit(0 if run(pairs, a.n, Path(a.out)) else 1)
