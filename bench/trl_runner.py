"""TRL's SDFTTrainer on bench/train_step.py's work, as that script configures it (see its docstring for every
setting); bench/long_context.py reuses it on the long-context task."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def sdft_config(out_root: Path, args) -> Any:
    """The SDFTConfig of the comparison (bench/train_step.py's docstring): frozen base teacher, context before the
    prompt, full-vocab reverse KL, one generation per prompt, fp32 on CPU, constant lr, clip 1.0, no logging or
    saving; `max_steps` is set by `TRLRunner.run`."""
    from trl.experimental.sdft import SDFTConfig

    return SDFTConfig(
        output_dir=str(out_root / "trl"),
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        num_generations=1,
        max_completion_length=args.new_tokens,
        temperature=1.0,
        distillation_mode="full_logits",
        distillation_alpha=1.0,
        teacher_model_kind="base",
        teacher_prompt_template="{privileged_context}\n\n{prompt}",
        generate_from_teacher=False,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        activation_checkpointing=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        seed=args.seed,
        max_steps=1,
    )


class TRLRunner:
    """SDFTTrainer on the same work. `run(n, between)` runs n+1 TRL steps in ONE `train()` call and calls
    `between(j)` from the `on_step_end` callback after TRL step j (the other variants' steps run there, so every
    variant is interleaved step by step); TRL step j+1 is timed from the callback's exit to the next callback's entry
    (data fetch, generation, loss, backward, clip, optimizer, scheduler and the Trainer's own bookkeeping)."""

    def __init__(self, path: Path, out_root: Path, args):
        from datasets import Dataset
        from transformers import AutoTokenizer, TrainerCallback
        from transformers.trainer_callback import PrinterCallback
        from trl.experimental.sdft import SDFTTrainer

        from mechopd.tasks.base import get_task

        items = get_task("rules").examples("train", args.pool, args.seed)
        data = Dataset.from_list(
            [{"prompt": [{"role": "user", "content": ex.prompt}], "privileged_context": ex.context} for ex in items]
        )
        self.times: list[float] = []
        self.lens: list[float] = []
        self.between: Callable[[int], None] = lambda j: None
        self.resumed: float | None = None
        runner = self

        class Clock(TrainerCallback):
            def on_step_end(self, a, state, control, **kw):
                now = time.perf_counter()
                if runner.resumed is not None:
                    runner.times.append(now - runner.resumed)
                    lens = runner.trainer._metrics["train"]["completions/mean_length"]
                    runner.lens.append(lens[-1] if lens else float("nan"))
                runner.between(state.global_step - 1)
                runner.resumed = time.perf_counter()

        self.no_context_system = getattr(args, "no_context_system", None)  # a real template's default (real_model.py)
        self.config = sdft_config(out_root, args)
        tok = AutoTokenizer.from_pretrained(path)
        self.trainer = SDFTTrainer(
            model=str(path), args=self.config, train_dataset=data, processing_class=tok, callbacks=[Clock()]
        )
        self.trainer.remove_callback(PrinterCallback)  # disable_tqdm=True would print the end-of-train() summary
        self._check_same_views(items[:4], tok)

    def _check_same_views(self, items: list, tok: Any) -> None:
        """TRL's teacher prompt must tokenize exactly as mechopd's context view ("user" placement)."""
        from mechopd.core.views import RenderSpec, render_prompt_ids

        b = self.trainer.teacher_context_builder
        trl_ids = self.trainer._tokenize_prompts(
            [b._compose_teacher_prompt([{"role": "user", "content": ex.prompt}], ex.context) for ex in items]
        )
        spec = RenderSpec("user", no_context_system=getattr(self, "no_context_system", None))
        ours = [render_prompt_ids(tok, ex.prompt, ex.context, spec) for ex in items]
        if [list(x) for x in trl_ids] != ours:
            raise SystemExit("TRL's teacher prompt ids differ from mechopd's context view; the comparison is off")

    def settings(self) -> str:
        """What TRL actually ran with (read back from the trainer after the run)."""
        t, opt = self.trainer, self.trainer.optimizer
        inner = getattr(opt, "optimizer", opt)
        old_logp = t.args.gradient_accumulation_steps % (t.args.steps_per_generation * t.num_iterations) != 0
        return (
            f"TRL {__import__('trl').__version__}: student {t.model.dtype}, teacher {t.teacher_model.dtype}, "
            f"activation_checkpointing {t.args.activation_checkpointing}, bf16 {t.args.bf16}, "
            f"optimizer {type(inner).__name__}(fused={inner.defaults.get('fused')}, "
            f"foreach={inner.defaults.get('foreach')}), do_sample {t.generation_config.do_sample}, "
            f"max_new_tokens {t.generation_config.max_new_tokens}, num_generations {t.num_generations}, "
            f"old-logp forward {old_logp}"
        )

    def run(self, n: int, between: Callable[[int], None]) -> tuple[list[float], list[float]]:
        self.times, self.lens, self.between, self.resumed = [], [], between, None
        self.trainer.args.max_steps = n + 1
        self.trainer.train()
        return self.times, self.lens


# ---------------------------------------------------------------------------------------------------------------------
# Interleaved measurement and report
# ---------------------------------------------------------------------------------------------------------------------
