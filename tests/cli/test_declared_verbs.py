"""`mechopd pretrain` and `mechopd demo` are declared like train (issue 56): their flags are generated from
`OrganismConfig` / `DemoConfig` (help, range, default), a value out of range is one line and exit 2, and every verb's
arguments come from declarations through the one flag generator (`mechopd.core.options.add_flags`)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from mechopd.cli import main, make_parser
from mechopd.cli.common import COMMANDS
from mechopd.cli.study_cmd import _demo_facts
from mechopd.cli.train_cmd import _pretrain_facts
from mechopd.core.options import flag_help

CLI = Path(__file__).resolve().parents[2] / "mechopd" / "cli"


def _verb_help(verb: str) -> str:
    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(sub.choices[verb].format_help().split())  # argparse's line wrapping undone


@pytest.mark.parametrize("verb, facts", [("pretrain", _pretrain_facts), ("demo", _demo_facts)])
def test_the_flags_and_their_help_come_from_the_declarations(verb, facts):
    text = _verb_help(verb)
    declared = facts()
    assert len(declared) >= 7
    for f in declared:
        assert f"{f.flag} {f.metavar or f.name.upper()}" in text or f"{f.flag} [BOOL]" in text, f.flag
        assert " ".join(flag_help(f).replace("%%", "%").split()) in text, f.flag  # help, default and range as declared


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["pretrain", "--steps", "0"], "steps=0 is invalid: it must be an integer >= 1"),
        (["pretrain", "--seed", "-1"], "seed=-1 is invalid"),
        (["pretrain", "--layers", "49"], "num_layers=49 is invalid: it must be an integer >= 1 and <= 48"),
        (["pretrain", "--num-kv-heads", "0"], "num_kv_heads=0 is invalid"),
        (["pretrain", "--arch", "gpt2"], "arch='gpt2' is unknown; choose one of qwen3, llama"),
        (["demo", "--steps", "0"], "demo --steps 0 is invalid: it must be an integer >= 1"),
        (["demo", "--seeds", "0"], "demo --seeds 0 is invalid"),
        (["demo", "--workers", "0"], "demo --workers 0 is invalid"),
        (["demo", "--job-threads", "0"], "demo --job-threads 0 is invalid"),
        (["demo", "--batch-size", "-2"], "demo --batch-size -2 is invalid"),
        (["demo", "--layers", "49"], "demo --layers 49 is invalid: it must be an integer >= 1 and <= 48"),
        (["demo", "--seed", "-1"], "demo --seed -1 is invalid"),
        (["demo", "--task", "chess"], "demo --task chess is unknown; choose one of rules, frozenlake, sokoban"),
        (["run", "x.yaml", "--workers", "0"], "run --workers 0 is invalid"),
    ],
)
def test_out_of_range_is_one_line_and_exit_2(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and needle in err, err
    assert not (tmp_path / "o").exists()  # refused before any work


def test_one_verb_table_builds_the_parser():
    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(COMMANDS) and len(COMMANDS) >= 10
    assert all(sub.choices[name].description == verb.help for name, verb in COMMANDS.items())


def test_at_most_15_hand_written_add_argument_calls_in_cli():
    """The issue's bound: a verb's arguments are declared (option fields) and generated, not hand-written."""
    calls = [
        (path.name, node.lineno)
        for path in sorted(CLI.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
    ]
    assert len(calls) <= 15, calls
