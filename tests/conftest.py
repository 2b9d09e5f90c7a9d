"""Shared fixtures: offline tokenizers and tiny models built from configs (no network, no downloads)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning. The suite runs one pytest-xdist worker per core, and a worker's
# two-thread stage (the organism's pretraining, a two-process run) would otherwise spin against the other worker's
# threads: measured 2026-12-06, the worker-count demo test took 72 CPU-s beside a busy core and 53 with this (its
# CPU time alone: 54). It changes no number: only how a thread waits. libgomp reads it once, when torch loads.
assert "torch" not in sys.modules, "tests/conftest.py must set OMP_WAIT_POLICY before torch is imported"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)  # tiny models: one thread avoids OpenMP spin-wait contention on 2 cores

QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else -%}{{ '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- for m in messages -%}{%- if m['role'] != 'system' -%}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|im_start|>system\n' }}"
    "{{- 'Cutting Knowledge Date : December 2023\nToday Date : ' + date_string + '\n\n' }}"
    "{{- system_message + '<|im_end|>\n' }}"
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


@pytest.fixture(scope="session")
def organism_tokenizer():
    from mechopd.organisms.pretrain import organism_vocab
    from mechopd.organisms.tokenizer import build_tokenizer

    return build_tokenizer(
        organism_vocab()
        + [
            "You",
            "are",
            "Qwen",
            "created",
            "Alibaba",
            "Cloud",
            "a",
            "helpful",
            "assistant",
            "Cutting",
            "Knowledge",
            "Date",
            "December",
            "Today",
            "Jul",
            "2024",
            "2023",
        ]
    )


def tiny_model(tokenizer, arch: str = "qwen3", layers: int = 2, seed: int = 0):
    """A tiny decoder built from a config (hidden 32), eval mode, deterministic for `seed`."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    cls = {"qwen3": Qwen3Config, "qwen2": Qwen2Config, "llama": LlamaConfig}[arch]
    cfg = cls(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


RULE_PROMPTS = [
    "apply the rule to : 3 1 4",
    "apply the rule to : 1 5 9 2 6",
    "apply the rule to : 7",
    "apply the rule to :",
]


def rule_prompt_ids(tokenizer) -> list[list[int]]:
    """The rules prompts of the decoding tests, rendered without a context (system placement)."""
    from mechopd.core.views import RenderSpec, render_prompt_ids

    return [render_prompt_ids(tokenizer, p, None, RenderSpec("system")) for p in RULE_PROMPTS]


def generate_reference(model, tokenizer, ids, stop, max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy ``generate`` over the left-padded prompts, each row cut after its first stop id: what
    mechopd's sampler must return for the same prompts (greedy)."""
    from mechopd.core.views import left_pad

    x, m = left_pad(ids, tokenizer.pad_token_id)
    out = model.generate(
        input_ids=x,
        attention_mask=m,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=stop,
        pad_token_id=tokenizer.pad_token_id,
    )[:, x.shape[1] :].tolist()
    cuts = [next((i + 1 for i, t in enumerate(row) if t in stop), len(row)) for row in out]
    return [row[:c] for row, c in zip(out, cuts)]


@pytest.fixture(scope="session")
def tiny_qwen3(organism_tokenizer):
    return tiny_model(organism_tokenizer)


TINY_ORGANISM = dict(
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=64,
    steps=60,
    batch_size=32,
    corpus_size=2000,
    lr=3e-3,
)


def session_dir(tmp_path_factory, name: str) -> Path:
    """A directory of this test session shared by its pytest-xdist workers (each worker's temp dir is a child of the
    session's): what one worker builds there, the others reuse. Without workers, the session's own temp dir."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    out = base / "shared" / name
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="session")
def tiny_rules_organism(tmp_path_factory):
    """A rules organism pretrained for a few steps (seconds): a real checkpoint written by `pretrain`, once per session
    (`pretrain` holds a lock on the directory, so a second worker waits, then reuses the checkpoint by its key)."""
    from mechopd.organisms.pretrain import OrganismConfig, pretrain

    out = session_dir(tmp_path_factory, "organism") / "rules"
    return pretrain(OrganismConfig(task="rules", **TINY_ORGANISM), out, progress=False)


def shared_demo(tmp_path_factory, name: str, *args: str) -> Path:
    """``mechopd demo --fast ARGS --out runs/demo`` run once per test session in a process of its own (one intra-op
    thread outside the jobs, as `tests/cli/test_hostile_signals.py` starts a demo) in the session directory ``name``,
    shared by the pytest-xdist workers under a file lock (a second worker waits, then finds the run done). Its
    standard output is kept in ``demo.out`` beside ``runs/``. Read only: a test that changes a demo copies it first."""
    import fcntl
    import subprocess
    import sys

    root = session_dir(tmp_path_factory, name)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".done").exists():
            cmd = [sys.executable, "-m", "mechopd.cli", "demo", "--fast", *args, "--out", "runs/demo"]
            done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
            assert done.returncode == 0, done.stderr[-3000:]
            (root / "demo.out").write_text(done.stdout)
            (root / ".done").touch()
    return root / "runs" / "demo"


@pytest.fixture(scope="session")
def fast_demo_two_workers(tmp_path_factory) -> Path:
    """``mechopd demo --fast --workers 2``, once per session (`shared_demo`): the uninterrupted reference a killed demo
    is compared with, the two-worker side of the worker-count test, and the demo `test_demo_fast_then_figures` copies."""
    return shared_demo(tmp_path_factory, "fast-demo-w2", "--workers", "2")


@pytest.fixture(scope="session")
def fast_demo_three_seeds(tmp_path_factory) -> Path:
    """``mechopd demo --fast --seeds 3``, once per session (`shared_demo`): the README commands' world (a copy) and the
    multi-seed demo test (read only)."""
    return shared_demo(tmp_path_factory, "fast-demo-s3", "--seeds", "3")


# The files that cost most CPU, heaviest first (measured 2026-12-06 with a per-test getrusage plugin, CPU seconds of
# the file's tests, children included, on 2 cores: hostile_signals 108, two_process 105, readme_commands 58, demo 58,
# fetch 57, families 46, claims 35, teacher_modes 37, step_two_process 30, plot_layout 24, following 24, rundir_disk 24,
# hostile_study 20; the suite 983). readme_commands and demo come first: they build the session's shared demos
# (`shared_demo`), which demo's last test and hostile_signals read. pytest-xdist hands out whole files (--dist
# loadfile), so a long file handed out last would leave the other workers idle at the end. The rest follow in
# collection order, the many short unit files last as filler. A stale entry only costs balance, never a test.
HEAVY_FIRST = (
    "tests/cli/test_readme_commands.py",
    "tests/cli/test_demo.py",
    "tests/cli/test_hostile_signals.py",
    "tests/integration/test_two_process.py",
    "tests/fetch/test_real_model.py",
    "tests/realpath/test_families.py",
    "tests/integration/test_teacher_modes.py",
    "tests/unit/test_claims.py",
    "tests/integration/test_step_two_process.py",
    "tests/unit/test_plot_layout.py",
    "tests/integration/test_following.py",
    "tests/cli/test_rundir_disk.py",
    "tests/cli/test_hostile_study.py",
)


def pytest_collection_modifyitems(config, items):
    """Heavy files first, unit files last (a stable sort: each file keeps its own order)."""
    root = Path(__file__).resolve().parent.parent

    def rank(item) -> tuple[int, int]:
        path = Path(item.path).resolve()
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else ""
        if rel in HEAVY_FIRST:
            return (0, HEAVY_FIRST.index(rel))
        return (2, 0) if rel.startswith("tests/unit/") else (1, 0)

    items.sort(key=rank)
