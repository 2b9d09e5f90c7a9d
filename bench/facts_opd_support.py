"""Not a timing: can OPD's loss reach the handbook's answer on the student's own rollouts? (issue 52, diagnosis a-c)

On ``--n`` train items of a ``facts`` seed (the validation part unless told), with the base model as student (no
handbook) and teacher (the handbook, user placement): the teacher's greedy reply (where its answer starts, token
index), one sampled student rollout (temperature 1, ``--max-new-tokens``), and, teacher-forced on that rollout, the
position where the teacher gives the answer's first token the most probability ``f``; there the student's probability
``q`` and rank of that token. Rank ≥ ``--topk``: the token is in the `topk` estimator's tail bucket (the student's top k
is the support). Also the student's rank of the answer token on the TEACHER's prefix (had it written the teacher's
words). Prints one line per item and the medians.

    python bench/facts_opd_support.py --model ~/.cache/mechopd/models/smollm2-135m-instruct --n 16 --seed 0
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from mechopd.core.views import RenderSpec, render_prompt_ids
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks import get_task

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def logp(model, prompt: list[int], reply: list[int]) -> torch.Tensor:
    """Log-probabilities ``[len(reply), vocab]`` of each reply position given the prompt and the reply before it."""
    out = model(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(out.float(), -1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--part", default="validation")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--topk", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--no-context-system", default=SMOL_SYSTEM)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    tok, model = load_tokenizer(args.model), load_model(args.model)
    task = get_task("facts", part=args.part, k=args.k)
    spec = RenderSpec(placement="user", no_context_system=args.no_context_system)
    rows = []
    for e in task.examples("train", args.n, args.seed):
        px = render_prompt_ids(tok, e.prompt, None, spec)
        pc = render_prompt_ids(tok, e.prompt, e.context, spec)
        first = {tok(t, add_special_tokens=False).input_ids[0] for t in (" " + e.answer, e.answer)}
        with torch.inference_mode():
            greedy = model.generate(torch.tensor([pc]), max_new_tokens=args.max_new_tokens, do_sample=False)
            teacher = greedy[0, len(pc) :].tolist()
            sampled = model.generate(
                torch.tensor([px]), max_new_tokens=args.max_new_tokens, do_sample=True, temperature=1.0, top_k=0
            )
            rollout = sampled[0, len(px) :].tolist()
            lx, lc = logp(model, px, rollout), logp(model, pc, rollout)
            f, t, a = max((float(lc[:, a].exp().max()), int(lc[:, a].argmax()), a) for a in first)
            rank = int((lx[t] > lx[t, a]).sum())
            starts = [i for i in range(len(teacher)) if e.answer.split()[0] in tok.decode(teacher[: i + 1])]
            on_teacher = None
            if starts:
                lt = logp(model, px, teacher)
                tid = teacher[starts[0]]
                on_teacher = int((lt[starts[0]] > lt[starts[0], tid]).sum())
        row = {
            "uid": e.uid,
            "answer": e.answer,
            "teacher_starts_at": starts[0] if starts else None,
            "f": round(f, 4),
            "q": float(f"{float(lx[t, a].exp()):.3g}"),
            "rank": rank,
            "rank_on_teacher_prefix": on_teacher,
            "rollout": tok.decode(rollout, skip_special_tokens=True)[:60],
        }
        rows.append(row)
        print(row, flush=True)
    ranks = [r["rank"] for r in rows]
    starts = [r["teacher_starts_at"] for r in rows if r["teacher_starts_at"] is not None]
    print(
        f"n={len(rows)}: teacher names the answer on {len(starts)} (starts at token {min(starts, default=None)}-"
        f"{max(starts, default=None)}); on the student's rollout max f median {statistics.median(r['f'] for r in rows):.3f}"
        f" (>= 0.1 on {sum(r['f'] >= 0.1 for r in rows)}); the student's q there median "
        f"{statistics.median(r['q'] for r in rows):.2g}, rank median {statistics.median(ranks)}, outside the top "
        f"{args.topk} on {sum(r >= args.topk for r in ranks)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
