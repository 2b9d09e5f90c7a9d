"""Benchmark: streamed parameter deltas on Qwen3-0.6B-shaped checkpoints vs simply reading the files.

Writes a base and two trained-looking checkpoints (random bf16 weights in Qwen3-0.6B's shapes: hidden 1024, 28 layers,
intermediate 3072, 16 heads, 8 kv heads, head_dim 128, vocab 151936, tied embeddings; sharded safetensors, ~1.2 GB
each) to --dir without building a model in memory, then measures in fresh subprocesses:

  reference  read every tensor of the checkpoints compared (safe_open + get_tensor(...).clone(), tensor by tensor)
  deltas     mechopd.probes.delta_sums.parameter_deltas on the same checkpoints

for (a) one model against the base (two files) and (b) two models against the base with pair=("opd", "nca") (three
files). Prints time ratios deltas / reference (target <= 1.5; best and median of alternating runs, and CPU time,
which shared cores disturb less) and the peak RSS (VmHWM) of the deltas process (target <= 1.5 GB). Files are
removed at the end unless --keep.

    python bench/probe_deltas.py [--dir /tmp/mechopd-bench-deltas] [--repeats 3] [--keep] [--layers 28]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

GB = 1e9  # decimal gigabytes, as the targets are stated


def qwen3_06b_config(layers: int = 28):
    from transformers import Qwen3Config

    return Qwen3Config(
        hidden_size=1024,
        num_hidden_layers=layers,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    )


def tensor_specs(cfg) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the checkpoint's tensors, from a meta-device model (no weights allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    specs = [(n, tuple(p.shape)) for n, p in model.state_dict().items()]
    return [(n, s) for n, s in specs if not (cfg.tie_word_embeddings and n == "lm_head.weight")]


def _shards(specs, shard_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    shards, size = [[]], 0
    for name, shape in specs:
        nbytes = 2 * torch.Size(shape).numel()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    return shards


def _tensors(i: int, name: str, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """base / opd / nca versions of one tensor: opd = base + u, nca = base + 0.7 u + v (random u, v)."""
    g = torch.Generator().manual_seed(1000 + i)
    base = torch.randn(shape, generator=g) * 0.02 + (1.0 if name.endswith("norm.weight") else 0.0)
    u = torch.randn(shape, generator=g) * 2e-3
    v = torch.randn(shape, generator=g) * 2e-3
    return {"base": base.bfloat16(), "opd": (base + u).bfloat16(), "nca": (base + 0.7 * u + v).bfloat16()}


def write_checkpoints(root: Path, cfg, shard_bytes: int = 512 * 1024**2) -> dict[str, Path]:
    """Write base/opd/nca as sharded safetensors checkpoints, one shard of all three at a time."""
    from safetensors.torch import save_file

    dirs = {k: root / k for k in ("base", "opd", "nca")}
    shards = _shards(tensor_specs(cfg), shard_bytes)
    weight_map, i, total = {}, 0, 0
    for s, shard in enumerate(shards, start=1):
        fname = f"model-{s:05d}-of-{len(shards):05d}.safetensors"
        parts = {k: {} for k in dirs}
        for name, shape in shard:
            for k, t in _tensors(i, name, shape).items():
                parts[k][name] = t
            weight_map[name], i, total = fname, i + 1, total + 2 * torch.Size(shape).numel()
        for k, d in dirs.items():
            d.mkdir(parents=True, exist_ok=True)
            save_file(parts[k], str(d / fname), metadata={"format": "pt"})
        del parts
    for d in dirs.values():
        cfg.save_pretrained(d)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return dirs


# ------------------------------------------------------------------------------------------- measured subprocesses
def _vmhwm_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / GB
    return float("nan")


def child_read(dirs: list[str]) -> dict:
    """Reference: materialise every tensor of every checkpoint, one tensor at a time."""
    from safetensors import safe_open

    from mechopd.probes.weights import checkpoint_tensors

    files = sorted({f for d in dirs for f in checkpoint_tensors(d).values()})
    t0, c0 = time.perf_counter(), time.process_time()
    nbytes = 0
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name).clone()
                nbytes += t.numel() * t.element_size()
                del t
    return {
        "seconds": time.perf_counter() - t0,
        "cpu": time.process_time() - c0,
        "gb": nbytes / GB,
        "vmhwm_gb": _vmhwm_gb(),
    }


def child_deltas(base: str, models: list[str], pair: bool, dtype: str) -> dict:
    from mechopd.probes.delta_sums import parameter_deltas

    labelled = dict(m.split("=", 1) for m in models)
    start_gb = _vmhwm_gb()
    t0, c0 = time.perf_counter(), time.process_time()
    rows = parameter_deltas(
        base, labelled, ("opd", "nca") if pair else None, dtype=getattr(torch, dtype), progress=False
    )
    return {
        "seconds": time.perf_counter() - t0,
        "cpu": time.process_time() - c0,
        "rows": len(rows),
        "vmhwm_gb": _vmhwm_gb(),
        "start_gb": start_gb,
    }


def _run_child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(dirs: dict[str, Path], repeats: int, dtype: str) -> None:
    """Reference and deltas alternate, each in a fresh process; best and median wall time, CPU time of all threads."""
    cases = {
        "opd vs base (2 files)": (["base", "opd"], False),
        "opd, nca vs base, pair (3 files)": (["base", "opd", "nca"], True),
    }
    _run_child(["read", *[str(d) for d in dirs.values()]])  # warm the page cache once, untimed
    for title, (keys, pair) in cases.items():
        reads, deltas = [], []
        for _ in range(repeats):
            reads.append(_run_child(["read", *[str(dirs[k]) for k in keys]]))
            models = [f"{k}={dirs[k]}" for k in keys[1:]]
            deltas.append(
                _run_child(["deltas", str(dirs["base"]), *models, *(["--pair"] if pair else []), "--dtype", dtype])
            )
        t_read, t_delta = (sorted(r["seconds"] for r in runs) for runs in (reads, deltas))
        c_read, c_delta = (statistics.median(r["cpu"] for r in runs) for runs in (reads, deltas))
        peak = max(r["vmhwm_gb"] for r in deltas)
        print(
            f"{title}: reference read of {reads[0]['gb']:.2f} GB {t_read[0]:.2f} s best / "
            f"{statistics.median(t_read):.2f} s median; parameter_deltas {t_delta[0]:.2f} s / "
            f"{statistics.median(t_delta):.2f} s"
        )
        print(
            f"    time ratio (target <= 1.5): {t_delta[0] / t_read[0]:.2f} best, "
            f"{statistics.median(t_delta) / statistics.median(t_read):.2f} median; CPU time ratio (median) "
            f"{c_delta / c_read:.2f}"
        )
        print(
            f"    peak RSS of parameter_deltas (target <= 1.5 GB): {peak:.2f} GB ({deltas[0]['start_gb']:.2f} GB "
            f"after imports; the reference read peaks at {max(r['vmhwm_gb'] for r in reads):.2f} GB)"
        )
        print(
            f"    wall times (s): reads {[round(r['seconds'], 2) for r in reads]}, "
            f"deltas {[round(r['seconds'], 2) for r in deltas]}"
        )


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/mechopd-bench-deltas"))
    p.add_argument("--layers", type=int, default=28, help="decoder layers (28 = Qwen3-0.6B)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per case (alternating reference and deltas)")
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--keep", action="store_true", help="keep the checkpoints in --dir")
    p.add_argument("--reuse", action="store_true", help="measure the checkpoints a --keep run left in --dir")
    return p


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, rest = sys.argv[2], sys.argv[3:]
        if kind == "read":
            print(json.dumps(child_read(rest)))
        else:
            pair = "--pair" in rest
            dtype = rest[rest.index("--dtype") + 1]
            models = [a for a in rest[1:] if "=" in a]
            print(json.dumps(child_deltas(rest[0], models, pair, dtype)))
        return
    args = make_parser().parse_args()
    cfg = qwen3_06b_config(args.layers)
    need = 3 * 2 * sum(torch.Size(s).numel() for _, s in tensor_specs(cfg))
    args.dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.dir).free
    if free < 1.2 * need:
        sys.exit(f"error: {args.dir} has {free / GB:.1f} GB free, the checkpoints need {need / GB:.1f} GB; pass --dir")
    try:
        t0 = time.perf_counter()
        dirs = {k: args.dir / k for k in ("base", "opd", "nca")}
        if not (args.reuse and all((d / "model.safetensors.index.json").is_file() for d in dirs.values())):
            dirs = write_checkpoints(args.dir, cfg)
            print(
                f"wrote 3 checkpoints ({need / 3 / GB:.2f} GB each, bf16) to {args.dir} "
                f"in {time.perf_counter() - t0:.0f} s"
            )
        measure(dirs, args.repeats, args.dtype)
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
