"""Task options from the command line (issue 56 item 2): a value out of range, of the wrong type, or an unknown key
is one ``error:`` line naming the task, the key and the fix, exit 2; ``--help`` lists every task's options."""

from __future__ import annotations

import pytest

from mechopd.cli import main


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("min_len=0", ["rules task", "min_len=0", "an integer >= 1 and <= 64"]),  # out of range
        ("min_len=abc", ["rules task", "min_len='abc'", "not a valid int"]),  # wrong type
        ("bogus=1", ["rules task", "unknown option 'bogus'", "rule, min_len, max_len, family, context_prob"]),
    ],
)
def test_a_bad_task_option_is_one_line_and_exit_2(option, words, capsys):
    assert main(["eval", "--model", "unused", "--task", "rules", "--option", option]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    assert all(w in err[0] for w in words), err[0]


def test_a_cross_field_rule_is_one_line(capsys):
    assert main(["eval", "--model", "unused", "--task", "sokoban", "--option", "min_moves=9"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "sokoban task: min_moves=9 exceeds step_budget=5" in line


@pytest.mark.parametrize("verb", [["train"], ["eval"], ["probe", "similarity"]])
def test_help_lists_every_tasks_options(verb, capsys):
    with pytest.raises(SystemExit):
        main([*verb, "--help"])
    out = capsys.readouterr().out
    assert "task options (--option KEY=VALUE" in out
    for line in ("rules: rule (str, default 'shift:1'); min_len (int, >= 1 and <= 64, default 3)", "sokoban: "):
        assert line in out
