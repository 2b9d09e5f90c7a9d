"""Pinned renders: a run renders every prompt identically on any day and any machine.

`pin_render` is called by every verb before any model loads. A chat template that reads today's date (``strftime_now``, Llama-3's "Today Date") has its ``date_string``
pinned at the run's start to that day and recorded (config.yaml / the eval report); a template that still renders
differently on another day is refused. `pin_render` also refuses template variables the template never reads, a
template that raises or renders nothing, and a template that drops the context (both views identical: the context
could have no effect by construction).

`check_fits` is the one length rule (train, eval, probes): the longest context view plus ``max_new_tokens`` within the
model's ``max_position_embeddings``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from mechopd.config import DATE_PIN, TrainConfig
from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.views import RenderSpec, render_prompt_ids, render_prompt_ids_batch, render_prompt_text

DATE_FORMAT = "%d %b %Y"  # Llama-3's own format ("26 Jul 2024")
AMBIENT = ("strftime_now",)  # template globals whose value depends on when the template renders
# what apply_chat_template itself passes (a chat_template_kwargs entry of that name would collide with it)
RESERVED = (
    "messages",
    "add_generation_prompt",
    "tools",
    "documents",
    "continue_final_message",
    "bos_token",
    "eos_token",
    "raise_exception",
    "namespace",
    "dict",
)


def template_variables(tokenizer: Any) -> set[str] | None:
    """The variables a chat template reads from outside (jinja2's undeclared variables), parsed by the environment
    transformers renders it with (its ``{% generation %}`` tag included); None without a template."""
    import jinja2
    import jinja2.meta

    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        env = _compile_jinja_template(template).environment
    except Exception:  # noqa: BLE001 - another transformers layout, or a template it cannot compile (render says why)
        env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        names = set(jinja2.meta.find_undeclared_variables(env.parse(template)))
    except jinja2.TemplateSyntaxError as e:
        raise TaskError(
            f"the chat template of {_name(tokenizer)} does not parse ({e.message}, line {e.lineno}); fix the template"
        ) from None
    return names | {g for g in AMBIENT if re.search(rf"\b{g}\b", template)}  # env globals are not "undeclared"


@contextlib.contextmanager
def frozen_today(day: _dt.datetime) -> Iterator[None]:
    """Render as if today were `day` (transformers' ``strftime_now`` reads ``datetime.now()`` at render time)."""
    from transformers.utils import chat_template_utils as ctu

    real = getattr(ctu, "datetime", None)
    if real is None:  # another transformers layout: nothing to freeze
        yield
        return

    class _Frozen(real):  # type: ignore[misc, valid-type]
        @classmethod
        def now(cls, tz: Any = None) -> _dt.datetime:
            return day

    ctu.datetime = _Frozen  # type: ignore[misc]  # monkeypatch: transformers' module-level datetime class
    try:
        yield
    finally:
        ctu.datetime = real  # type: ignore[misc]  # restores the class replaced above


def pin_render(tokenizer: Any, spec: RenderSpec, prompt: str, context: str) -> tuple[RenderSpec, str | None]:
    """The spec a run renders with on any day, checked on one example (prompt, context); returns (spec, note).

    Refuses (TaskError / ConfigError) everything the module docstring lists; the note says what was pinned (None:
    nothing). A resumed run passes its recorded date in ``spec.chat_template_kwargs`` (`config.adopt_pins`).
    """
    names = template_variables(tokenizer)
    kwargs, note = dict(spec.chat_template_kwargs), None
    if names is None:
        if kwargs:
            raise ConfigError(
                f"chat_template_kwargs {sorted(kwargs)} given but the tokenizer has no chat template "
                "(prompts are raw text); drop them"
            )
        return spec, None
    readable = names - set(AMBIENT) - set(RESERVED)
    unknown = sorted(set(kwargs) - readable)
    if unknown:
        raise ConfigError(
            f"chat_template_kwargs: the chat template does not take {', '.join(unknown)} (a typo, or "
            f"a name mechopd sets itself); it reads: {', '.join(sorted(readable)) or 'nothing'}"
        )
    if names & set(AMBIENT) and DATE_PIN in names and DATE_PIN not in kwargs:
        day = _today().strftime(DATE_FORMAT)
        kwargs[DATE_PIN] = day
        note = (
            f"render: the chat template reads today's date; pinned chat_template_kwargs.{DATE_PIN}={day!r} "
            "(recorded with the run)"
        )
    spec = replace(spec, chat_template_kwargs=kwargs)
    views = {
        day: _both_views(tokenizer, spec, prompt, context, _dt.datetime(*day)) for day in ((2000, 1, 1), (2001, 2, 3))
    }
    if len(set(views.values())) > 1:
        raise TaskError(
            f"the chat template of {_name(tokenizer)} renders differently on different days (it reads the "
            f"date) and mechopd cannot pin it; pass its date variable in chat_template_kwargs or fix the "
            "template"
        )
    x, c = next(iter(views.values()))
    if not x.strip() or not c.strip():
        raise TaskError(f"the chat template of {_name(tokenizer)} renders an empty prompt; fix the template")
    if x == c:
        raise TaskError(
            f"the chat template of {_name(tokenizer)} renders both views identically: it drops the "
            f"context (placement {spec.placement!r}), so the context could have no effect; use "
            "placement user (probe: --placement user) or a template that renders system messages"
        )
    return spec, note


def _today() -> _dt.datetime:
    """Today by the clock the template itself reads (transformers' ``strftime_now``)."""
    from transformers.utils import chat_template_utils as ctu

    return getattr(ctu, "datetime", _dt.datetime).now()


def _name(tokenizer: Any) -> str:
    return getattr(tokenizer, "name_or_path", "") or "this tokenizer"


def _both_views(tokenizer: Any, spec: RenderSpec, prompt: str, context: str, day: _dt.datetime) -> tuple[str, str]:
    import jinja2

    try:
        with frozen_today(day):
            return (
                render_prompt_text(tokenizer, prompt, None, spec),
                render_prompt_text(tokenizer, prompt, context, spec),
            )
    except (jinja2.TemplateError, TypeError, ValueError) as e:
        hint = " (use placement user: the context spliced into the user turn)" if spec.placement == "system" else ""
        raise TaskError(
            f"the chat template of {_name(tokenizer)} fails to render a prompt: "
            f"{' '.join(str(e).split()) or type(e).__name__}{hint}"
        ) from None


def check_fits(
    tokenizer: Any,
    examples: Sequence[Any],
    spec: RenderSpec,
    max_new_tokens: int,
    limit: int | None,
    others: Any = None,
    rendered: dict[tuple[str, str | None], list[int]] | None = None,
) -> None:
    """The one length rule of every verb: the longest context view plus `max_new_tokens` fits the model's
    `limit` (max_position_embeddings); the context is never truncated silently. `others`: a task whose other
    contexts (`Task.other_contexts`) of the examples reach the model too (following, the follow term).
    `rendered`: ids already rendered, ``{(prompt, context): ids}`` (`prerender`); the context views are read there."""
    if not limit:
        return
    ids = rendered if rendered is not None else {}
    longest, what = max(
        (len(ids.get((ex.prompt, ex.context)) or render_prompt_ids(tokenizer, ex.prompt, ex.context, spec)), "context")
        for ex in examples
    )
    if others is not None:
        longest, what = max(
            [(longest, what)]
            + [
                (len(render_prompt_ids(tokenizer, prompt, ctx, spec)), f"other context {label!r}")
                for label, prompt, ctx in _longest_views(examples, others)
            ]
        )
    if longest + max_new_tokens > limit:
        raise TaskError(
            f"{what} + prompt ({longest} tokens) plus max_new_tokens {max_new_tokens} exceeds the "
            f"model's maximum length {limit}; shorten the context or prompt, or lower max_new_tokens "
            "(the context is never truncated silently)"
        )


def _longest_views(examples: Sequence[Any], task: Any, per_context: int = 3) -> list[tuple[str, str, str]]:
    """(label, prompt, context) to render for the other contexts of `examples`: per distinct context text, the
    `per_context` longest prompts (in characters) that meet it. Context and prompt are separate messages, so the
    longest view of a context is one with a long prompt; a task whose contexts are shared by many items (rules: one
    per rule) costs a few renders, not one per item and context (11x the main check on 1024 items)."""
    by_context: dict[str, list[tuple[int, str, str]]] = {}
    for ex in examples:
        for oc in task.other_contexts(ex):
            by_context.setdefault(oc.context, []).append((len(ex.prompt), ex.prompt, oc.label))
    return [
        (label, prompt, ctx)
        for ctx, views in by_context.items()
        for _, prompt, label in sorted(set(views), reverse=True)[:per_context]
    ]


PROMPT_CACHE = 65536  # prompts a trainer keeps rendered (`Trainer._render`); at most half are rendered ahead


def prerender(
    tokenizer: Any, examples: Sequence[Any], spec: RenderSpec, into: dict[tuple[str, str | None], list[int]]
) -> None:
    """Both views' prompt ids of every example into ``into`` (``{(prompt, context or None): ids}``), tokenized in
    batches (`render_prompt_ids_batch`: the ids of `render_prompt_ids`); nothing when the two views of `examples`
    exceed half of PROMPT_CACHE (a pool that large is rendered per step instead). A training run renders its pool once,
    before the first step, instead of twice per step (the length check needs the context views anyway)."""
    keys = list(dict.fromkeys(k for ex in examples for k in ((ex.prompt, None), (ex.prompt, ex.context))))
    if len(keys) + len(into) > PROMPT_CACHE // 2:
        return
    todo = [k for k in keys if k not in into]
    for i in range(0, len(todo), 1024):
        part = todo[i : i + 1024]
        into.update(zip(part, render_prompt_ids_batch(tokenizer, part, spec)))


def train_render(
    tokenizer: Any,
    task: Any,
    pool: Sequence[Any],
    cfg: Any,
    max_new_tokens: int,
    model_config: Any,
    rendered: dict[tuple[str, str | None], list[int]] | None = None,
) -> tuple[RenderSpec, str | None]:
    """A training run's pinned spec (`pin_render` on its first item), recorded in ``cfg.chat_template_kwargs`` (so
    config.yaml and training.json hold it), and `check_fits` over its pool (single-turn tasks; a game's later moves
    are checked per batch) — all before any model loads. `rendered`: filled with both views' ids of the pool
    (`prerender`; single-turn tasks), the trainer's prompt cache."""
    spec = RenderSpec(task.placement, cfg.no_context_system, dict(cfg.chat_template_kwargs))
    spec, note = pin_render(tokenizer, spec, pool[0].prompt, pool[0].context)
    cfg.chat_template_kwargs = dict(spec.chat_template_kwargs)
    if not task.is_game:
        if rendered is not None:
            prerender(tokenizer, pool, spec, rendered)
        check_fits(
            tokenizer,
            pool,
            spec,
            max_new_tokens,
            getattr(model_config, "max_position_embeddings", None),
            task if getattr(cfg, "follow_weight", TrainConfig.follow_weight) else None,
            rendered,
        )  # the follow term's rollouts under c′ too
    return spec, note
