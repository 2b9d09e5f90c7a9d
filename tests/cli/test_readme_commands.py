"""Every command of the README's Commands section, run as written, in a temporary directory.

The commands are read from the README (a new line there is a new test here). They run in order, from a directory
that holds what the README's lines presuppose: a demo (`mechopd demo --fast --seeds 3 --out runs/demo`: three seed
runs with every probe, about half a minute; a copy of the session's `fast_demo_three_seeds`), a rules organism at
``runs/organisms/rules`` (the fast demo's organism), a small ``CONFIG.yaml`` (2 steps) and a ``qa.jsonl`` (the
shipped sample with each item's context). The one placeholder, ``DIR`` (a model directory), is filled in order with
the organism, the demo's OPD and NCA checkpoints (on the JSONL line: three tiny random models whose word-level
vocabulary covers the task).
`mechopd ...` lines run through `mechopd.cli.main` (the console script's function), the ``torchrun`` line as a
process. A command too long for CI is in `NOT_RUN` with its reason; it must still parse, and `NOT_RUN` may name
only commands the README holds.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mechopd.cli import main, make_parser

ROOT = Path(__file__).resolve().parents[2]

# command (as in the README, comment stripped) -> why CI does not run it
NOT_RUN = {
    "mechopd pretrain --task rules": "pretrains the full rules organism (600 steps, 62-69 s of the demo's budget, "
    "docs/results.md); the test's world holds the fast demo's organism instead",
    "mechopd pretrain --task sokoban --layers 8": "pretrains an 8-layer Sokoban organism (minutes: docs/organisms.md)",
    "mechopd train training/organisms/rules.yaml --method nca --set follow_weight=1": "the recipe's student is organism:rules, the full organism (pretrained on first use), then 100 steps x 32 "
    "prompts",
}

CONFIG = {
    "task": "rules",
    "method": "opd",
    "steps": 2,
    "batch_size": 4,
    "pool_size": 16,
    "max_new_tokens": 6,
    "lr": 1e-3,
    "eval_every": 0,
    "save_every": 0,
}


def readme_commands() -> list[str]:
    """The lines of the first ```bash block after "## Commands", each without its trailing comment."""
    text = (ROOT / "README.md").read_text()
    assert "## Commands" in text, "README.md has no '## Commands' section"
    block = text.split("## Commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [ln.split("  #")[0].strip() for ln in block.splitlines() if ln.strip()]


def argv_of(cmd: str) -> list[str]:
    """The argv after the program (``mechopd`` or ``torchrun ... -m mechopd.cli``)."""
    argv = shlex.split(cmd)
    if argv[0] == "torchrun":
        return argv[argv.index("mechopd.cli") + 1 :]
    assert argv[0] == "mechopd", f"a README command that is not mechopd or torchrun: {cmd}"
    return argv[1:]


def fill(argv: list[str], dirs: list[str]) -> list[str]:
    """Each ``DIR`` (alone or as ``label=DIR``) replaced by the next of ``dirs``."""
    out, k = [], 0
    for a in argv:
        head, sep, tail = a.rpartition("=")
        if tail == "DIR":
            a, k = head + sep + dirs[k % len(dirs)], k + 1
        out.append(a)
    return out


def _world(root: Path, demo: Path) -> list[str]:
    """The demo (a copy of ``demo``, the session's three-seed fast demo, with its organism), the organism, CONFIG.yaml
    and qa.jsonl under ``root``; returns the models that fill DIR."""
    shutil.copytree(demo.parent, root / "runs")
    shutil.copytree(root / "runs" / "organisms" / "rules-fast", root / "runs" / "organisms" / "rules")
    (root / "CONFIG.yaml").write_text(
        "".join(f"{k}: {v}\n" for k, v in {**CONFIG, "student": "runs/organisms/rules"}.items())
    )
    context = (ROOT / "mechopd" / "data" / "sample_context.txt").read_text()
    with (root / "qa.jsonl").open("w") as fh:
        for line in (ROOT / "mechopd" / "data" / "sample_qa.jsonl").read_text().splitlines():
            fh.write(json.dumps({**json.loads(line), "context": context}) + "\n")
    train = root / "runs" / "demo" / "seed-0" / "train"
    return [str(root / "runs" / "organisms" / "rules"), str(train / "opd" / "final"), str(train / "nca" / "final")]


def _jsonl_models(root: Path, path: Path) -> list[str]:
    """Three tiny random models whose word-level vocabulary covers the JSONL task at ``path`` (DIR of a jsonl line)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from mechopd.organisms.tokenizer import build_tokenizer
    from mechopd.tasks.base import get_task
    from mechopd.tasks.words import split_words

    task = get_task("jsonl", path=str(path))
    words = set(task.vocab())
    for split, size in task.split_sizes().items():
        for e in task.examples(split, size, 0):
            words.update(split_words(f"{e.prompt}\n{e.context}\n{e.answer}"))
    tok = build_tokenizer(sorted(words))
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
    )
    dirs = []
    for seed in range(3):
        d = root / "jsonl-models" / f"m{seed}"
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
        tok.save_pretrained(d)
        dirs.append(str(d))
    return dirs


def _run(cmd: str, dirs: list[str]) -> tuple[int, str]:
    argv = argv_of(cmd)
    if "jsonl" in argv and "DIR" in " ".join(argv):  # the organism's words do not cover the JSONL task
        dirs = _jsonl_models(Path.cwd(), Path(argv[argv.index("--option") + 1].split("=", 1)[1]))
    argv = fill(argv, dirs)
    if cmd.startswith("torchrun"):
        if shutil.which("torchrun") is None:
            return -1, "torchrun is not on PATH (it comes with torch)"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1",
        }
        env.pop("OMP_WAIT_POLICY", None)  # one thread per rank: the suite's policy (conftest.py) has nothing to do
        words = shlex.split(cmd)
        prefix = words[: words.index("mechopd.cli") + 1]
        done = subprocess.run([*prefix, *argv], check=False, capture_output=True, text=True, env=env, timeout=300)
        return done.returncode, done.stdout + done.stderr
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def ran(tmp_path_factory, fast_demo_three_seeds) -> dict[str, tuple[int, str, float]]:
    """Every README command that is not in NOT_RUN, in the README's order: command -> (exit code, output, seconds)."""
    root = tmp_path_factory.mktemp("readme")
    results = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        dirs = _world(root, fast_demo_three_seeds)
        for cmd in readme_commands():
            if cmd in NOT_RUN:
                continue
            t0 = time.time()
            rc, text = _run(cmd, dirs)
            results[cmd] = (rc, text, time.time() - t0)
    results["<root>"] = (0, str(root), 0.0)
    return results


def test_not_run_names_only_commands_the_readme_holds():
    stale = sorted(set(NOT_RUN) - set(readme_commands()))
    assert not stale, f"NOT_RUN names commands no longer in the README: {stale}; remove them from NOT_RUN"
    assert len(readme_commands()) >= 10


@pytest.mark.parametrize("cmd", readme_commands())
def test_readme_command_runs_as_written(cmd, ran):
    make_parser().parse_args(argv_of(cmd))  # every line parses as written (argparse exits on an unknown flag or verb)
    if cmd in NOT_RUN:
        pytest.skip(f"NOT_RUN: {NOT_RUN[cmd]}")
    rc, text, seconds = ran[cmd]
    assert rc == 0, f"`{cmd}` exited {rc} after {seconds:.1f} s:\n{text[-8000:]}"
    print(f"{cmd}: {seconds:.1f} s", file=sys.stderr)


def test_the_seed_and_aggregate_reports_link_their_explorer_pages(ran):
    """The demo's reports (and `mechopd aggregate`'s): each seed's report.md has explore.html beside it and an Items
    section; the degradation row of the aggregate reports links each seed's page filtered to OPD's Harm items."""
    root = Path(ran["<root>"][1])
    for k in range(3):
        seed = root / "runs" / "demo" / f"seed-{k}"
        assert (seed / "explore.html").is_file() and "## Items" in (seed / "report.md").read_text()
    for report, prefix in (
        (root / "runs" / "demo" / "report.md", ""),
        (root / "runs" / "agg" / "report.md", "../demo/"),
    ):
        row = next(ln for ln in report.read_text().splitlines() if ln.startswith("| OPD causes context-induced"))
        for k in range(3):
            assert f"]({prefix}seed-{k}/explore.html#filter=harm&model=opd)" in row, (report, row)
