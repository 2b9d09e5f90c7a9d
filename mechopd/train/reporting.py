"""What a training run says and where it logs: the terminal lines and the metric sinks.

Terminal (rank 0 only, so ``torchrun`` prints each line once):
  * at the start, the config as ONE line (task, method, selector, steps and every field that differs from the
    defaults) plus the path of ``config.yaml``; the full resolved YAML only with ``verbose`` (``mechopd train
    --verbose``);
  * at each periodic evaluation, one line: ``step k/N · eval (n items): Acc_x … · Acc_xc … · Harm … · Help …``;
  * at the end, the last evaluation again with its 95 % paired bootstrap intervals, naming its step (an evaluation
    before the final step says so: ``mechopd eval --run`` evaluates the final model).

Sinks (`Logger`, one signature whatever is on, so the loop never branches): ``metrics.jsonl`` always; TensorBoard
(``log_tensorboard: true``, the extra ``mechopd[tensorboard]``) under ``RUN/tensorboard``; Weights & Biases
(``log_wandb: true``, the extra ``mechopd[wandb]``) under ``RUN/wandb``, OFFLINE unless ``WANDB_MODE`` says
otherwise (``wandb sync RUN/wandb/offline-run-*`` uploads it later). Both get the same metric names as metrics.jsonl
(``loss``, ``kl/teacher_student``, ``eval/acc_x`` ...) at the same ``step``, and the resolved config once (TensorBoard:
a ``config`` text entry of a new run; W&B: the run's config, one run id per run directory so a resume continues it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from mechopd.core.errors import ConfigError

ALWAYS = ("task", "method", "selector", "steps")
EVAL_KEYS = (("acc_x", "Acc_x"), ("acc_xc", "Acc_xc"), ("harm", "Harm"), ("help", "Help"))


def config_block(cfg: Any, resume_from: Path | None) -> str:
    """The resolved config as one YAML block (``--verbose``), naming the recipe it started from."""
    from mechopd.organisms.recipes import recipe_for

    recipe = recipe_for(cfg.student)
    from_recipe = sorted(k for k, v in recipe.items() if getattr(cfg, k) == v)
    head = f"resolved config ({'resuming from ' + str(resume_from) if resume_from else 'new run'}"
    head += f"; organism recipe for {', '.join(from_recipe)} unless set)" if recipe else "; paper defaults unless set)"
    return head + ":\n" + "".join(f"  {ln}\n" for ln in yaml.safe_dump(cfg.to_dict(), sort_keys=False).splitlines())


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def config_line(cfg: Any, config_path: Path, resume_from: Path | None) -> str:
    """One line: task, method, selector, steps, then every field that differs from `TrainConfig`'s defaults, and the
    path of the full record."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING}
    defaults.update(
        {f.name: f.default_factory() for f in dataclasses.fields(cfg) if f.default_factory is not dataclasses.MISSING}
    )
    values = cfg.to_dict()
    changed = [k for k in values if k not in ALWAYS and k in defaults and values[k] != defaults[k]]
    pairs = " ".join(f"{k}={_short(values[k])}" for k in (*ALWAYS, *changed))
    state = f"resuming from {resume_from}" if resume_from else "new run"
    return f"config ({state}): {pairs} · full config: {config_path} (--verbose prints it)"


def _value(s: dict[str, Any], key: str, intervals: bool) -> str:
    e = s.get(key) or {}
    v = e.get("value") if isinstance(e, dict) else e
    if v is None:
        return "n/a"
    ci = f" [{e['low']:.3f}, {e['high']:.3f}]" if intervals and e.get("low") is not None else ""
    return f"{v:.3f}{ci}"


def eval_line(step: int, steps: int, summary: dict[str, Any]) -> str:
    """``step k/N · eval (n=…): Acc_x … · Acc_xc … · Harm … · Help …`` of one periodic evaluation."""
    cells = " · ".join(f"{name} {_value(summary, key, False)}" for key, name in EVAL_KEYS)
    return f"step {step}/{steps} · eval (n={summary.get('n')}): {cells}"


def final_line(step: int, steps: int, last: tuple[int, dict[str, Any]] | None, run_dir: Path) -> str:
    """The end of a run: the last evaluation with its intervals (or why there is none)."""
    if last is None:
        return (
            f"done: step {step}/{steps}; no periodic evaluation (eval_every=0): mechopd eval --run {run_dir} "
            "evaluates the final model"
        )
    at, s = last
    cells = " · ".join(f"{name} {_value(s, key, True)}" for key, name in EVAL_KEYS)
    note = "" if at == step else f" (evaluated at step {at}, not the final step: mechopd eval --run {run_dir})"
    return f"done: step {step}/{steps} · eval (n={s.get('n')}, 95 % paired bootstrap): {cells}{note}"


# ------------------------------------------------------------------------------------------------------ sinks
def _numbers(record: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _tensorboard(run: Path, config: dict[str, Any], fresh: bool) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            'log_tensorboard=true needs the tensorboard package: pip install -e ".[tensorboard]" '
            "(or pip install tensorboard), or drop log_tensorboard"
        ) from None
    tb = SummaryWriter(str(run / "tensorboard"))
    if fresh:  # the config once per run (a resume writes into the same directory)
        tb.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)
    return tb


def _wandb(run: Path, config: dict[str, Any], project: str) -> Any:
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            'log_wandb=true needs the wandb package: pip install -e ".[wandb]" (or pip install wandb), '
            "or drop log_wandb"
        ) from None
    run_id = hashlib.sha1(str(run.resolve()).encode()).hexdigest()[:16]  # one W&B run per run dir: a resume continues
    return wandb.init(
        project=project,
        name=run.name,
        id=run_id,
        resume="allow",
        dir=str(run),
        config=config,
        mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]  # the user's string; wandb checks it
        reinit=True,
    )


class Logger:
    """metrics.jsonl always; TensorBoard and W&B only when asked (same metric names and steps as metrics.jsonl)."""

    def __init__(
        self,
        path: Path,
        enabled: bool,
        tensorboard: bool = False,
        wandb: bool = False,
        config: dict[str, Any] | None = None,
        fresh: bool = True,
        project: str = "mechopd",
        before_first: Callable[[], Any] | None = None,
    ) -> None:
        """``before_first``: run once, just before the first line is written (a resume drops the lines past its
        checkpoint there, so a resume that stops before its first step keeps every line)."""
        self.path, self.enabled, self.tb, self.wb = path, enabled, None, None
        self.before_first = before_first
        if enabled and tensorboard:
            self.tb = _tensorboard(path.parent, config or {}, fresh)
        if enabled and wandb:
            self.wb = _wandb(path.parent, config or {}, project)

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.settle()
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        numbers = _numbers(record)
        if self.tb is not None:
            for k, v in numbers.items():
                self.tb.add_scalar(k, v, record["step"])
            self.tb.flush()
        if self.wb is not None and numbers:
            self.wb.log(numbers, step=int(record["step"]))

    def settle(self) -> None:
        """Run ``before_first`` now if no line ran it yet (once)."""
        if self.enabled and self.before_first is not None:
            pending, self.before_first = self.before_first, None
            pending()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wb is not None:
            self.wb.finish()
            self.wb = None
