"""Benchmark: each stage of a real-model OPD step and of `mechopd eval` beside its hardware floor, measured in ONE run.

Floors (measured in this process, next to every stage: the median of the measurements taken before each repetition):
  copy GB/s     ``dst.copy_(src)`` of 256 MiB float32, counted as bytes read + bytes written over the seconds; a
                stage that must read B bytes cannot take less than B / copy GB/s (the weights of a decode step).
  GEMM GFLOP/s  float32 ``[1024, d] @ [d, 4d]`` (d = the model's hidden size: its MLP's shape) at the thread count used;
                a stage of F floating-point operations cannot take less than F / GEMM GFLOP/s.
Stages and their floors (N = parameters, 4N bytes in float32; T = tokens the stage computes):
  decode step   `generate/lean.py` at batch B (greedy, the rollout path): max(4N / copy, 2 N B / GEMM); the large
                projections on MKL (``F.linear``, before issue 58's layout) and on oneDNN laid out
                (`generate/layout.py`, as now), interleaved; the layout's copy per sampling call apart and amortised
                over the tokens; greedy ids of both and of ``model.generate`` compared.
  OPD step      `Trainer.train_step` (bench/train_step.py's `make_trainer_step`: the rules task, user placement, the
                model's stop ids' head rows zeroed by bench/real_model.py so every response has --new-tokens): its
                `train.profile` stages; rollout = new tokens x the decode floor + the prefill's 2 N T / GEMM;
                teacher 2 N T_c / GEMM (T_c: context-view tokens, the shared prefix once); student forward 2 N T_x /
                GEMM, backward 4 N T_x / GEMM; optimizer (clip + guard + AdamW: 11 passes of 4N bytes) / copy.
  optimizer     AdamW + clip + the weight guard on the model's parameter shapes, ``adamw: default`` and ``fused``.
  eval          `mechopd.run_eval` on the smollm2 study's 54 held-out items (both views + other contexts, greedy, 24
                tokens), its decode calls as planned (`groups.group_prompts`): Σ prefill 2 N T / GEMM + Σ per call
                steps x max(4N / copy, 2 N rows / GEMM); with --eval-ab also the grouping charged its forward only
                (the plan before issue 58), with --layout-ab also every projection on MKL (before the layout),
                interleaved, each compared with the evaluation as it runs now (metrics and records identical?).
With --trl, OPD and TRL 1.16 steps run interleaved through bench/train_step.py's `run_interleaved` / `TRLRunner`
(the same configuration as ``bench/train_step.py --model``; nothing re-implemented here) and the paired ratio printed.

    python bench/floors.py [--model model:smollm2-135m-instruct] [--batch 4] [--new-tokens 24] [--steps 3]
                           [--reps 3] [--threads 1] [--eval-ab] [--layout-ab] [--trl] [--skip-eval] [--skip-step]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from mechopd.core.threads import configure  # noqa: E402

configure()  # OMP_WAIT_POLICY=PASSIVE unless set, before torch loads (as the CLI)

import torch  # noqa: E402
import train_step as ts  # noqa: E402  (make_trainer_step, quiet, run_interleaved, _model_dir, _ratio_line)

DATA = Path(__file__).resolve().parents[1] / "mechopd" / "data"


def copy_gbs(mb: int = 256) -> float:
    src = torch.ones(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_time(lambda: dst.copy_(src)) for _ in range(3))
    return 2 * src.numel() * 4 / best / 1e9


def gemm_gflops(d: int) -> float:
    a, b = torch.randn(1024, d), torch.randn(d, 4 * d)
    a @ b
    best = min(_time(lambda: a @ b) for _ in range(3))
    return 2 * 1024 * d * 4 * d / best / 1e9


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Floors:
    """Copy GB/s and GEMM GFLOP/s, measured again each time `take` is called; medians over every take."""

    def __init__(self, d: int):
        self.d, self.copy, self.gemm, self.since = d, [], [], 0

    def mark(self) -> None:
        """A stage starts: its floors are the medians of the takes from here on (the load of its own minutes)."""
        self.since = len(self.copy)

    def take(self) -> None:
        self.copy.append(copy_gbs())
        self.gemm.append(gemm_gflops(self.d))

    def gbs(self) -> float:
        return statistics.median(self.copy[self.since :] or self.copy)

    def gflops(self) -> float:
        return statistics.median(self.gemm[self.since :] or self.gemm)

    def line(self) -> str:
        return (
            f"copy {self.gbs():.1f} GB/s [{min(self.copy):.1f}-{max(self.copy):.1f}], GEMM {self.gflops():.1f} "
            f"GFLOP/s [{min(self.gemm):.1f}-{max(self.gemm):.1f}] ({len(self.copy)} takes)"
        )


def row(stage: str, seconds: list[float], floor_s: float) -> None:
    med = statistics.median(seconds)
    spread = f"[{min(seconds):.3f}-{max(seconds):.3f}]"
    print(f"  {stage:<40} {med:9.3f} s {spread:>17}   floor {floor_s:8.3f} s   x{med / floor_s:6.2f}")


@contextlib.contextmanager
def on_kernels(kind: str) -> Any:
    """The lean decoder's large projections as issue 58 found them ("mkl": ``F.linear`` for every weight) or as now
    ("onednn": `generate/layout.py`, the weights' own layout; "laid out": inside a `layout.laid_out` block)."""
    from mechopd.generate import layout

    old = layout.MIN_ELEMENTS
    layout.MIN_ELEMENTS = 1 << 62 if kind == "mkl" else old
    try:
        yield
    finally:
        layout.MIN_ELEMENTS = old


def decode_stage(model: Any, fl: Floors, batch: int, steps: int, reps: int) -> None:
    """Decode steps through `generate/lean.py`, the projections on MKL (before) and oneDNN laid out (now),
    interleaved; the layout's one copy per sampling call printed apart (and amortised over `steps` tokens); greedy
    ids and logits of the two compared, and the laid-out path's ids against ``model.generate``."""
    from mechopd.generate import layout
    from mechopd.generate.lean import LeanDecoder, projections

    n = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 1000, (batch, 48), generator=g)
    mask, pos = torch.ones_like(ids), torch.arange(48)[None].expand(batch, -1)
    kinds = ("mkl", "laid out")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    copies: list[float] = []
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    fl.mark()
    with torch.inference_mode():
        for r in range(reps + 1):
            fl.take()
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                with on_kernels(kind), contextlib.ExitStack() as stack:
                    t0 = time.perf_counter()
                    if kind == "laid out":
                        stack.enter_context(layout.laid_out(projections(model)))
                        if r:
                            copies.append(time.perf_counter() - t0)
                    dec = LeanDecoder(model)
                    logits = dec.prefill(ids, mask, pos, steps)
                    toks, logs = [logits.argmax(-1)], []
                    t0 = time.perf_counter()
                    for s in range(steps):
                        logits = dec.step(toks[-1], torch.full((batch, 1), 48 + s))
                        toks.append(logits.argmax(-1))
                        logs.append(logits)
                    if r:
                        times[kind].append((time.perf_counter() - t0) / steps)
                    out[kind] = (torch.stack(toks, 1), torch.stack(logs, 1))
        ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps + 1, do_sample=False)[:, 48:]
    stop = set(torch.as_tensor(model.generation_config.eos_token_id).view(-1).tolist())
    cut = [next((i + 1 for i, t in enumerate(r) if t in stop), len(r)) for r in ref.tolist()]  # generate stops at EOS
    floor = max(4 * n / (fl.gbs() * 1e9), 2 * n * batch / (fl.gflops() * 1e9))
    row(f"decode step, batch {batch}, MKL (before)", times["mkl"], floor)
    row(f"decode step, batch {batch}, oneDNN laid out", times["laid out"], floor)
    amortised = [t + statistics.median(copies) / steps for t in times["laid out"]]
    row(f"  + its copy / {steps} tokens", amortised, floor)
    paired = [a / b for a, b in zip(times["mkl"], times["laid out"])]
    (ta, la), (tb, lb) = out["mkl"], out["laid out"]
    print(
        f"  MKL / laid out, paired: {[round(x, 2) for x in paired]}; the copy {statistics.median(copies):.3f} s per "
        f"sampling call; greedy ids: laid out = MKL {torch.equal(ta, tb)}, laid out = generate "
        f"{all(tb[i, :c].tolist() == ref[i, :c].tolist() for i, c in enumerate(cut))}; max |logit difference| {float((la - lb).abs().max()):.2e}"
    )


def sampled_agreement(model: Any, rows: int = 32, tokens: int = 32) -> None:
    """Training-style rollouts (T = 1, per-row seeds, `sample_rows` at batch 4) with the projections on MKL and laid
    out on oneDNN: how many rows sample the same ids (the sums differ in order, so a uniform that falls between the
    two paths' cumulative probabilities draws another token; greedy is compared in `decode_stage`)."""
    from mechopd.generate.sampler import sample_rows
    from mechopd.generate.settings import SamplingSettings

    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(100, 1000, (rows, 40), generator=g).tolist()
    stop = torch.as_tensor(model.generation_config.eos_token_id).view(-1).tolist()
    st = SamplingSettings(max_new_tokens=tokens, stop=stop, pad_id=0, temperature=1.0, batch_size=4)
    seeds = list(range(rows))
    got = {}
    for kind in ("mkl", "onednn"):
        with on_kernels(kind):
            got[kind] = sample_rows(model, prompts, seeds, st)
    same = sum(a == b for a, b in zip(got["mkl"], got["onednn"]))
    toks = sum(len(a) for a in got["mkl"])
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(got["mkl"], got["onednn"])]
    where = sorted(i for i in first if i is not None)
    print(
        f"  sampled at T = 1, {rows} rows x {tokens} tokens ({toks} ids), MKL vs laid out: {same} of {rows} rows "
        f"identical; the others first differ at token {where}"
    )


def optimizer_stage(model: Any, fl: Floors, reps: int) -> None:
    params = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    n = sum(p.numel() for p in params)
    for impl in ("default", "fused"):
        ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
        fl.mark()
        opt = torch.optim.AdamW(ps, lr=1e-5, fused=True if impl == "fused" else None)
        times = []
        for r in range(reps + 1):
            fl.take()
            for p in ps:
                p.grad = torch.full_like(p, 1e-3)
            t0 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(ps, 1.0)
            opt.step()
            torch.stack(torch._foreach_norm([p.detach() for p in ps])).isfinite().all()
            if r:  # the first step allocates the moments
                times.append(time.perf_counter() - t0)
        row(f"optimizer (clip+AdamW+guard) {impl}", times, 11 * 4 * n / (fl.gbs() * 1e9))


def step_stages(args: argparse.Namespace, path: Path, root: Path, fl: Floors, n: int, head: tuple) -> None:
    step = ts.make_trainer_step(path, root, "opd", args, method="opd", selector="full")
    n = sum(p.numel() for p in step.trainer.student.parameters())  # type: ignore[attr-defined]  (head untied: more)
    recs = []
    fl.mark()
    for r in range(args.steps + 1):
        fl.take()
        step()
        if r:
            recs.append(step.records[-1])  # type: ignore[attr-defined]
    step.trainer.close()  # type: ignore[attr-defined]
    B, R, (V, d) = args.batch, args.new_tokens, head
    gf, gb = fl.gflops() * 1e9, fl.gbs() * 1e9
    tx = B * (R + 40)  # no-context view: ~40 prompt tokens of the rules task plus the response, per row (approximate)
    tc = B * R + 200  # context view: the response per row, the shared context prefix once (approximate)
    floors = {
        "rollout": R * max(4 * n / gb, 2 * n * B / gf) + 2 * n * B * 40 / gf,
        "teacher": 2 * n * tc / gf,
        "student_fwd": 2 * n * tx / gf,
        "loss": 8 * V * d * B * R / gf,  # LM heads: teacher and student forward 2 + 2, the student's backward 4
        "student_bwd": 4 * n * tx / gf,
        "optimizer": 11 * 4 * n / gb,
    }
    print(f"OPD step, batch {B}, {R} new tokens ({args.steps} steps after 1 warm-up; token counts approximate):")
    for stage, floor in floors.items():
        row(stage, [r[f"time/{stage}"] for r in recs], floor)
    row("whole step", [r["step_s"] for r in recs], sum(floors.values()))


def eval_stage(args: argparse.Namespace, model_dir: str, fl: Floors, n: int) -> None:
    import mechopd
    import mechopd.evaluation.evaluate as E
    import mechopd.evaluation.following as F
    import mechopd.generate.sampler as S
    from mechopd.generate.groups import group_prompts

    orig, calls, mode = S.sample_rows, [], {"charge": True}

    def recorded(model: Any, ids: Any, seeds: Any, st: Any, charge_decode: bool = False, **kw: Any) -> Any:
        charge = mode["charge"] and charge_decode
        calls.append((ids, st, charge))
        return orig(model, ids, seeds, st, charge_decode=charge, **kw)

    E.sample_rows = F.sample_rows = recorded  # type: ignore[attr-defined]
    opts = dict(
        path=str(DATA / "smollm2_facts.jsonl"),
        context_file=str(DATA / "smollm2_handbook.txt"),
        other_context_file=str(DATA / "smollm2_handbook_other.txt"),
        placement="user",
        answer_format="contains",
        test_fraction=0.5,
        max_new_tokens=24,
    )
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    variants = {"groups charged decode steps, oneDNN": (True, "onednn")}  # the evaluation as it runs now
    if args.eval_ab:
        variants["groups charged forward only"] = (False, "onednn")  # the plan before issue 58
    if args.layout_ab:
        variants["projections on MKL"] = (True, "mkl")  # the projections before issue 58's layout
    times: dict[str, list[float]] = {v: [] for v in variants}
    plans: dict[str, list] = {}
    results: dict[str, Any] = {}
    takes: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    names = list(variants)
    for rep in range(args.eval_reps):
        for name in names if rep % 2 == 0 else names[::-1]:  # no variant always runs first
            mode["charge"], kind = variants[name]
            fl.take()
            takes[name].append((fl.copy[-1], fl.gemm[-1]))
            calls.clear()
            with on_kernels(kind):
                t0 = time.perf_counter()
                res = mechopd.run_eval(
                    model_dir, "jsonl", n=54, other_contexts=True, task_options=opts, no_context_system=system
                )
                times[name].append(time.perf_counter() - t0)
            plans[name] = list(calls)
            results.setdefault(name, res)
    E.sample_rows = F.sample_rows = orig  # type: ignore[attr-defined]
    for name in names:
        gb = statistics.median(c for c, _ in takes[name]) * 1e9  # the floors taken before this variant's runs
        gf = statistics.median(g for _, g in takes[name]) * 1e9
        floor, n_calls = 0.0, 0
        for ids, st, c in plans[name]:
            for g in group_prompts(ids, st.max_new_tokens if c else 0):
                rows = len(g.rows)
                floor += 2 * n * (g.length + sum(len(ids[i]) - g.length for i in g.rows)) / gf  # prefill
                for s in range(0, rows, st.batch_size):
                    b = min(st.batch_size, rows - s)
                    floor += st.max_new_tokens * max(4 * n / gb, 2 * n * b / gf)
                    n_calls += 1
        row(f"eval, 54 items, {n_calls} decode calls ({name})", times[name], floor)
    for name in names[1:]:
        per = [x / y for x, y in zip(times[name], times[names[0]])]
        print(f"  eval ({name}) / eval ({names[0]}), paired: {[round(x, 2) for x in per]}")
        a, b = results[names[0]], results[name]
        same = [k for k in a if a[k] != b[k] and k not in ("timing", "wall_s")]
        print(f"  metrics and records identical: {not same}{'' if not same else same}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="model:smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--steps", type=int, default=3, help="OPD steps measured (after one warm-up)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the decode and optimizer stages")
    ap.add_argument("--eval-reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-ab", action="store_true", help="also the eval with the grouping charged forward only")
    ap.add_argument("--layout-ab", action="store_true", help="also the eval with every projection on MKL (before)")
    ap.add_argument("--trl", action="store_true", help="OPD vs TRL 1.16 interleaved (bench/train_step.py's)")
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--skip-step", action="store_true")
    args = ap.parse_args(argv)
    args.seed, args.pool, args.warmup = 0, 64, 1
    ts.quiet()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    model_dir = ts._model_dir(args.model)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    n = sum(p.numel() for p in model.parameters())
    fl = Floors(model.config.hidden_size)
    head = (model.config.vocab_size, model.config.hidden_size)
    load = os.getloadavg()
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.model}: {n / 1e6:.1f} M parameters "
        f"({4 * n / 1e6:.0f} MB float32)"
    )
    print("stage                                  median   [min-max]             floor            off by")
    for b in (args.batch, 16):
        decode_stage(model, fl, b, args.new_tokens, args.reps)
    sampled_agreement(model)
    optimizer_stage(model, fl, args.reps)
    if not args.skip_eval:
        eval_stage(args, model_dir, fl, n)
    del model
    if not args.skip_step or args.trl:
        from real_model import prepare_real  # bench/real_model.py

        with tempfile.TemporaryDirectory(prefix="mechopd-bench-floors-") as tmp:
            root = Path(tmp)
            path, args.no_context_system = prepare_real(model_dir, root / "real")
            if not args.skip_step:
                step_stages(args, path, root, fl, n, head)
            if args.trl:
                v = {
                    "opd": ts.make_trainer_step(path, root, "opd-trl", args, method="opd", selector="full"),
                    "trl": ts.TRLRunner(path, root, args),
                }
                times, lens = ts.run_interleaved(v, args.steps, args.warmup)
                (paired, lo, hi), line = ts._ratio_line(
                    "TRL / OPD (= OPD steps/s over TRL's)", times["trl"], times["opd"]
                )
                print(line.format(""), f"(response lengths {lens})")
                v["opd"].trainer.close()  # type: ignore[attr-defined]
    print(f"floors: {fl.line()}")
    load = os.getloadavg()
    print(f"load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
