"""The README's promise as a test: every class of bad input of the reliability issue, typed at the CLI, exits with code
2 and exactly one ``error:`` line (no traceback), and the directory tree is the same afterwards: nothing written and
nothing removed, inside or outside ``--out`` (names, sizes and mtimes of every file and directory, recursively).

Cases run in-process (``mechopd.cli.main``; any exception that is not a `MechopdError` propagates and fails the case),
and a few run as ``python -m mechopd.cli`` subprocesses to prove the whole path end to end (stderr is exactly one line).
Each case corrupts its own copy of the session's tiny rules organism inside a fresh workspace that is also the cwd, so
default output paths (``runs/...``) would show up in the snapshot too.

The harness (snapshot, the corrupting helpers, `Case`, `_run`) is tests/cli/reliability_harness.py; the controls
that show these checks can fail are in test_reliability_controls.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.cli.reliability_harness import (
    CUDA,
    ROOT,
    Case,
    _bad_header,
    _compare,
    _cut,
    _eval,
    _file,
    _readonly,
    _rm,
    _run,
    _sharded_missing,
    copy_org,
    edit_config,
    jsonl_task,
    more_layers,
    pickle_only,
    poison,
    snapshot,
    train,
    truncate,
)

CASES = [
    # corrupt weights: unreadable file, or values that are not finite under an intact header
    Case(
        "corrupt",
        "truncated-eval",
        lambda o, w: _eval(str(truncate(copy_org(o, w), 0.5))),
        "truncated or not a safetensors",
        subprocess=True,
    ),
    Case("corrupt", "empty-eval", lambda o, w: _eval(str(truncate(copy_org(o, w), 0.0))), "is empty (0 bytes)"),
    Case(
        "corrupt",
        "bad-header-eval",
        lambda o, w: _eval(str(_bad_header(copy_org(o, w)))),
        "truncated or not a safetensors",
    ),
    Case(
        "corrupt",
        "truncated-train",
        lambda o, w: train(str(truncate(copy_org(o, w), 0.9)), w),
        "truncated or not a safetensors",
    ),
    Case("corrupt", "nan-eval", lambda o, w: _eval(str(poison(copy_org(o, w), float("nan")))), "NaN/inf"),
    Case("corrupt", "inf-train", lambda o, w: train(str(poison(copy_org(o, w), float("inf"))), w), "NaN/inf"),
    Case(
        "corrupt",
        "nan-deltas",
        lambda o, w: [
            "probe",
            "deltas",
            "--base",
            str(o),
            "--models",
            f"bad={poison(copy_org(o, w), float('nan'))}",
            "--out",
            str(w / "deltas"),
        ],
        "NaN/inf",
    ),
    Case(
        "corrupt",
        "second-of-compare",
        lambda o, w: _compare(w, f"a={o}", f"b={truncate(copy_org(o, w), 0.5)}"),
        "truncated or not a safetensors",
    ),  # every model is checked before the first is loaded and evaluated
    Case(
        "corrupt",
        "tokenizer-truncated",
        lambda o, w: _eval(str(_cut(copy_org(o, w), "tokenizer.json"))),
        "no usable tokenizer",
    ),
    # missing weights or files
    Case(
        "missing",
        "no-weights-eval",
        lambda o, w: _eval(str(_rm(copy_org(o, w), "model.safetensors"))),
        "holds no weights",
    ),
    Case(
        "missing",
        "no-weights-train",
        lambda o, w: train(str(_rm(copy_org(o, w), "model.safetensors")), w),
        "holds no weights",
    ),
    Case("missing", "missing-shard", lambda o, w: _eval(str(_sharded_missing(copy_org(o, w)))), "is missing"),
    Case("missing", "no-config", lambda o, w: _eval(str(_rm(copy_org(o, w), "config.json"))), "has no config.json"),
    Case("missing", "no-dir", lambda o, w: _eval(str(w / "nope")), "does not exist"),
    # config.json shapes that do not match the weights
    Case("shape", "more-layers-eval", lambda o, w: _eval(str(more_layers(copy_org(o, w), 2))), "lacks"),
    Case("shape", "more-layers-train", lambda o, w: train(str(more_layers(copy_org(o, w), 1)), w), "lacks"),
    Case("shape", "fewer-layers", lambda o, w: _eval(str(more_layers(copy_org(o, w), -1))), "does not describe"),
    Case(
        "shape", "wider-mlp", lambda o, w: _eval(str(edit_config(copy_org(o, w), intermediate_size=128))), "has shape"
    ),
    Case(
        "shape",
        "inconsistent-config",
        lambda o, w: _eval(str(edit_config(copy_org(o, w), num_hidden_layers=5))),
        "cannot read the model config",
    ),
    # pickle: refused with the conversion, never unpickled (the trap would create a file)
    Case("pickle", "bin-only-eval", lambda o, w: _eval(str(pickle_only(o, w))), "never unpickles", subprocess=True),
    Case("pickle", "bin-only-train", lambda o, w: train(str(pickle_only(o, w)), w), "never unpickles"),
    # devices this machine lacks
    Case(
        "device",
        "cuda-missing" if not CUDA else "cuda-index",
        lambda o, w: train(str(o), w, "--set", "device=cuda" if not CUDA else "device=cuda:99"),
        "CUDA device",
        subprocess=True,
    ),
    Case("device", "bogus-device", lambda o, w: train(str(o), w, "--set", "device=gpu0"), "not a device name"),
    # output paths: --out a file, under a file, read-only, would clobber, a checkpoint
    Case(
        "out", "eval-out-under-file", lambda o, w: _eval(str(o), "--out", str(_file(w) / "r.json")), "cannot be created"
    ),
    Case("out", "eval-out-not-json", lambda o, w: _eval(str(o), "--out", str(_file(w))), "ending in .json"),
    Case(
        "out",
        "eval-out-foreign-json",
        lambda o, w: _eval(str(o), "--out", str(_file(w, "notes.json"))),
        "is not an evaluation report",
    ),
    Case(
        "out",
        "eval-out-config-json",
        lambda o, w: _eval(str(copy_org(o, w)), "--out", str(w / "org/config.json")),
        "is not an evaluation report",
    ),
    Case(
        "out",
        "eval-out-before-load",
        lambda o, w: _eval(str(truncate(copy_org(o, w), 0.5)), "--out", str(_file(w) / "r.json")),
        "cannot be created",
    ),
    Case(
        "out",
        "compare-out-file",
        lambda o, w: ["eval", "--task", "rules", "--compare", f"a={o}", "--out", str(_file(w))],
        "is a file",
    ),
    Case(
        "out",
        "compare-out-checkpoint",
        lambda o, w: ["eval", "--task", "rules", "--compare", f"a={o}", "--out", str(copy_org(o, w))],
        "is a checkpoint directory",
    ),
    Case("out", "train-out-file", lambda o, w: train(str(o), w, "--out", str(_file(w))), "is a file"),
    Case(
        "out",
        "train-out-under-file",
        lambda o, w: train(str(o), w, "--out", str(_file(w) / "run")),
        "cannot be created",
    ),
    Case("out", "pretrain-out-file", lambda o, w: ["pretrain", "--task", "rules", "--out", str(_file(w))], "is a file"),
    Case("out", "figures-dir-is-file", lambda o, w: ["figures", str(_file(w / "run", "figures").parent)], "is a file"),
    Case(
        "out",
        "eval-out-readonly",
        lambda o, w: _eval(str(o), "--out", str(_readonly(w) / "r.json")),
        "not writable",
        skip="root writes to read-only directories" if ROOT else None,
    ),
    Case(
        "out",
        "train-out-readonly",
        lambda o, w: train(str(o), w, "--out", str(_readonly(w) / "run")),
        "not writable",
        skip="root writes to read-only directories" if ROOT else None,
    ),
    # labels that become file names
    Case("labels", "absolute", lambda o, w: _compare(w, f"{w}/x={o}"), "not a plain name"),
    Case("labels", "dotdot-path", lambda o, w: _compare(w, f"../../x={o}"), "not a plain name", subprocess=True),
    Case("labels", "dot", lambda o, w: _compare(w, f".={o}"), "not a plain name"),
    Case("labels", "dotdot", lambda o, w: _compare(w, f"..={o}"), "not a plain name"),
    Case("labels", "space", lambda o, w: _compare(w, f"a b={o}"), "not a plain name"),
    Case("labels", "reserved-config", lambda o, w: _compare(w, f"config={o}"), "is reserved"),
    Case("labels", "duplicate", lambda o, w: _compare(w, f"a={o}", f"a={o}"), "names 'a' twice"),
    Case("labels", "duplicate-case", lambda o, w: _compare(w, f"A={o}", f"a={o}"), "twice"),
    Case(
        "labels",
        "duplicate-similarity",
        lambda o, w: [
            "probe",
            "similarity",
            "--task",
            "rules",
            "--models",
            f"a={o}",
            f"a={o}",
            "--out",
            str(w / "sim"),
        ],
        "twice",
    ),
    # numeric settings out of range
    Case("numeric", "temperature-negative", lambda o, w: _eval(str(o), "--temperature", "-1"), "temperature=-1.0"),
    Case("numeric", "temperature-nan", lambda o, w: _eval(str(o), "--temperature", "nan"), "temperature=nan"),
    Case("numeric", "temperature-inf", lambda o, w: _eval(str(o), "--temperature", "inf"), "temperature=inf"),
    Case("numeric", "temperature-zero", lambda o, w: _eval(str(o), "--temperature", "0"), "temperature=0.0"),
    Case("numeric", "max-new-tokens-zero", lambda o, w: _eval(str(o), "--max-new-tokens", "0"), "max_new_tokens=0"),
    Case(
        "numeric", "max-new-tokens-negative", lambda o, w: _eval(str(o), "--max-new-tokens", "-3"), "max_new_tokens=-3"
    ),
    Case("numeric", "samples-zero", lambda o, w: _eval(str(o), "--samples", "0"), "samples=0"),
    Case("numeric", "n-zero", lambda o, w: _eval(str(o), "--n", "0"), "evaluation set is empty"),
    Case(
        "numeric",
        "pretrain-steps-zero",
        lambda o, w: ["pretrain", "--task", "rules", "--out", str(w / "o"), "--steps", "0"],
        "steps=0",
    ),
    Case(
        "numeric",
        "pretrain-n-zero",
        lambda o, w: ["pretrain", "--task", "rules", "--out", str(w / "o"), "--n", "0"],
        "evaluation set is empty",
    ),
    Case("numeric", "demo-steps-zero", lambda o, w: ["demo", "--out", str(w / "demo"), "--steps", "0"], "--steps 0"),
    Case("numeric", "demo-layers-zero", lambda o, w: ["demo", "--out", str(w / "demo"), "--layers", "0"], "--layers 0"),
    Case(
        "numeric",
        "eval-context-too-long",
        lambda o, w: _eval(str(edit_config(copy_org(o, w), max_position_embeddings=16))),
        "exceeds the model's maximum length",
    ),
    # a task whose words the organism's vocabulary lacks
    Case(
        "vocab",
        "eval-jsonl",
        lambda o, w: ["eval", "--task", "jsonl", "--option", f"path={jsonl_task(w)}", "--model", str(o)],
        "lacks tokens",
    ),
    Case(
        "vocab",
        "train-jsonl",
        lambda o, w: train(str(o), w, "--task", "jsonl", "--set", f"task_options.path={jsonl_task(w)}"),
        "lacks tokens",
    ),
]


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=f"{c.cls}-{c.name}", marks=[pytest.mark.skip(reason=c.skip)] if c.skip else []) for c in CASES],
)
def test_bad_input_exit_2_one_line_nothing_written(case, tiny_rules_organism, tmp_path, monkeypatch, capsys):
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    argv = case.argv(Path(tiny_rules_organism), ws)
    before = snapshot(ws, Path(tiny_rules_organism))
    try:
        code, err = _run(case, argv, ws, capsys)
        after = snapshot(ws, Path(tiny_rules_organism))
    finally:
        if (ws / "ro").exists():
            (ws / "ro").chmod(0o755)  # let pytest clean up
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert [ln for ln in lines if ln.startswith("error:")] == lines[-1:], lines
    if case.subprocess:
        assert len(lines) == 1, lines  # end to end: nothing else on stderr (no warning, no progress bar)
    assert case.needle in lines[-1], lines[-1]
    changed = sorted(set(before) ^ set(after) | {k for k in before if k in after and before[k] != after[k]})
    assert not changed, changed


EXPECTED = {
    "corrupt": 9,
    "missing": 5,
    "shape": 5,
    "pickle": 2,
    "device": 2,
    "out": 13,
    "labels": 9,
    "numeric": 13,
    "vocab": 2,
}


def test_case_counts_by_class():
    """The numbers the closing note states (the read-only cases are skipped when running as root)."""
    counts = Counter(c.cls for c in CASES)
    print(
        "reliability cases by class:",
        dict(counts),
        "total",
        sum(counts.values()),
        "subprocess",
        sum(c.subprocess for c in CASES),
    )
    assert dict(counts) == EXPECTED
    assert all(any(c.subprocess for c in CASES if c.cls == k) for k in ("corrupt", "pickle", "device", "labels"))
