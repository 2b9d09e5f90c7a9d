"""Not a timing: did training raise the student's probability of the handbook's answer? (issue 52, pilot 3)

`facts_opd_support.py` measures the base (student = teacher = the base model). Here the student is a TRAINED model
(``--student RUN/final``, no handbook) and the teacher the base with the handbook (``--teacher``, user placement), on
``--n`` train items of a ``facts`` seed (the validation part unless told). Per item: one sampled student rollout
(temperature 1) and, teacher-forced on it, the position where the teacher gives the answer's first token the most
probability ``f``; there the student's probability ``q`` and rank of that token; and ``q_teacher_prefix``: the student's
probability of the answer's first token where the teacher's own greedy reply starts it (had it written the teacher's
words). Prints one line per item and the medians; run it on the base (``--student`` = ``--teacher``) for the baseline.

    python bench/facts_answer_prob.py --student /tmp/facts_pilot3/RUN/final \
        --teacher ~/.cache/mechopd/models/smollm2-135m-instruct --k 4 --n 16 --seed 0
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from mechopd.core.views import RenderSpec, render_prompt_ids
from mechopd.models import load_model, load_tokenizer
from mechopd.tasks import get_task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facts_opd_support import SMOL_SYSTEM, logp  # noqa: E402  (one copy: the support diagnosis)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--part", default="validation")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--no-context-system", default=SMOL_SYSTEM)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    tok, student, teacher = load_tokenizer(args.teacher), load_model(args.student), load_model(args.teacher)
    task = get_task("facts", part=args.part, k=args.k)
    spec = RenderSpec(placement="user", no_context_system=args.no_context_system)
    rows = []
    for e in task.examples("train", args.n, args.seed):
        px = render_prompt_ids(tok, e.prompt, None, spec)
        pc = render_prompt_ids(tok, e.prompt, e.context, spec)
        first = {tok(t, add_special_tokens=False).input_ids[0] for t in (" " + e.answer, e.answer)}
        with torch.inference_mode():
            greedy = teacher.generate(torch.tensor([pc]), max_new_tokens=args.max_new_tokens, do_sample=False)
            t_reply = greedy[0, len(pc) :].tolist()
            sampled = student.generate(
                torch.tensor([px]), max_new_tokens=args.max_new_tokens, do_sample=True, temperature=1.0, top_k=0
            )
            rollout = sampled[0, len(px) :].tolist()
            lx, lc = logp(student, px, rollout), logp(teacher, pc, rollout)
            f, t, a = max((float(lc[:, a].exp().max()), int(lc[:, a].argmax()), a) for a in first)
            starts = [i for i in range(len(t_reply)) if e.answer.split()[0] in tok.decode(t_reply[: i + 1])]
            q_on_teacher = None
            if starts:
                lt = logp(student, px, t_reply)
                q_on_teacher = float(lt[starts[0], t_reply[starts[0]]].exp())
        rows.append(
            {
                "answer": e.answer,
                "f": round(f, 4),
                "q": float(f"{float(lx[t, a].exp()):.3g}"),
                "rank": int((lx[t] > lx[t, a]).sum()),
                "q_teacher_prefix": None if q_on_teacher is None else float(f"{q_on_teacher:.3g}"),
                "rollout": tok.decode(rollout, skip_special_tokens=True)[:70],
            }
        )
        print(rows[-1], flush=True)
    on_t = [r["q_teacher_prefix"] for r in rows if r["q_teacher_prefix"] is not None]
    print(
        f"n={len(rows)}: on the student's rollout max f median {statistics.median(r['f'] for r in rows):.3f}; the "
        f"student's q there median {statistics.median(r['q'] for r in rows):.3g}, rank median "
        f"{statistics.median(r['rank'] for r in rows)}; on the teacher's prefix ({len(on_t)} items) q median "
        f"{statistics.median(on_t) if on_t else float('nan'):.3g}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
