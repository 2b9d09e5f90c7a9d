"""Fixtures of the unit tests: the synthetic demo run the plot tests draw from."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechopd import plots

from .plotting_run import make_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("plots_run"))


@pytest.fixture(scope="module")
def drawn(run_dir: Path) -> dict[str, list[Path]]:
    return plots.draw_all(run_dir)
