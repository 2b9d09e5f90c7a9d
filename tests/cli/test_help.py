"""Every help screen renders: `mechopd --help`, `mechopd VERB --help` and `mechopd probe NAME --help`.

The verbs are read from the parser and the probes from the probe registry, so a new verb or probe is covered without
touching this file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from mechopd.cli import main, make_parser
from mechopd.probes.registry import probes


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subparsers of ``parser`` (name -> parser), read from its subparsers action."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1, "expected exactly one subcommand group"
    return dict(actions[0].choices)


VERBS = sorted(_subcommands(make_parser()))
PROBES = [spec.name for spec in probes()]


def _help(capsys, argv: list[str]) -> str:
    """Run ``mechopd ARGV`` in-process as the console script does; assert exit 0 and return what it printed."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 0, f"mechopd {' '.join(argv)} exited {exc.value.code}: {err}"
    assert out.startswith("usage: mechopd"), out[:200]
    return out


def test_the_parser_has_the_verbs_and_probes_we_enumerate():
    assert {"demo", "train", "eval", "probe", "figures"} <= set(VERBS)  # the enumeration is not empty or wrong
    probe_parser = _subcommands(make_parser())["probe"]
    assert sorted(_subcommands(probe_parser)) == sorted(PROBES)
    assert PROBES, "no probe is registered"


def test_top_level_help_as_typed():
    """The console entry point itself (a fresh interpreter), not only main(): the first command a newcomer types."""
    r = subprocess.run([sys.executable, "-m", "mechopd.cli", "--help"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: mechopd")
    for verb in VERBS:
        assert verb in r.stdout


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_help(capsys, verb):
    out = _help(capsys, [verb, "--help"])
    assert f"usage: mechopd {verb}" in out
    assert "-h, --help" in out


@pytest.mark.parametrize("name", PROBES)
def test_every_probe_help(capsys, name):
    out = _help(capsys, ["probe", name, "--help"])
    assert f"usage: mechopd probe {name}" in out
    assert "--run" in out  # the shared setup flags are there


def test_help_keeps_percent_signs_literal(capsys):
    """A '%' in a verb's help is shown as typed (argparse %-formats help strings; the CLI escapes them)."""
    out = _help(capsys, ["--help"])
    assert "%%" not in out
