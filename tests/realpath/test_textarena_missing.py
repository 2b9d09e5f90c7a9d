"""Without the optional textarena package, ``engine: textarena`` is one clear error naming the install command."""

from __future__ import annotations

import sys

import pytest

from mechopd.core.errors import ConfigError
from mechopd.tasks.base import get_task


@pytest.mark.parametrize("game", ["frozenlake", "sokoban"])
def test_engine_textarena_without_the_package(game, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "textarena", None)  # import textarena -> ImportError
    with pytest.raises(ConfigError, match=r"pip install mechopd\[textarena\]"):
        get_task(game, engine="textarena")
    from mechopd.cli import main

    assert main(["eval", "--model", "unused", "--task", game, "--option", "engine=textarena"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "pip install mechopd[textarena]" in err[0]


def test_engine_option_is_validated():
    with pytest.raises(ConfigError, match="engine='gym'"):
        get_task("sokoban", engine="gym")
    assert get_task("sokoban", engine="embedded").name == "sokoban"
