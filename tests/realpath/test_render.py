"""Where the context goes on real chat templates: the system-prompt and user-prefix placements, and the render-spec
rule (a template that silently inserts a default system prompt is refused until no_context_system is set)."""

from __future__ import annotations

import json

import pytest

from mechopd.core.errors import TaskError
from mechopd.core.views import RenderSpec, render_prompt_text
from mechopd.models import load_tokenizer
from mechopd.testing.zoo import QWEN_DEFAULT_SYSTEM

from .helpers import FAMILIES, NO_CONTEXT_SYSTEM, TEMPLATE_KWARGS, cli, jsonl_sets, render_sets

ONE_STEP = [
    "--steps",
    "1",
    "--batch-size",
    "2",
    "--lr",
    "1e-3",
    "--no-progress",
    "--set",
    "max_new_tokens=4",
    "--set",
    "pool_size=4",
]


def test_qwen25_default_system_prompt_is_refused_until_no_context_system_is_set(zoo, tmp_path, capsys):
    from mechopd.cli import main

    tok = load_tokenizer(zoo.student("qwen2"))
    with pytest.raises(TaskError, match="no_context_system"):
        render_prompt_text(tok, "Which drug?", None, RenderSpec("system"))
    out = tmp_path / "refused"
    rc = main(
        [
            "train",
            "--task",
            "jsonl",
            "--student",
            str(zoo.student("qwen2")),
            *ONE_STEP,
            *jsonl_sets(zoo),
            "--out",
            str(out),
        ]
    )
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "no_context_system" in errors[0]
    assert not (out / "final").exists()
    # explicit empty system message: both views carry a system block, no default text anywhere
    spec = RenderSpec("system", "")
    x = render_prompt_text(tok, "Which drug?", None, spec)
    c = render_prompt_text(tok, "Which drug?", "CTX", spec)
    assert QWEN_DEFAULT_SYSTEM not in x + c
    assert x.startswith("<|im_start|>system\n<|im_end|>") and c.startswith("<|im_start|>system\nCTX<|im_end|>")
    # the default text made explicit: the context view keeps it and appends the context
    spec = RenderSpec("system", QWEN_DEFAULT_SYSTEM)
    assert render_prompt_text(tok, "q", "CTX", spec).startswith(f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}\n\nCTX")


def test_llama3_date_header_is_refused_then_pinned(zoo):
    tok = load_tokenizer(zoo.student("llama"))
    with pytest.raises(TaskError, match="no_context_system"):
        render_prompt_text(tok, "q", None, RenderSpec("system", chat_template_kwargs={"date_string": "26 Jul 2024"}))
    spec = RenderSpec("system", "", {"date_string": "26 Jul 2024"})
    x, c = render_prompt_text(tok, "q", None, spec), render_prompt_text(tok, "q", "CTX", spec)
    assert "Today Date: 26 Jul 2024\n\n<|eot_id|>" in x and "Today Date: 26 Jul 2024\n\nCTX<|eot_id|>" in c


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("placement", ["system", "user"])
def test_context_placement_in_both_views(zoo, family, placement):
    tok = load_tokenizer(zoo.student(family))
    ctx = zoo.context_file.read_text().strip()
    spec = RenderSpec(placement, NO_CONTEXT_SYSTEM[family], dict(TEMPLATE_KWARGS[family]))
    x = render_prompt_text(tok, "Which drug?", None, spec)
    c = render_prompt_text(tok, "Which drug?", ctx, spec)
    user_header = "<|start_header_id|>user<|end_header_id|>\n\n" if family == "llama" else "<|im_start|>user\n"
    assert ctx not in x and c.count(ctx) == 1
    head, _, turn = c.partition(user_header)
    assert (ctx in head) == (placement == "system") and (turn.startswith(ctx + "\n\nWhich drug?")) == (
        placement == "user"
    )
    if placement == "user":  # only the user turn differs
        assert c.replace(ctx + "\n\n", "", 1) == x


@pytest.mark.parametrize("family", FAMILIES)
def test_train_and_eval_with_the_context_as_a_user_turn_prefix(zoo, family, tmp_path):
    sets = [x for s in render_sets(family) for x in ("--set", s)]
    out = tmp_path / "user"
    cli(
        "train",
        "--task",
        "jsonl",
        "--method",
        "nca",
        "--student",
        zoo.student(family),
        *ONE_STEP,
        *jsonl_sets(zoo, placement="user"),
        *sets,
        "--out",
        out,
    )
    assert "placement: user" in (out / "config.yaml").read_text()
    opts = [
        x for k, v in zoo.jsonl_options(max_new_tokens=4, placement="user").items() for x in ("--option", f"{k}={v}")
    ]
    nocs = [] if NO_CONTEXT_SYSTEM[family] is None else ["--no-context-system", NO_CONTEXT_SYSTEM[family]]
    cli("eval", "--model", out / "final", "--task", "jsonl", *opts, "--n", "2", *nocs, "--out", tmp_path / "e.json")
    assert json.loads((tmp_path / "e.json").read_text())["settings"]["placement"] == "user"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("placement", ["system", "user"])
def test_prerendered_pool_equals_rendering_each_prompt(zoo, family, placement):
    """A trainer renders its pool once, batched (`pinning.prerender`); the ids must be those of `render_prompt_ids`
    one prompt at a time, in both views, on every family's BPE tokenizer and chat template."""
    from types import SimpleNamespace

    from mechopd.core.views import render_prompt_ids
    from mechopd.evaluation.pinning import prerender

    tok = load_tokenizer(zoo.student(family))
    spec = RenderSpec(placement, NO_CONTEXT_SYSTEM[family], TEMPLATE_KWARGS[family])
    pool = [
        SimpleNamespace(prompt=f"Question {i}: which drug treats {'x' * i}?", context=f"Rule {i % 3}.")
        for i in range(7)
    ]
    pool.append(pool[0])  # a repeated item renders once
    cache: dict = {}
    prerender(tok, pool, spec, cache)
    assert len(cache) == 2 * 7
    for ex in pool:
        for ctx in (None, ex.context):
            assert cache[(ex.prompt, ctx)] == render_prompt_ids(tok, ex.prompt, ctx, spec)


def test_prerender_skips_a_pool_past_the_cache_bound(monkeypatch):
    """Past half the trainer's prompt cache nothing is rendered ahead (the per-step path renders those prompts)."""
    from types import SimpleNamespace

    from mechopd.evaluation import pinning

    monkeypatch.setattr(pinning, "PROMPT_CACHE", 8)
    pool = [SimpleNamespace(prompt=f"p{i}", context="c") for i in range(5)]  # 10 keys > 8 // 2
    cache: dict = {}
    pinning.prerender(object(), pool, RenderSpec("user"), cache)
    assert cache == {}
