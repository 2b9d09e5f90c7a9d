"""Shared helpers of the real-path tests: the CLI in-process, the render settings per family."""

from __future__ import annotations

from pathlib import Path

from mechopd.testing.zoo import FAMILIES

# What "no context" renders to, per family (README: a template that inserts a default system prompt is refused until
# no_context_system is set). Qwen2.5 and Llama-3 always render a system block; Qwen3 does not.
NO_CONTEXT_SYSTEM = {"qwen3": None, "qwen2": "", "llama": ""}
TEMPLATE_KWARGS = {"qwen3": {"enable_thinking": False}, "qwen2": {}, "llama": {"date_string": "26 Jul 2024"}}


def render_sets(family: str) -> list[str]:
    """``--set`` overrides that make a train run of `family` explicit about what "no context" is."""
    out = [
        f"chat_template_kwargs.{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in TEMPLATE_KWARGS[family].items()
    ]
    if NO_CONTEXT_SYSTEM[family] is not None:
        out.append(f"no_context_system={NO_CONTEXT_SYSTEM[family]}")
    return out


def cli(*args: str | Path) -> int:
    """`mechopd ...` in-process (the same `main` the console script runs); asserts exit code 0."""
    from mechopd.cli import main

    rc = main([str(a) for a in args])
    assert rc == 0, f"mechopd {' '.join(map(str, args))} exited {rc}"
    return rc


def jsonl_sets(zoo, **extra) -> list[str]:
    """``--set task_options.K=V`` flags of the zoo's JSONL task (4-6 new tokens: the models are random)."""
    out = []
    for k, v in zoo.jsonl_options(max_new_tokens=6, **extra).items():
        out += ["--set", f"task_options.{k}={v}"]
    return out


__all__ = ["FAMILIES", "NO_CONTEXT_SYSTEM", "TEMPLATE_KWARGS", "cli", "jsonl_sets", "render_sets"]
