"""On-policy distillation of a privileged context with TRL, then a study that probes TRL's checkpoint beside mechopd's.

    python training/trl_distill.py --study smollm2-facts --steps 8 --out /tmp/trl_run
    mechopd run /tmp/trl_run/study.yaml --out /tmp/trl_run/study

What a TRL user runs to ask "does re-adding the context hurt my student?":

* **The trainer**: TRL's `DistillationTrainer` (`trl.trainer.distillation_trainer`), the one GKD points to for
  ``lmbda=1`` (`trl.experimental.gkd` warns that a fully on-policy GKD run "is fully covered by DistillationTrainer").
  It always samples from the student (fully on-policy) and with ``beta=1.0`` its loss is the reverse KL over the full
  vocabulary on the student's tokens: mechopd's OPD.
* **The context goes to the teacher only**: `DistillationTrainer` feeds the teacher the student's own input ids (one
  ``prompt`` column for both), so it cannot give the teacher another prompt. `ContextTeacherDistillationTrainer` is
  the minimal subclass that can: a ``teacher_prompt`` column (the same question with the context, as mechopd's
  context view renders it) is tokenized beside the student's prompt, and the teacher's forward reads
  ``teacher_prompt + completion`` instead of ``prompt + completion``; generation, the loss and the update are TRL's.
  Both prompts are checked, item by item, to tokenize exactly as mechopd's two views (`mechopd.core.views`), so the
  TRL run and mechopd's OPD train on the same views of the same items.
* **Saved as TRL saves**: ``OUT/trl/checkpoint-N`` (the Trainer's checkpoint: safetensors, config, generation config,
  tokenizer, optimizer, scheduler, RNG state, trainer state) every ``--save-steps``.
* **The study** (``OUT/study.yaml``): the source study's task, items, views and student; runs ``trl: {checkpoint:
  OUT/trl/checkpoint-N}`` (evaluated and probed, never trained) and ``opd`` (mechopd's OPD with the same steps, batch,
  lr, schedule, clip, temperature and full-vocabulary reverse KL); removability on held-out items and the similarity
  and deltas probes. ``mechopd run`` writes the report.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from mechopd.config import TrainConfig
from mechopd.core.errors import ConfigError, MechopdError
from mechopd.core.views import RenderSpec, _messages, render_prompt_ids
from mechopd.pipeline.spec import STUDIES_DIR, StudySpec

try:  # the `bench` extra
    from trl import DistillationConfig, DistillationTrainer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise SystemExit(f"error: {e}; training/trl_distill.py needs TRL: pip install 'mechopd[bench]'") from None


class ContextTeacherDistillationTrainer(DistillationTrainer):
    """`DistillationTrainer` whose teacher reads ``teacher_prompt + completion`` (the privileged context's view) while
    the student generates from and is trained on ``prompt + completion``. Completions are right-padded after a
    left-padded prompt in both, so the last ``len(completion)`` positions line up; everything else is TRL's."""

    _teacher_inputs: tuple[Any, Any] | None = None

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        import torch
        from trl.trainer.utils import pad

        out = super()._generate_and_score_completions(inputs)
        ids, _, _ = self._tokenize_prompts([x["teacher_prompt"] for x in inputs])
        rows = [torch.tensor(r) for r in ids]
        dev, multiple = out["prompt_ids"].device, self.pad_to_multiple_of
        pad_id = self._tokenizer.pad_token_id
        out["teacher_prompt_ids"] = pad(rows, pad_id, padding_side="left", pad_to_multiple_of=multiple).to(dev)
        masks = [torch.ones_like(r) for r in rows]
        out["teacher_prompt_mask"] = pad(masks, 0, padding_side="left", pad_to_multiple_of=multiple).to(dev)
        return out

    def _compute_loss(self, unwrapped_student: Any, inputs: dict[str, Any], num_items_in_batch: Any) -> Any:
        import torch

        ids = torch.cat([inputs["teacher_prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["teacher_prompt_mask"], inputs["completion_mask"]], dim=1)
        self._teacher_inputs = (ids, mask)
        try:
            return super()._compute_loss(unwrapped_student, inputs, num_items_in_batch)
        finally:
            self._teacher_inputs = None

    def _get_last_hidden_state(self, unwrapped_model, input_ids, attention_mask, logits_to_keep, **kw):
        if self._teacher_inputs is not None and unwrapped_model is self.accelerator.unwrap_model(self.teacher_model):
            input_ids, attention_mask = self._teacher_inputs  # the teacher: its own prompt, the same completion
        return super()._get_last_hidden_state(unwrapped_model, input_ids, attention_mask, logits_to_keep, **kw)


def load_study(study: str) -> tuple[StudySpec, Path]:
    """A study file, or the name of a built-in study (``mechopd/data/studies/NAME.yaml``)."""
    path = Path(study)
    if not path.is_file():
        path = STUDIES_DIR / f"{study}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in STUDIES_DIR.glob("*.yaml")))
        raise ConfigError(f"--study {study}: no such file and no built-in study of that name ({known})")
    return StudySpec.load(path), path


def settings(study: StudySpec, args: argparse.Namespace) -> dict[str, Any]:
    """The shared training settings: the flags, else the study's ``train`` section, else `TrainConfig`'s defaults."""
    own = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr}
    names = ("steps", "batch_size", "lr", "lr_schedule", "warmup", "grad_clip", "weight_decay", "pool_size")
    out = {k: own.get(k) if own.get(k) is not None else study.train.get(k, getattr(TrainConfig, k)) for k in names}
    if out["lr_schedule"] not in ("constant", "linear", "cosine"):
        raise ConfigError(f"train.lr_schedule {out['lr_schedule']!r}: TRL takes constant, linear or cosine")
    return out


def dataset(study: StudySpec, tok: Any, pool_size: int, seed: int) -> tuple[Any, RenderSpec, int]:
    """The study's training items as TRL prompts: ``prompt`` (the no-context view), ``teacher_prompt`` (with the
    context), both chat messages as mechopd's views render them. Returns the dataset, the render spec and the task's
    response length."""
    from datasets import Dataset

    from mechopd.tasks.base import get_task

    task = get_task(study.task, **study.task_options)
    spec = RenderSpec(**{"placement": task.placement, **study.render})
    items = task.examples("train", pool_size, seed)
    rows = [
        {"prompt": _messages(ex.prompt, None, spec), "teacher_prompt": _messages(ex.prompt, ex.context, spec)}
        for ex in items
    ]
    return Dataset.from_list(rows), spec, study.train.get("max_new_tokens") or task.max_new_tokens


def check_views(trainer: ContextTeacherDistillationTrainer, data: Any, study: StudySpec, spec: RenderSpec) -> None:
    """TRL's tokenization of both prompts must be mechopd's no-context and context views, id for id."""
    from mechopd.tasks.base import get_task

    task = get_task(study.task, **study.task_options)
    items = task.examples("train", len(data), trainer.args.seed)
    tok = trainer.processing_class
    for key, context in (("prompt", lambda ex: None), ("teacher_prompt", lambda ex: ex.context)):
        trl_ids, _, _ = trainer._tokenize_prompts(list(data[key]))
        ours = [render_prompt_ids(tok, ex.prompt, context(ex), spec) for ex in items]
        if [list(x) for x in trl_ids] != ours:
            raise SystemExit(f"error: TRL's {key} ids differ from mechopd's view of the same items; not comparable")


def trl_config(out: Path, s: dict[str, Any], new_tokens: int, save_steps: int, seed: int) -> Any:
    """TRL's config of the run: fully on-policy reverse KL (``beta=1.0``), the study's optimizer settings, fp32 on
    the CPU (or the accelerator TRL finds), a checkpoint every ``save_steps``."""
    import torch

    return DistillationConfig(
        output_dir=str(out / "trl"),
        max_steps=s["steps"],
        per_device_train_batch_size=s["batch_size"],
        gradient_accumulation_steps=1,
        learning_rate=s["lr"],
        lr_scheduler_type=s["lr_schedule"],  # constant | linear | cosine: the same names in TRL
        warmup_steps=s["warmup"],
        max_grad_norm=s["grad_clip"],
        weight_decay=s["weight_decay"],
        optim="adamw_torch",
        beta=1.0,
        temperature=1.0,
        max_completion_length=new_tokens,
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        fp16=False,
        save_strategy="steps",
        save_steps=save_steps,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        model_init_kwargs={"dtype": "float32"},
        teacher_model_init_kwargs={"dtype": "float32"},
        seed=seed,
    )


def make_trainer(
    study: StudySpec, out: Path, s: dict[str, Any], save_steps: int, seed: int
) -> ContextTeacherDistillationTrainer:
    """The trainer on the study's items, its two prompts checked against mechopd's views."""
    from transformers import AutoTokenizer

    from mechopd.models.fetch import resolve_fetched

    student = resolve_fetched(study.student)
    teacher = resolve_fetched(study.teacher) if study.teacher else student  # null: self-distillation
    tok = AutoTokenizer.from_pretrained(student, padding_side="left")
    data, spec, new_tokens = dataset(study, tok, s["pool_size"], seed)
    args = trl_config(out, s, new_tokens, save_steps, seed)
    trainer = ContextTeacherDistillationTrainer(
        model=student, teacher_model=teacher, args=args, train_dataset=data, processing_class=tok
    )
    check_views(trainer, data, study, spec)
    return trainer


def distill(study: StudySpec, out: Path, s: dict[str, Any], save_steps: int, seed: int) -> Path:
    """The TRL run; returns its last checkpoint directory (``OUT/trl/checkpoint-N``)."""
    trainer = make_trainer(study, out, s, save_steps, seed)
    trainer.train()
    last = out / "trl" / f"checkpoint-{trainer.state.global_step}"
    if not (last / "model.safetensors").is_file():
        raise ConfigError(f"TRL wrote no checkpoint at {last}; pass a --save-steps that divides --steps")
    return last


def write_study(study: StudySpec, source: Path, checkpoint: Path, out: Path, s: dict[str, Any]) -> Path:
    """``OUT/study.yaml``: the source study's task, student and views; runs ``trl`` (the checkpoint) and ``opd``
    (mechopd's OPD with the TRL run's settings and full-vocabulary reverse KL); removability and two probes."""
    keep = {k: s[k] for k in ("steps", "batch_size", "lr", "lr_schedule", "warmup", "grad_clip", "weight_decay")}
    doc = {
        "task": study.task,
        "task_options": study.task_options,
        "render": study.render,
        "student": study.student,
        "teacher": study.teacher,
        "seeds": study.seeds[:1],
        "train": {**keep, "pool_size": s["pool_size"], "estimator": "full", "temperature": 1.0, "eval_every": 0},
        "runs": {"opd": {"method": "opd"}, "trl": {"checkpoint": str(checkpoint.resolve())}},
        "eval": {**study.eval, "other_contexts": False},
        "probe_n": study.probe_n or 8,
        "probes": {
            "similarity": {"models": ["base", "opd", "trl"]},
            "deltas": {"models": ["opd", "trl"], "pair": "opd,trl"},
        },
    }
    path = out / "study.yaml"
    head = f"# Written by training/trl_distill.py from {source}: TRL's checkpoint beside mechopd's OPD.\n"
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False))
    StudySpec.load(path)  # checked as `mechopd run` will read it
    return path


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", default="smollm2-facts", help="a study file or built-in study: task, student, views")
    p.add_argument("--out", type=Path, required=True, help="OUT/trl (TRL's checkpoints) and OUT/study.yaml")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the study's train.steps)")
    p.add_argument("--batch-size", type=int, default=None, help="prompts per step (default: the study's)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the study's)")
    p.add_argument("--save-steps", type=int, default=None, help="checkpoint every N steps (default: the last only)")
    p.add_argument("--seed", type=int, default=None, help="the items' and TRL's seed (default: the study's first)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        study, source = load_study(args.study)
        s = settings(study, args)
        for name in ("steps", "batch_size", "save_steps"):
            value = getattr(args, name) if name != "steps" else s["steps"]
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {value}: must be >= 1")
        seed = study.seeds[0] if args.seed is None else args.seed
        args.out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        checkpoint = distill(study, args.out, s, args.save_steps or s["steps"], seed)
        seconds = time.perf_counter() - t0
        path = write_study(study, source, checkpoint, args.out, s)
    except MechopdError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    record = {"checkpoint": str(checkpoint), "seconds": round(seconds, 1), "settings": s, "study": str(path)}
    (args.out / "trl_run.json").write_text(json.dumps(record, indent=2))
    print(f"TRL checkpoint: {checkpoint} ({seconds:.0f} s)\nnext: mechopd run {path} --out {args.out / 'study'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
