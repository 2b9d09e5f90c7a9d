"""The real-model path on the fixture zoo (mechopd.testing.zoo): Qwen3, Qwen2.5 and Llama-3 architectures with
byte-level BPE tokenizers and their chat-template behaviour, built once per machine (cached by content hash)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechopd.testing.zoo import FAMILIES, Zoo, build_zoo

# What "no context" renders to, per family (README: a template that inserts a default system prompt is refused until
# no_context_system is set). Qwen2.5 and Llama-3 always render a system block; Qwen3 does not.
NO_CONTEXT_SYSTEM = {"qwen3": None, "qwen2": "", "llama": ""}
TEMPLATE_KWARGS = {"qwen3": {"enable_thinking": False}, "qwen2": {}, "llama": {"date_string": "26 Jul 2024"}}


@pytest.fixture(scope="session")
def zoo() -> Zoo:
    return build_zoo()


def render_sets(family: str) -> list[str]:
    """``--set`` overrides that make a train run of `family` explicit about what "no context" is."""
    out = [f"chat_template_kwargs.{k}={str(v).lower() if isinstance(v, bool) else v}"
           for k, v in TEMPLATE_KWARGS[family].items()]
    if NO_CONTEXT_SYSTEM[family] is not None:
        out.append(f"no_context_system={NO_CONTEXT_SYSTEM[family]}")
    return out


def cli(*args: str | Path) -> int:
    """`mechopd ...` in-process (the same `main` the console script runs); asserts exit code 0."""
    from mechopd.cli import main

    rc = main([str(a) for a in args])
    assert rc == 0, f"mechopd {' '.join(map(str, args))} exited {rc}"
    return rc


__all__ = ["FAMILIES", "NO_CONTEXT_SYSTEM", "TEMPLATE_KWARGS", "cli", "render_sets"]
