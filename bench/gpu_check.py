"""GPU check: what the CPU suite cannot exercise, in one script. Prints one table; exits 0 when there is no GPU.

The CPU suite runs every verb on tiny float32 models of the three families (tests/realpath). A GPU run still has to
check, on the hardware and at the scale the papers use:

  bf16 train OPD / NCA   two optimizer steps of each method in bfloat16 on CUDA (finite losses, weights moved), also
                         NCA with a LoRA student (rank 16), an EMA teacher and a LoRA student with a live teacher:
                         peak CUDA memory, trainable share and tokens/s per stage (`train.profile`) printed
  fused loss head        `objectives.head` at V = 151936, N = 1024, d = 2048: loss and gradient vs the plain reference,
                         its time over a bare LM-head matmul forward + backward, its peak memory over the reference's;
                         its top-k (tail) and sampled estimators with NCA against the logits path's `total_loss`
  train step loss_head   one bf16 NCA step with loss_head fused vs logits (full and LoRA rank-16 student): step-1 loss
                         agreement, loss-stage and step seconds, peak CUDA memory
  lean vs generate       the lean KV-cache decoder against ``model.generate`` (greedy, bf16): share of identical
                         responses and the first diverging token (bf16 rounding can split near-ties; both are reported)
  NCCL two-process       ``torchrun --nproc_per_node 2`` train == one process at the same global batch (max |Δθ|),
                         when 2+ GPUs are visible
  real checkpoint eval   a real 1-4B checkpoint evaluated in both views (Acc_x, Acc_xc, Harm) on the JSONL task
  paper-size step        (a real checkpoint only) one NCA step at batch 16 x 512 new tokens with the paper recipes'
                         memory settings (micro_batch_size 2, logit_chunk 128, gradient_checkpointing, bf16): finite,
                         its peak CUDA memory and time; and at batch 4 x 64 the same settings against the one-shot step
                         (step-1 loss within 1e-2 relative in bf16)

    python bench/gpu_check.py CHECKPOINT_DIR [--teacher DIR] [--data data.jsonl --context ctx.txt] [--n 32]
    python bench/gpu_check.py --device cpu --n 4      # smoke-test the script itself on the zoo fixture (no GPU)

CHECKPOINT_DIR: a local Hugging Face checkpoint (Qwen3 / Qwen2.5 / Llama-3, 1-4B). Without it, the zoo's tiny qwen3
fixture stands in (the mechanics run, the real-checkpoint row says so). Data: defaults to the zoo's MedMCQA-layout
JSONL and its ~512-token context. A template that inserts a default system prompt gets ``no_context_system: ""``.
The two fused-loss-head checks live in bench/gpu_checks_head.py (they return their rows; this script prints them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_checks_head import check_head_estimators, check_loss_head  # noqa: E402  (bench/gpu_checks_head.py)

ROWS: list[tuple[str, str, str, float]] = []


def row(name: str, ok: bool | None, value: str, seconds: float) -> None:
    ROWS.append((name, "skip" if ok is None else ("PASS" if ok else "FAIL"), value, seconds))


def no_context_system(path: str) -> str | None:
    """None when the template renders no system block by itself, else "" (explicit empty system message)."""
    from mechopd.core.errors import TaskError
    from mechopd.core.views import RenderSpec, render_prompt_text
    from mechopd.models import load_tokenizer

    try:
        render_prompt_text(load_tokenizer(path), "q", None, RenderSpec())
        return None
    except TaskError:
        return ""


def train_cfg(args, method: str, steps: int = 2) -> dict:
    from mechopd.tasks.base import get_task

    pool = min(64, get_task("jsonl", path=args.data, context_file=args.context).split_sizes()["train"])
    return {
        "task": "jsonl",
        "task_options": {"path": args.data, "context_file": args.context, "max_new_tokens": 64},
        "student": args.model,
        "teacher": args.teacher,
        "method": method,
        "steps": steps,
        "batch_size": 8,
        "pool_size": pool,
        "lr": 5e-6,
        "dtype": "bfloat16",
        "device": args.device,
        "seed": 0,
        "no_context_system": no_context_system(args.model),
    }


def check_train(args, method: str, out: Path, label: str = "", **extra) -> None:
    """Two bf16 steps of `method` (+ `extra` config: LoRA, teacher modes): finite losses, weights moved; the peak
    CUDA memory, the trainable share and the step's tokens/s per stage are printed."""
    from mechopd.models import load_model
    from mechopd.train.trainer import train

    t0, name = time.time(), f"{method}{label}"
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    final = train({**train_cfg(args, method), **extra}, out / name, progress=False)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    recs = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in recs if "loss" in r]
    a, b = load_model(args.model), load_model(final)
    moved = any(not torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    ok = len(losses) == 2 and all(torch.isfinite(torch.tensor(losses))) and moved
    stages = " ".join(f"{k.split('/')[1]} {v:.0f}" for k, v in recs[-1].items() if k.startswith("tokens_per_s/") and v)
    row(
        f"bf16 train {name}",
        ok,
        f"losses {', '.join(f'{x:.4f}' for x in losses)}; moved={moved}; peak {peak:.2f} "
        f"GiB; trainable {recs[-1].get('trainable_share', 1.0):.4f}; tok/s {stages}",
        time.time() - t0,
    )


def check_step_heads(args, out: Path) -> None:
    """One bf16 NCA step (top-k) of the trainer with loss_head fused vs logits, same seed: step-1 loss agreement, the
    step's time and peak CUDA memory (fused over logits); on a LoRA student too."""
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import Trainer

    for label, extra in (("", {}), (" lora16", {"lora_rank": 16})):
        t0, recs = time.time(), {}
        for i, head in enumerate(("logits", "fused", "logits", "fused")):  # the 2nd pair is kept (warm allocator)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            cfg = TrainConfig(**{**train_cfg(args, "nca", steps=1), "loss_head": head, **extra})
            rec = Trainer(cfg, out / f"head-{head}{label.strip()}-{i}", progress=False).train_step()
            peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
            recs[head] = {**rec, "peak": peak}
        a, b = recs["logits"], recs["fused"]
        rel = abs(b["loss"] - a["loss"]) / max(abs(a["loss"]), 1e-12)
        row(
            f"train step loss_head fused{label}",
            rel < 1e-2,
            f"loss {b['loss']:.5f} vs {a['loss']:.5f} (rel "
            f"{rel:.1e}); loss stage {b['time/loss']:.3f} vs {a['time/loss']:.3f} s, step {b['step_s']:.2f} vs "
            f"{a['step_s']:.2f} s; peak {b['peak']:.2f} vs {a['peak']:.2f} GiB",
            time.time() - t0,
        )


PAPER_MEMORY = {"micro_batch_size": 2, "logit_chunk": 128, "gradient_checkpointing": True}


def check_paper_step(args, real: bool, out: Path) -> None:
    """The paper-size step (module docstring); skipped on the zoo fixture (its 640-row head is not the point)."""
    if not real or args.device != "cuda":
        row("paper-size step", None, "needs a real checkpoint on CUDA", 0.0)
        return
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import Trainer

    def one_step(name: str, batch: int, new: int, extra: dict) -> dict:
        cfg = {**train_cfg(args, "nca", steps=1), "batch_size": batch, **extra}
        cfg["task_options"] = {**cfg["task_options"], "max_new_tokens": new}
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        rec = Trainer(TrainConfig(**cfg), out / name, progress=False).train_step()
        return {**rec, "peak": torch.cuda.max_memory_allocated() / 2**30}

    t0 = time.time()
    big = one_step("paper", 16, 512, PAPER_MEMORY)
    ok = bool(torch.isfinite(torch.tensor(big["loss"])))
    row(
        "paper-size step",
        ok,
        f"NCA 16 x 512 (mean len {big['response_len']:.0f}): loss {big['loss']:.4f}, peak "
        f"{big['peak']:.1f} GiB, step {big['step_s']:.1f} s",
        time.time() - t0,
    )
    t0 = time.time()
    ref, got = one_step("oneshot", 4, 64, {}), one_step("saving", 4, 64, PAPER_MEMORY)
    rel = abs(got["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-12)
    row(
        "paper settings == one-shot",
        rel <= 1e-2,
        f"4 x 64: loss {got['loss']:.6f} vs {ref['loss']:.6f} (rel "
        f"{rel:.1e}); peak {got['peak']:.1f} vs {ref['peak']:.1f} GiB",
        time.time() - t0,
    )


def check_lean_vs_generate(args) -> None:
    from mechopd.core.views import RenderSpec, render_prompt_ids
    from mechopd.generate.sampler import sample
    from mechopd.generate.settings import SamplingSettings
    from mechopd.models import load_model, load_tokenizer
    from mechopd.tasks.base import get_task

    t0 = time.time()
    tok, model = load_tokenizer(args.model), load_model(args.model, dtype=torch.bfloat16, device=args.device)
    task = get_task("jsonl", path=args.data, context_file=args.context)
    spec = RenderSpec("system", no_context_system(args.model))
    exs = task.examples("test", min(16, args.n), 0)
    ids = [render_prompt_ids(tok, e.prompt, e.context if i % 2 else None, spec) for i, e in enumerate(exs)]
    settings = SamplingSettings.for_model(tok, model, max_new_tokens=64, greedy=True)
    stop = list(settings.stop)
    lean = sample(model, ids, settings).responses
    same, first = 0, []  # first: index of the first differing token, per diverging response
    for p, r in zip(ids, lean):
        out = model.generate(
            torch.tensor([p], device=args.device),
            max_new_tokens=64,
            do_sample=False,
            eos_token_id=stop,
            pad_token_id=tok.pad_token_id,
        )[0, len(p) :].tolist()
        ref = out[: next((i + 1 for i, t in enumerate(out) if t in stop), len(out))]
        mine = r[: next((i + 1 for i, t in enumerate(r) if t in stop), len(r))]
        same += int(ref == mine)
        if ref != mine:
            first.append(next((i for i, (x, y) in enumerate(zip(ref, mine)) if x != y), min(len(ref), len(mine))))
    where = f"; earliest divergence at token {min(first)}" if first else ""
    row("lean vs generate (bf16)", same >= 0.75 * len(ids), f"{same}/{len(ids)} identical{where}", time.time() - t0)


def check_nccl(args, out: Path) -> None:
    label = "NCCL two-process" if args.device == "cuda" else "two-process (gloo smoke)"
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        row(label, None, f"{torch.cuda.device_count()} GPU visible (needs 2)", 0.0)
        return
    from mechopd.models import load_model
    from mechopd.train.trainer import train

    t0 = time.time()
    cfg = train_cfg(args, "nca")
    one = train(cfg, out / "one", progress=False)
    yaml_path = out / "two.yaml"
    import yaml

    yaml_path.write_text(yaml.safe_dump({**cfg, "device": "auto" if args.device == "cuda" else args.device}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "-m",
            "mechopd.cli",
            "train",
            str(yaml_path),
            "--out",
            str(out / "two"),
            "--no-progress",
        ],
        env=env,
    ).returncode
    if rc != 0:
        row(label, False, f"torchrun exited {rc}", time.time() - t0)
        return
    a, b = load_model(one), load_model(out / "two" / "final")
    with torch.no_grad():
        diff = max(float((p.float() - q.float()).abs().max()) for p, q in zip(a.parameters(), b.parameters()))
    row(label, diff < 1e-2, f"max |θ_1proc − θ_2proc| = {diff:.2e} (bf16)", time.time() - t0)


def check_eval(args, real: bool) -> None:
    from mechopd.core.views import RenderSpec
    from mechopd.evaluation.evaluate import EvalConfig, evaluate_model
    from mechopd.models import load_model, load_tokenizer
    from mechopd.tasks.base import get_task

    t0 = time.time()
    task = get_task("jsonl", path=args.data, context_file=args.context, max_new_tokens=256)
    model = load_model(args.model, dtype=torch.bfloat16, device=args.device)
    rep = evaluate_model(
        model,
        load_tokenizer(args.model),
        task,
        EvalConfig(n=args.n, n_boot=200),
        RenderSpec("system", no_context_system(args.model)),
    )
    s = rep["summary"]
    value = (
        f"Acc_x {s['acc_x']['value']:.3f}, Acc_xc {s['acc_xc']['value']:.3f}, Harm {s['harm']['value']}, "
        f"unparseable {s['unparseable_x']}/{s['unparseable_xc']} (n={s['n']})"
    )
    row(
        "real checkpoint eval" if real else "eval (zoo fixture, not a real checkpoint)",
        True if real else None,
        value,
        time.time() - t0,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", default=None, help="local checkpoint dir (default: the zoo's qwen3 fixture)")
    p.add_argument("--teacher", default=None, help="teacher checkpoint (default: self-distillation)")
    p.add_argument("--data", default=None, help="MedMCQA-layout JSONL (default: the zoo's)")
    p.add_argument("--context", default=None, help="context file (default: the zoo's ~512-token context)")
    p.add_argument("--n", type=int, default=32, help="held-out items for the eval check")
    p.add_argument("--device", default="cuda", help="cuda (default); 'cpu' smoke-tests this script itself")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible; nothing to check here (the CPU suite, tests/realpath, covers the rest)")
        return 0
    from mechopd.testing.zoo import build_zoo

    zoo = build_zoo()
    real = args.model is not None
    if real and not Path(args.model, "config.json").exists():
        print(f"gpu_check: {args.model} is not a local checkpoint (no config.json); pass a save_pretrained directory")
        return 2
    args.model = args.model or str(zoo.student("qwen3"))
    args.data, args.context = args.data or str(zoo.data), args.context or str(zoo.context_file)
    where = f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}" if args.device == "cuda" else args.device
    print(f"gpu_check on {where}: model {args.model}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for name, fn in (
            ("bf16 train opd", lambda: check_train(args, "opd", out)),
            ("bf16 train nca", lambda: check_train(args, "nca", out)),
            ("bf16 train nca lora", lambda: check_train(args, "nca", out, "-lora16", lora_rank=16)),
            ("bf16 train nca ema", lambda: check_train(args, "nca", out, "-ema", teacher_mode="ema")),
            (
                "bf16 train nca lora live",
                lambda: check_train(args, "nca", out, "-lora-live", lora_rank=16, teacher_mode="live"),
            ),
            ("fused loss head", lambda: row(*check_loss_head(args))),
            ("fused head estimators", lambda: row(*check_head_estimators(args))),
            ("train step loss_head", lambda: check_step_heads(args, out)),
            ("lean vs generate (bf16)", lambda: check_lean_vs_generate(args)),
            ("NCCL two-process", lambda: check_nccl(args, out)),
            ("eval", lambda: check_eval(args, real)),
            ("paper-size step", lambda: check_paper_step(args, real, out)),
        ):
            try:
                fn()
            except Exception as e:  # a check that crashes is a FAIL row, the others still run
                row(name, False, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}", 0.0)
    width = max(len(r[0]) for r in ROWS)
    print(f"\n{'check':<{width}}  status  seconds  value")
    for name, status, value, sec in ROWS:
        print(f"{name:<{width}}  {status:<6}  {sec:7.1f}  {value}")
    return 1 if any(r[1] == "FAIL" for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
