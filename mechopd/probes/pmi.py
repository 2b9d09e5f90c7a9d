"""Where the teacher's signal comes from: the teacher's pointwise mutual information with the context, per response
token (docs/method.md "Interventions and update geometry").

Items: held-out items with the trained student's greedy no-context reply y (default; ``sampled`` for the training
temperature). At every scored position t (the position predicting y_t), with the teacher f and the student q:

    pmi_t      = log f(y_t | c, x, y<t) − log f(y_t | x, y<t)        (logits / T, float64)
    opd_t      = KL(q_x ‖ f_c) at t = Σ_v q_x(v) (log q_x(v) − log f_c(v))    (the OPD loss per token, §1)
    sampled_t  = log q_x(y_t) − log f_c(y_t)                           (the sampled-token OPD estimator, §1)
               = [log q_x(y_t) − log f_x(y_t)] − pmi_t                 (identity)
    opd_t      = KL(q_x ‖ f_x)_t + ctx_t,  ctx_t = E_{v~q_x}[log f_x(v) − log f_c(v)] = −E_{q_x}[PMI(v)]   (exact)
    pmi_share  = Σ_t ctx_t / Σ_t opd_t: the share of the OPD loss that is the teacher's PMI with the context, 1 when
                 q_x = f_x (self-distillation before the first update); reported only where the mean OPD loss is at
                 least `MIN_OPD` nats (a converged student's loss is ~0 and the ratio says nothing)
    C_t, D_t   = TA-OPD's compatibility and union divergence of (q_x, f_c) (`objectives.signals`),
                 D^L_t = Norm(D)·Norm(C)
                 over the run's tokens (§3)
    flip_t     = on an item the student answers right without c: its context view fed y chooses ≠ y_t at t, at the
                 first such t only (the token where the greedy decode with c would leave the right reply: Harm's
                 token)

Summary: pmi_share, Pearson / Spearman of pmi with opd, D^L and C, the mean pmi at flip tokens and at the other tokens
of the same items, and the tokens with the largest pmi. Files: ``pmi_tokens.csv`` (`COLUMNS`), ``pmi.json``,
``pmi_items.jsonl``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mechopd.core.artifacts import read_csv, write_csv
from mechopd.core.options import option
from mechopd.objectives.signals import teachability_stats
from mechopd.probes import causal_items as ci
from mechopd.probes.attribution import correlations
from mechopd.probes.capture import forward
from mechopd.probes.options import Role
from mechopd.probes.registry import ProbeSpec, register_probe

COLUMNS = ("uid", "position", "token", "pmi", "opd", "kl_x", "ctx", "sampled", "C", "D", "DL", "right_x", "flip")
MIN_OPD = 0.01


def _tok_logp(lp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return lp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def token_rows(teacher, student, batch, T: float, right: Sequence[bool], uids: Sequence[str], tok) -> list[dict]:
    """One row per response token of the batch (module docstring; C, D raw; D^L filled in later)."""
    batch = batch.to(next(student.parameters()).device)
    y, mask = batch.response_ids, batch.response_mask
    f_c = ci.logp(forward(teacher, batch, "c", positions="predict").logits, T)
    f_x = ci.logp(forward(teacher, batch, "x", positions="predict").logits, T)
    q_x = ci.logp(forward(student, batch, "x", positions="predict").logits, T)
    q_c_choice = forward(student, batch, "c", positions="predict").logits.argmax(-1)
    pmi = _tok_logp(f_c, y) - _tok_logp(f_x, y)
    opd = ci.kl_rows(q_x, f_c)
    kl_x = ci.kl_rows(q_x, f_x)
    ctx = (q_x.exp() * (f_x - f_c)).sum(-1)
    sampled = _tok_logp(q_x, y) - _tok_logp(f_c, y)
    stats = teachability_stats(q_x.float(), f_c.float(), mask)
    rows = []
    for b in range(batch.batch_size):
        wrong = ((q_c_choice[b] != y[b]) & mask[b]).nonzero().flatten().tolist()
        first = wrong[0] if (wrong and right[b]) else None
        for t in range(int(mask[b].sum())):
            rows.append(
                {
                    "uid": uids[b],
                    "position": t,
                    "token": tok.convert_ids_to_tokens(int(y[b, t])),
                    "pmi": float(pmi[b, t]),
                    "opd": float(opd[b, t]),
                    "kl_x": float(kl_x[b, t]),
                    "ctx": float(ctx[b, t]),
                    "sampled": float(sampled[b, t]),
                    "C": float(stats.C[b, t]),
                    "D": float(stats.D[b, t]),
                    "DL": None,
                    "right_x": bool(right[b]),
                    "flip": t == first,
                }
            )
    return rows


def _norm(z: np.ndarray) -> np.ndarray:
    """TA-OPD's Norm(z) = clip((z − Q05) / (Q95 − Q05), 0, 1) over the run's tokens (§3)."""
    lo, hi = np.quantile(z, [0.05, 0.95])
    return np.clip((z - lo) / (hi - lo), 0, 1) if hi > lo else np.zeros_like(z)


def summarize(rows: list[dict]) -> dict[str, Any]:
    if not rows:
        return {"n_tokens": 0}
    col = {k: np.array([r[k] for r in rows], float) for k in ("pmi", "opd", "kl_x", "ctx", "sampled", "C", "D")}
    dl = _norm(col["D"]) * _norm(col["C"])
    for r, v in zip(rows, dl):
        r["DL"] = float(v)
    flip = np.array([r["flip"] for r in rows])
    on_right = np.array([r["right_x"] for r in rows])
    flipped_items = {r["uid"] for r in rows if r["flip"]}
    others = np.array([r["uid"] in flipped_items and not r["flip"] for r in rows])
    total = col["opd"].sum()
    top = sorted(rows, key=lambda r: -r["pmi"])[:5]
    return {
        "n_tokens": len(rows),
        "n_items": len({r["uid"] for r in rows}),
        "mean_pmi": float(col["pmi"].mean()),
        "mean_opd": float(col["opd"].mean()),
        "mean_kl_x": float(col["kl_x"].mean()),
        "mean_ctx": float(col["ctx"].mean()),
        "pmi_share": float(col["ctx"].sum() / total) if col["opd"].mean() >= MIN_OPD else None,
        "corr_opd": correlations(col["pmi"], col["opd"]),
        "corr_DL": correlations(col["pmi"], dl),
        "corr_C": correlations(col["pmi"], col["C"]),
        "n_flips": int(flip.sum()),
        "n_right_x_tokens": int(on_right.sum()),
        "pmi_flip": float(col["pmi"][flip].mean()) if flip.any() else None,
        "pmi_flip_items_other": float(col["pmi"][others].mean()) if others.any() else None,
        "top_tokens": [{"uid": r["uid"], "position": r["position"], "token": r["token"], "pmi": r["pmi"]} for r in top],
    }


@dataclass(frozen=True)
class PmiOptions:
    """`mechopd probe pmi`'s options (`mechopd.probes.options`)."""

    student: Role | None = option(None, "the trained student: a label or dir (default: first trained)")
    teacher: Role | None = option(None, "the teacher: a label or dir (default: the run's teacher, else base)")
    sampled: bool = option(False, "sampled replies (the training temperature) instead of greedy ones")


def run_pmi(setup: Any, out_dir: str | Path, opts: PmiOptions | None = None, *, device: str | None = None) -> list[str]:
    """`mechopd probe pmi`: writes pmi_tokens.csv / pmi.json / pmi_items.jsonl; returns the lines it prints."""
    opts = opts or PmiOptions()
    sampled = opts.sampled
    s_label, s_path = setup.model(opts.student, "trained")
    t_label, t_path = setup.model(opts.teacher, "teacher")
    models: Mapping[str, str] = {s_label: s_path, **({} if t_label == s_label else {t_label: t_path})}
    run = ci.resolve(
        setup.replace(responses_from=s_label), models, probe="pmi", out=out_dir, greedy=not sampled, device=device
    )
    stu, tea = run.load(s_label), run.load(t_label)
    tok, task = run.tokenizer, run.task
    right = [
        bool(task.score(ex, tok.decode(r, skip_special_tokens=True)))
        for ex, r in zip(run.items.examples, run.items.responses)
    ]
    rows, i = [], 0
    for batch in run.items:
        n = batch.batch_size
        uids = [e.uid for e in run.items.examples[i : i + n]]
        rows += token_rows(tea, stu, batch, run.temperature, right[i : i + n], uids, tok)
        i += n
    summary = {"student": s_label, "teacher": t_label, **summarize(rows)}
    out = Path(out_dir)
    write_csv(out / "pmi_tokens.csv", rows, COLUMNS)
    ci.save(
        out,
        "pmi",
        run,
        run.settings(student=s_label, teacher=t_label, responses="sampled" if sampled else "greedy"),
        summary,
    )
    return [f"pmi table: {out / 'pmi_tokens.csv'}"] + PmiSummary.load(out).lines()


def _f(v: Any, spec: str = ".3f") -> str:
    return "n/a" if v is None else format(v, spec)


class PmiSummary(ci.CausalSummary):
    """The PMI probe's result (``summary`` of pmi.json) and its report ``lines()``."""

    PROBE = "pmi"

    @classmethod
    def load(cls, probes_dir):

        doc = ci.load_summary(Path(probes_dir), cls.PROBE)
        return None if doc is None else cls(doc, read_csv(Path(probes_dir) / "pmi_tokens.csv"))

    def lines(self) -> list[str]:
        s = self.summary
        if not s.get("n_tokens"):
            return []
        return [
            f"- **Teacher PMI with the context** ({s['teacher']} → {s['student']}, `probes/pmi_tokens.csv`): mean "
            f"{_f(s['mean_pmi'])} nats per token over {s['n_tokens']} tokens; OPD loss {_f(s.get('mean_opd'))} = "
            f"KL(q_x ‖ f_x) {_f(s.get('mean_kl_x'))} + context part {_f(s.get('mean_ctx'))} (PMI share "
            f"{_f(s.get('pmi_share'), '.2f')}); Spearman with the OPD KL {_f(s['corr_opd'].get('spearman'), '.2f')}, "
            f"with D^L {_f(s['corr_DL'].get('spearman'), '.2f')}, with C {_f(s['corr_C'].get('spearman'), '.2f')}; "
            f"at the {s['n_flips']} tokens that flip under Harm {_f(s['pmi_flip'])} (other tokens of those items "
            f"{_f(s['pmi_flip_items_other'])})"
        ]


register_probe(
    ProbeSpec(
        "pmi",
        "the teacher's pointwise mutual information with the context per response token, against the OPD loss, "
        "D^L / C and the tokens that flip under Harm",
        run_pmi,
        options=PmiOptions,
        order=120,
        outputs=("pmi_tokens.csv", "pmi.json", "pmi_items.jsonl"),
        demo=None,  # on demand (`mechopd probe pmi --run RUN`): the demo's 5-minute budget has no room for it
        role_options=("student",),
        summary=PmiSummary,
    )
)
