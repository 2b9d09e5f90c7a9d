"""The training run's periodic evaluation: the student on ``eval_n`` held-out items in both views
(`mechopd.evaluation.evaluate.evaluate_model`), its line printed and its headline numbers returned for the metrics
record. Every process calls it (a sharded student is gathered); rank 0 evaluates, the others wait."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from mechopd.config import TrainConfig
from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
from mechopd.train import dist
from mechopd.train.reporting import eval_line

HEADLINE = ("acc_x", "acc_xc", "harm", "help", "both_correct", "delta_len")  # logged as eval/<name>


@dataclass
class PeriodicEval:
    """`evaluate(step)`: the metrics of the evaluation at `step` (``eval/...``; {} on ranks other than 0)."""

    cfg: TrainConfig
    task: Any
    tokenizer: Any
    spec: Any  # the run's pinned render
    train_uids: set[str]  # the training pool's items, which the evaluation must not contain
    student: Any
    shard: Any
    engine: Any  # the rollout engine (vLLM) or None
    rank: int
    progress: bool  # a progress bar is shown: the line goes above it
    last: tuple[int, Any] | None = field(default=None, init=False)  # (step, summary) of the last evaluation

    def evaluate(self, step: int) -> dict[str, Any]:
        with self.shard.gathered(self.student):
            rec = self._evaluate(step) if self.rank == 0 else {}
            dist.barrier()
        return rec

    def _evaluate(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        ecfg = EvalConfig(  # the rollout's decoder, prefix mode and response cap (null: the task's)
            n=cfg.eval_n,
            seed=cfg.seed,
            n_boot=200,
            engine=cfg.rollout_engine,
            shared_prefix=cfg.shared_prefix,
            max_new_tokens=cfg.max_new_tokens,
        )
        rep = evaluate_model(
            self.student, self.tokenizer, self.task, ecfg, self.spec, train_uids=self.train_uids, engine=self.engine
        )
        s = rep["summary"]
        self.last = (step, s)
        if self.progress:
            tqdm.write(eval_line(step, cfg.steps, s))  # above the progress bar (rank 0 only evaluates)
        else:
            print(eval_line(step, cfg.steps, s), flush=True)
        return {f"eval/{k}": s[k]["value"] for k in HEADLINE}
