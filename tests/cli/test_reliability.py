"""The README's promise as a test: every class of bad input of the reliability issue, typed at the CLI, exits with code
2 and exactly one ``error:`` line (no traceback), and the directory tree is the same afterwards: nothing written and
nothing removed, inside or outside ``--out`` (names, sizes and mtimes of every file and directory, recursively).

Cases run in-process (``mechopd.cli.main``; any exception that is not a `MechopdError` propagates and fails the case),
and a few run as ``python -m mechopd.cli`` subprocesses to prove the whole path end to end (stderr is exactly one line).
Each case corrupts its own copy of the session's tiny rules organism inside a fresh workspace that is also the cwd, so
default output paths (``runs/...``) would show up in the snapshot too.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from mechopd.cli import main

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------------------- helpers
def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every path under `roots` (recursive) -> (kind, size, mtime_ns); directories too (an entry created and removed
    again changes its directory's mtime)."""
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = Path(dirpath, name)
                st = p.lstat()
                out[str(p)] = ("d" if p.is_dir() else "f", 0 if p.is_dir() else st.st_size, st.st_mtime_ns)
        st = root.lstat()
        out[str(root)] = ("d", 0, st.st_mtime_ns)
    return out


def copy_org(org: Path, ws: Path, name: str = "org") -> Path:
    dst = ws / name
    shutil.copytree(org, dst)
    return dst


def edit_config(d: Path, **changes) -> Path:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def more_layers(d: Path, extra: int) -> Path:
    cfg = json.loads((d / "config.json").read_text())
    n = cfg["num_hidden_layers"] + extra
    return edit_config(d, num_hidden_layers=n, layer_types=(cfg.get("layer_types") or ["full_attention"])[:1] * n)


def poison(d: Path, value: float, tensor: str = "model.norm.weight") -> Path:
    """Overwrite one float32 tensor's bytes with `value` under an intact header."""
    f = d / "model.safetensors"
    raw = bytearray(f.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    start, stop = json.loads(raw[8 : 8 + n])[tensor]["data_offsets"]
    raw[8 + n + start : 8 + n + stop] = struct.pack("<f", value) * ((stop - start) // 4)
    f.write_bytes(bytes(raw))
    return d


def truncate(d: Path, keep: float) -> Path:
    f = d / "model.safetensors"
    raw = f.read_bytes()
    f.write_bytes(raw[: int(len(raw) * keep)])
    return d


class _Trap:
    """Unpickling this creates a file next to it: the snapshot proves the .bin was never unpickled."""

    def __init__(self, target: Path):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


def pickle_only(org: Path, ws: Path) -> Path:
    d = copy_org(org, ws, "binonly")
    (d / "model.safetensors").unlink()
    with open(d / "pytorch_model.bin", "wb") as fh:
        pickle.dump({"model.norm.weight": _Trap(ws / "UNPICKLED")}, fh)
    return d


def jsonl_task(ws: Path, words: tuple[str, str, str] = ("zyzzyva quux?", "blorp", "frobnicate")) -> Path:
    data = ws / "qa.jsonl"
    data.write_text(json.dumps({"prompt": words[0], "answer": words[1], "context": words[2]}) + "\n")
    return data


# ------------------------------------------------------------------------------------------------------ the cases
@dataclass(frozen=True)
class Case:
    cls: str  # the class of bad input (the groups)
    name: str
    argv: Callable[[Path, Path], list[str]]  # (organism fixture, workspace) -> argv; prepares the workspace
    needle: str  # a piece of the one error line
    subprocess: bool = False
    skip: str | None = None


def _eval(model: str, *more: str) -> list[str]:
    return ["eval", "--task", "rules", "--model", model, "--n", "2", *more]


def _train(student: str, ws: Path, *more: str) -> list[str]:
    return [
        "train",
        "--student",
        student,
        "--out",
        str(ws / "run"),
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--no-progress",
        *more,
    ]


ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
CUDA = torch.cuda.is_available()


def _readonly(ws: Path) -> Path:
    d = ws / "ro"
    d.mkdir()
    d.chmod(0o555)
    return d


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
        lambda o, w: _train(str(truncate(copy_org(o, w), 0.9)), w),
        "truncated or not a safetensors",
    ),
    Case("corrupt", "nan-eval", lambda o, w: _eval(str(poison(copy_org(o, w), float("nan")))), "NaN/inf"),
    Case("corrupt", "inf-train", lambda o, w: _train(str(poison(copy_org(o, w), float("inf"))), w), "NaN/inf"),
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
        lambda o, w: _train(str(_rm(copy_org(o, w), "model.safetensors")), w),
        "holds no weights",
    ),
    Case("missing", "missing-shard", lambda o, w: _eval(str(_sharded_missing(copy_org(o, w)))), "is missing"),
    Case("missing", "no-config", lambda o, w: _eval(str(_rm(copy_org(o, w), "config.json"))), "has no config.json"),
    Case("missing", "no-dir", lambda o, w: _eval(str(w / "nope")), "does not exist"),
    # config.json shapes that do not match the weights
    Case("shape", "more-layers-eval", lambda o, w: _eval(str(more_layers(copy_org(o, w), 2))), "lacks"),
    Case("shape", "more-layers-train", lambda o, w: _train(str(more_layers(copy_org(o, w), 1)), w), "lacks"),
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
    Case("pickle", "bin-only-train", lambda o, w: _train(str(pickle_only(o, w)), w), "never unpickles"),
    # devices this machine lacks
    Case(
        "device",
        "cuda-missing" if not CUDA else "cuda-index",
        lambda o, w: _train(str(o), w, "--set", "device=cuda" if not CUDA else "device=cuda:99"),
        "CUDA device",
        subprocess=True,
    ),
    Case("device", "bogus-device", lambda o, w: _train(str(o), w, "--set", "device=gpu0"), "not a device name"),
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
    Case("out", "train-out-file", lambda o, w: _train(str(o), w, "--out", str(_file(w))), "is a file"),
    Case(
        "out",
        "train-out-under-file",
        lambda o, w: _train(str(o), w, "--out", str(_file(w) / "run")),
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
        lambda o, w: _train(str(o), w, "--out", str(_readonly(w) / "run")),
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
        lambda o, w: _train(str(o), w, "--task", "jsonl", "--set", f"task_options.path={jsonl_task(w)}"),
        "lacks tokens",
    ),
]


def _compare(ws: Path, *pairs: str) -> list[str]:
    return ["eval", "--task", "rules", "--n", "2", "--out", str(ws / "cmp"), "--compare", *pairs]


def _file(ws: Path, name: str = "afile") -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    p = ws / name
    p.write_text("precious\n")
    return p


def _cut(d: Path, name: str) -> Path:
    (d / name).write_text((d / name).read_text()[:100])
    return d


def _rm(d: Path, name: str) -> Path:
    (d / name).unlink()
    return d


def _bad_header(d: Path) -> Path:
    f = d / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[8:16] = b"{garbag!"
    f.write_bytes(bytes(raw))
    return d


def _sharded_missing(d: Path) -> Path:
    """A sharded layout whose index names a shard that is not there."""
    f = d / "model.safetensors"
    n = struct.unpack("<Q", f.read_bytes()[:8])[0]
    names = [k for k in json.loads(f.read_bytes()[8 : 8 + n]) if k != "__metadata__"]
    f.rename(d / "model-00001-of-00002.safetensors")
    weight_map = {k: "model-00001-of-00002.safetensors" for k in names}
    weight_map[names[-1]] = "model-00002-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


# ---------------------------------------------------------------------------------------------------------- runner
def _run(case: Case, argv: list[str], ws: Path, capsys) -> tuple[int, str]:
    if not case.subprocess:
        code = main(argv)
        return code, capsys.readouterr().err
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    res = subprocess.run(
        [sys.executable, "-m", "mechopd.cli", *argv], cwd=ws, env=env, capture_output=True, text=True, timeout=300
    )
    return res.returncode, res.stderr


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


# --------------------------------------------------------------------------------------------- the checks can fail
def test_controls_a_good_command_passes_and_is_seen_writing(tiny_rules_organism, tmp_path, monkeypatch, capsys):
    """The same organism, uncorrupted, passes every load check, and the snapshot sees the report it writes."""
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert main(_eval(str(tiny_rules_organism), "--out", str(tmp_path / "r.json"))) == 0
    assert "error:" not in capsys.readouterr().err
    assert set(snapshot(tmp_path)) - set(before) == {
        str(tmp_path / "r.json"),
        str(tmp_path / "r.csv"),
        str(tmp_path / ".r.fileset"),
    }  # the set's manifest (FileSet)


def test_controls_the_pickle_trap_fires_when_unpickled(tiny_rules_organism, tmp_path):
    """The .bin of the pickle cases really would write a file if anything unpickled it."""
    d = pickle_only(Path(tiny_rules_organism), tmp_path)
    with open(d / "pytorch_model.bin", "rb") as fh:
        pickle.load(fh)  # noqa: S301 - the point of the test
    assert (tmp_path / "UNPICKLED").exists()


@pytest.mark.parametrize("command", ["pretrain", "train", "eval", "figures", "demo"])
def test_every_flag_has_a_help_line_and_a_metavar(command):
    """`mechopd COMMAND --help` explains every flag: a help text, and a named placeholder for each value."""
    import argparse

    from mechopd.cli import make_parser

    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
    assert flags
    for action in flags:
        name = "/".join(action.option_strings) or action.dest
        assert action.help and len(action.help) > 10, name
        if action.nargs != 0:  # takes a value: a placeholder that says what kind (not the SHORT_TASK dest)
            assert action.metavar and not str(action.metavar).startswith("SHORT_"), name


@pytest.mark.parametrize("arch,tied", [("qwen3", True), ("llama", False), ("qwen2", False)])
def test_controls_sharded_and_untied_checkpoints_pass(organism_tokenizer, tmp_path, arch, tied):
    """Real checkpoints are sharded and often untied: the load checks accept them and load the same weights."""
    from mechopd.models import check_model, load_model
    from tests.conftest import tiny_model

    model = tiny_model(organism_tokenizer, arch=arch)
    if not tied:
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() + 1.0)
    model.save_pretrained(tmp_path / "m", max_shard_size="20KB")
    assert (tmp_path / "m" / "model.safetensors.index.json").exists()
    check_model(tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
