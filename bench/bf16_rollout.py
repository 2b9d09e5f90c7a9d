"""Benchmark and off-policy measure of ``rollout_dtype: bfloat16`` (`mechopd.train.rollcopy`) on a real model, in ONE
process: what the bfloat16 rollout copy saves, and how far its samples are from the float32 student's own.

(a) speed: a lean decode step (`generate/lean.py`, the rollout path) at batch 4 and 16 (``--new-tokens`` steps after a
    48-token prefill of random ids), float32 student vs its bfloat16 copy, interleaved (the order alternates every
    repetition; the first repetition is a warm-up, dropped); the copy's `RolloutCopy.refresh` (the per-step cast).
(b) off-policy effect: ``--rows`` facts prompts (``--task-part``, the SmolLM2 system line on the no-context view, as
    docs/real_models.md's facts runs) sampled by the bf16 copy at the task's temperature with the trainer's sampler
    (`generate.sampler.sample`, the sampled distribution of every step recorded as the sampler drew from it); the
    float32 student then scores the same responses teacher-forced (``model(...)``, as the loss does). Per response
    token: |Δ log p| of the sampled token (mean, 95th percentile), KL(q_bf16 ‖ q_fp32) over the vocabulary, the
    importance ratio q_fp32(y) / q_bf16(y) of the sampled token (mean, standard deviation, share outside [0.8, 1.25]);
    and greedy: both models' greedy ids over ``--new-tokens`` tokens on the same prompts (share of ids equal position by
    position, share of rows identical).
(c) with ``--opd-steps K``: K OPD steps (`Trainer.train_step`, the facts task, validation part, batch 4) with
    ``rollout_dtype: same`` and ``bfloat16``, the same seed; each step's loss, KL(q_x ‖ f), rollout seconds.

    python bench/bf16_rollout.py [--model model:smollm2-135m-instruct] [--reps 3] [--rows 32] [--new-tokens 32]
                                 [--opd-steps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from mechopd.core.threads import configure  # noqa: E402

configure()  # OMP_WAIT_POLICY=PASSIVE unless set, before torch loads (as the CLI)

import torch  # noqa: E402
import train_step as ts  # noqa: E402  (quiet, _model_dir)

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def decode_times(models: dict[str, Any], batch: int, steps: int, reps: int) -> dict[str, list[float]]:
    """Seconds per lean decode step of each model at `batch`, interleaved over `reps` repetitions (+1 warm-up)."""
    from mechopd.generate.lean import LeanDecoder

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 1000, (batch, 48), generator=g)
    mask, pos = torch.ones_like(ids), torch.arange(48)[None].expand(batch, -1)
    times: dict[str, list[float]] = {k: [] for k in models}
    names = list(models)
    with torch.inference_mode():
        for r in range(reps + 1):
            for name in names if r % 2 == 0 else names[::-1]:
                dec = LeanDecoder(models[name])
                tok = dec.prefill(ids, mask, pos, steps).argmax(-1)
                t0 = time.perf_counter()
                for s in range(steps):
                    tok = dec.step(tok, torch.full((batch, 1), 48 + s)).argmax(-1)
                if r:
                    times[name].append((time.perf_counter() - t0) / steps)
    return times


def refresh_times(copy: Any, reps: int) -> list[float]:
    copy.refresh()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        copy.refresh()
        out.append(time.perf_counter() - t0)
    return out


def sampled_with_dists(model: Any, prompts: list[list[int]], st: Any, seeds: list[int]) -> tuple[list, torch.Tensor]:
    """Responses sampled by `model` (`sampler.sample`, one batch) and the log-distributions it drew each step from
    ``[rows, steps, vocab]`` (recorded inside the sampler: the sampler's own float32 softmax of the logits / T)."""
    import mechopd.generate.sampler as S

    seen: list[torch.Tensor] = []
    real = S._next_token

    def recording(logits: torch.Tensor, u: Any, temperature: float) -> torch.Tensor:
        seen.append(torch.log_softmax(logits.float() / temperature, -1))
        return real(logits, u, temperature)

    S._next_token = recording  # type: ignore[assignment]
    try:
        gen = S.sample(model, prompts, st, seeds)
    finally:
        S._next_token = real  # type: ignore[assignment]
    return gen.responses, torch.stack(seen, 1)


def scored(model: Any, prompt: list[int], reply: list[int], temperature: float) -> torch.Tensor:
    """The float32 student's log-distributions ``[len(reply), vocab]`` at each reply position, teacher-forced."""
    with torch.inference_mode():
        out = model(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(reply)]
    return torch.log_softmax(out.float() / temperature, -1)


def off_policy(fp32: Any, bf16: Any, prompts: list[list[int]], st: Any) -> dict[str, float]:
    """(b): the bf16 copy's samples scored by both; greedy agreement."""
    from mechopd.generate.sampler import sample

    seeds = list(range(1000, 1000 + len(prompts)))
    d, kl = _against_fp32(fp32, bf16, prompts, st, seeds)
    d_self, _ = _against_fp32(fp32, fp32, prompts[:4], st, seeds[:4])  # the method's own error: fp32 vs itself
    ratio = d.exp()
    greedy = st.replace(greedy=True)
    with torch.inference_mode():
        g_f = sample(fp32, prompts, greedy).responses
        g_b = sample(bf16, prompts, greedy).responses
    equal = total = 0
    for a, b in zip(g_f, g_b):
        n = max(len(a), len(b))
        equal += sum(1 for j in range(n) if j < len(a) and j < len(b) and a[j] == b[j])
        total += n
    return {
        "tokens": float(d.numel()),
        "mean_len": d.numel() / len(prompts),
        "abs_dlogp_mean": float(d.abs().mean()),
        "abs_dlogp_p95": float(d.abs().quantile(0.95)),
        "kl_mean": float(kl.mean()),
        "ratio_mean": float(ratio.mean()),
        "ratio_sd": float(ratio.std()),
        "ratio_outside": float(((ratio < 0.8) | (ratio > 1.25)).double().mean()),
        "greedy_ids_equal": equal / max(1, total),
        "greedy_rows_identical": sum(a == b for a, b in zip(g_f, g_b)) / len(prompts),
        "self_check": float(d_self.abs().max()),
    }


def _against_fp32(fp32: Any, sampler: Any, prompts: list, st: Any, seeds: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sampled token: log q_fp32(y) - log q_sampler(y), and KL(q_sampler || q_fp32) over the vocabulary."""
    with torch.inference_mode():
        responses, q_s = sampled_with_dists(sampler, prompts, st, seeds)
    dlp, kls = [], []
    for i, (p, y) in enumerate(zip(prompts, responses)):
        lq_s = q_s[i, : len(y), : st.vocab]  # [L, V] the sampler's own
        lq_f = scored(fp32, p, y, st.temperature)[:, : st.vocab]  # [L, V]
        idx = torch.tensor(y)[:, None]
        dlp.append((lq_f.gather(1, idx) - lq_s.gather(1, idx))[:, 0])
        kls.append((lq_s.exp() * (lq_s - lq_f)).sum(-1))
    return torch.cat(dlp).double(), torch.cat(kls).double()


def opd_steps(model_dir: str, steps: int, new_tokens: int, root: Path) -> dict[str, list[dict]]:
    """(c): `steps` OPD steps each way, the same seed (the same data order and row seeds)."""
    from mechopd.config import TrainConfig
    from mechopd.train.trainer import Trainer

    out = {}
    for dtype in ("same", "bfloat16"):
        cfg = TrainConfig(
            task="facts",
            task_options={"part": "validation", "k": 8},
            student=model_dir,
            method="opd",
            steps=steps,
            batch_size=4,
            lr=3e-4,
            estimator="topk",
            topk=256,
            tail=True,
            pool_size=64,
            max_new_tokens=new_tokens,
            no_context_system=SMOL_SYSTEM,
            rollout_dtype=dtype,
        )
        with Trainer(cfg, root / dtype, progress=False) as tr:
            out[dtype] = [tr.train_step() for _ in range(steps)]
    return out


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:7.1f} ms [{min(xs) * 1e3:.1f}-{max(xs) * 1e3:.1f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="model:smollm2-135m-instruct")
    ap.add_argument("--reps", type=int, default=3, help="decode repetitions per dtype and batch (after a warm-up)")
    ap.add_argument("--rows", type=int, default=32, help="facts prompts sampled for the off-policy measure")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--task-part", default="validation")
    ap.add_argument("--opd-steps", type=int, default=0, help="(c) OPD steps each way (0: skip)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    ts.quiet()
    torch.set_num_threads(args.threads)
    from mechopd.core.views import RenderSpec, render_prompt_ids
    from mechopd.generate.settings import SamplingSettings
    from mechopd.models import load_model, load_tokenizer
    from mechopd.tasks import get_task
    from mechopd.train.rollcopy import RolloutCopy

    model_dir = ts._model_dir(args.model)
    fp32, tok = load_model(model_dir).eval(), load_tokenizer(model_dir)
    copy = RolloutCopy(fp32)
    bf16 = copy.model
    n = sum(p.numel() for p in fp32.parameters())
    load = os.getloadavg()
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.model}: {n / 1e6:.1f} M parameters"
    )
    print(f"(a) lean decode step, {args.new_tokens} new tokens, median [min-max] of {args.reps} interleaved reps:")
    for b in (4, 16):
        t = decode_times({"float32": fp32, "bfloat16": bf16}, b, args.new_tokens, args.reps)
        paired = [x / y for x, y in zip(t["float32"], t["bfloat16"])]
        print(
            f"  batch {b:2d}: float32 {_med(t['float32'])}  bfloat16 {_med(t['bfloat16'])}  "
            f"float32 / bfloat16 {statistics.median(paired):.2f} (paired {[round(x, 2) for x in paired]})"
        )
    rt = refresh_times(copy, max(3, args.reps))
    print(f"  the copy's refresh after a step (cast of {4 * n / 1e6:.0f} MB into {2 * n / 1e6:.0f} MB): {_med(rt)}")

    task = get_task("facts", part=args.task_part, k=8)
    spec = RenderSpec(placement=task.placement, no_context_system=SMOL_SYSTEM)
    prompts = [render_prompt_ids(tok, e.prompt, None, spec) for e in task.examples("train", args.rows, 0)]
    st = SamplingSettings.for_model(tok, fp32, max_new_tokens=args.new_tokens, temperature=task.temperature)
    t0 = time.perf_counter()
    s = off_policy(fp32, bf16, prompts, st)
    print(
        f"(b) off-policy effect: {args.rows} facts prompts ({args.task_part}), T={st.temperature}, "
        f"{int(s['tokens'])} sampled tokens (mean length {s['mean_len']:.1f}), {time.perf_counter() - t0:.0f} s"
    )
    print(
        f"  |log q_fp32(y) - log q_bf16(y)|  mean {s['abs_dlogp_mean']:.4f}   95th percentile {s['abs_dlogp_p95']:.4f}"
    )
    print(f"  (the measure's own error, the float32 student as its own sampler: max |Δ log p| {s['self_check']:.1e})")
    print(f"  KL(q_bf16 || q_fp32) per token  mean {s['kl_mean']:.2e}")
    print(
        f"  importance ratio q_fp32/q_bf16 of y  mean {s['ratio_mean']:.4f}   sd {s['ratio_sd']:.4f}   "
        f"outside [0.8, 1.25]: {100 * s['ratio_outside']:.2f} %"
    )
    print(
        f"  greedy over {args.new_tokens} tokens: ids equal {100 * s['greedy_ids_equal']:.1f} %, rows identical "
        f"{100 * s['greedy_rows_identical']:.1f} %"
    )
    if args.opd_steps:
        with tempfile.TemporaryDirectory(prefix="mechopd-bench-bf16-") as tmp:
            recs = opd_steps(model_dir, args.opd_steps, args.new_tokens, Path(tmp))
        print(f"(c) OPD on facts (validation, k=8), batch 4, {args.opd_steps} steps each way, the same seed:")
        for dtype, rs in recs.items():
            cells = "  ".join(
                f"step {r['step']}: loss {r['loss']:.4f} KL {r['kl/teacher_student']:.4f} rollout {r['rollout_s']:.1f} s"
                f" step {r['step_s']:.1f} s"
                for r in rs
            )
            print(f"  rollout_dtype={dtype:<8} {cells}")
    load = os.getloadavg()
    print(f"load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
