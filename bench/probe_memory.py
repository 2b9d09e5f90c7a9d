"""Benchmark: peak memory and time of the similarity, lens and deltas probes on the real Qwen2.5-Coder models (issue 55,
item 3), beside the 12 GB budget a CPU machine gives them.

Models: ``model:qwen2.5-coder-0.5b-instruct`` (the student, 630 M parameters, float32: 2.5 GB of weights) and
``model:qwen2.5-coder-1.5b-instruct`` (the teacher, 1.54 G, 6.2 GB), fetched by `mechopd fetch` (not here: this script
refuses a model that is not in the cache). Items: the qwen-coder-docs study's task and render spec, ``--n`` held-out
items, the reference answers as responses (``--responses-from answers``: no sampling, the probes' own forwards only).

Measurement: each probe runs as the user types it (``python -m mechopd.cli probe NAME ...``) in a FRESH subprocess on
``--threads`` intra-op threads; its peak resident set is the child's ``ru_maxrss`` (``os.wait4``), its time the wall
clock. The reference, measured in the same run: the same model loaded alone in a fresh subprocess
(``mechopd.models.load_model``), the floor of any probe that holds the model. Printed per probe and model: peak GB,
peak / load, peak / budget, wall seconds, PASS or FAIL (exit code 1 on any FAIL).

deltas reads a LoRA student's update from its adapter (ΔW = (α / r) B A per adapted module; `mechopd.probes.weights`):
two synthetic LoRA students of the 0.5B (rank 8, α 16, q/k/v/o/gate/up/down, B ~ N(0, 0.01) with seeds 1 and 2, saved
as mechopd saves a LoRA run: merged weights + ``adapter/``) are built first in a temporary directory (its own peak
printed as ``build``) and removed afterwards; the probe compares them (``--pair opd,nca``).

    python bench/probe_memory.py [--models 0.5b,1.5b] [--probes similarity,lens,deltas] [--n 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "mechopd" / "data"
BUDGET_GB = 12.0
MODELS = {"0.5b": "qwen2.5-coder-0.5b-instruct", "1.5b": "qwen2.5-coder-1.5b-instruct"}
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."  # the study's no_context_system
TASK_FLAGS = [
    "--task", "jsonl",
    "--option", f"path={DATA / 'qwen_coder_docs.jsonl'}",
    "--option", f"context_file={DATA / 'qwen_coder_docs.md'}",
    "--option", f"other_context_file={DATA / 'qwen_coder_docs_other.md'}",
    "--option", "placement=user",
    "--option", "answer_format=contains",
    "--option", "test_fraction=0.5",
    "--option", "max_new_tokens=24",
    "--no-context-system", SYSTEM,
]  # fmt: skip
LOAD = "from mechopd.models import load_model; import sys; load_model(sys.argv[1])"
BUILD = """
import copy, sys, torch
from pathlib import Path
from mechopd.config.sections import LoraOptions
from mechopd.models import lora, load_model
base, out = sys.argv[1], Path(sys.argv[2])
opts = LoraOptions(lora_rank=8, lora_alpha=16.0)
student = lora.add_adapter(load_model(base), opts)
for label, seed in (("opd", 1), ("nca", 2)):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in student.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
    student.save_pretrained(out / label, state_dict=lora.merged_state(student), safe_serialization=True)
    lora.save_adapter(student, opts, out / label / lora.ADAPTER_DIR, base)
"""


def measured(cmd: list[str], threads: int) -> tuple[float, float, int]:
    """(peak RSS in GB, wall seconds, exit code) of ``cmd`` in a fresh subprocess on ``threads`` threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        print(f"  FAILED ({proc.returncode}): {' '.join(cmd[:6])} ...\n{err[-2000:]}", file=sys.stderr)
    return usage.ru_maxrss * 1024 / 1e9, time.perf_counter() - t0, proc.returncode  # Linux: KiB


def model_dir(name: str) -> str:
    """The fetched model's directory (`mechopd.models.fetch.models_dir`); a model not fetched is refused, not fetched."""
    sys.path.insert(0, str(ROOT))
    from mechopd.models.fetch import models_dir

    path = models_dir() / name
    if not (path / "config.json").is_file():
        raise SystemExit(f"{name} is not in {models_dir()}; run: python -m mechopd.cli fetch {name}")
    return str(path)


def probe_cmd(probe: str, out: Path, args: argparse.Namespace, extra: list[str]) -> list[str]:
    items = ["--n", str(args.n), "--batch-size", str(args.batch_size), "--responses-from", "answers"]
    return [sys.executable, "-m", "mechopd.cli", "probe", probe, *TASK_FLAGS, *items, "--out", str(out), *extra]


def row(what: str, model: str, gb: float, load: float, secs: float, rc: int) -> bool:
    """One printed row; True when the command succeeded within the budget (PASS)."""
    ok = "PASS" if rc == 0 and gb <= BUDGET_GB else ("FAIL (exit code)" if rc else "FAIL (over budget)")
    print(
        f"{what:<11} {model:<5} {gb:7.2f} GB  {gb / load:5.2f} x load  {gb / BUDGET_GB:5.2f} of {BUDGET_GB:.0f} GB  "
        f"{secs:7.1f} s  {ok}",
        flush=True,
    )
    return ok == "PASS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="0.5b,1.5b", help="comma-separated: 0.5b, 1.5b")
    ap.add_argument("--probes", default="similarity,lens,deltas", help="comma-separated: similarity, lens, deltas")
    ap.add_argument("--n", type=int, default=2, help="held-out items per probe")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    probes = args.probes.split(",")
    work, passed = Path(tempfile.mkdtemp(prefix="probe_memory_")), []
    print(f"threads {args.threads}, {args.n} items, batch {args.batch_size}; budget {BUDGET_GB:.0f} GB per probe")
    print(f"{'probe':<11} {'model':<5} {'peak':>10}  {'vs load':>12}  {'vs budget':>15}  {'wall':>9}")
    try:
        for key in args.models.split(","):
            path = model_dir(MODELS[key])
            load, secs, rc = measured([sys.executable, "-c", LOAD, path], args.threads)
            passed.append(row("load (ref)", key, load, load, secs, rc))
            for probe in (p for p in probes if p in ("similarity", "lens")):
                gb, secs, rc = measured(
                    probe_cmd(probe, work / f"{probe}-{key}", args, ["--models", f"{key}={path}"]), args.threads
                )
                passed.append(row(probe, key, gb, load, secs, rc))
            if "deltas" in probes and key == "0.5b":  # the LoRA students are 0.5B; the 1.5B teacher is not trained
                gb, secs, rc = measured([sys.executable, "-c", BUILD, path, str(work / "students")], args.threads)
                passed.append(row("build", key, gb, load, secs, rc))
                students = [f"{m}={work / 'students' / m}" for m in ("opd", "nca")]
                extra = ["--base", path, "--models", *students, "--pair", "opd,nca"]
                gb, secs, rc = measured(
                    [sys.executable, "-m", "mechopd.cli", "probe", "deltas", "--out", str(work / "deltas"), *extra],
                    args.threads,
                )
                passed.append(row("deltas", key, gb, load, secs, rc))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(passed) else 1


if __name__ == "__main__":
    raise SystemExit(main())
