"""The two-view core: render the no-context view (x, y) and the context view (c, x, y) for the SAME response ids y.

How the views are aligned (read this before touching a consumer):

* Each view is ``[left pad | prompt | response | right pad]``. Prompts are LEFT-padded to a common width ``P`` per
  view, so response token ``t`` of every row sits at column ``P + t`` in that view (column for column across rows).
  Responses are right-padded to a common width ``R`` (``response_mask`` marks real tokens).
* The logits that PREDICT response token ``t`` are at column ``P + t - 1``; the hidden state OF response token ``t`` is
  at column ``P + t``. `TwoViewBatch.response_logits` / `response_hidden` return ``[batch, R, ...]`` tensors in which
  index ``t`` means the same response token in both views, so teacher (context view), student (no-context view) and
  student (context view) line up index for index.
* ``position_ids`` come from the attention mask (``cumsum - 1``), so left padding does not shift positions; a
  right-padded layout (``layout="right"``, for tests and for users who need it) gives the same response logits.
* Response ids are asserted identical in both views: only the prompt differs.

Context placement (``RenderSpec.placement``): ``"system"`` (a system message through the chat template), ``"user"``
(spliced in front of the user turn: ``c + "\\n\\n" + x``), or raw text when the tokenizer has no chat template
(``c + "\\n\\n" + x + "\\n"``). What "no context" renders to is explicit: no system message unless
``no_context_system`` says otherwise, and a chat template that silently inserts a default system prompt (Qwen2.5's
"You are Qwen...", Llama-3's date header) is refused until ``no_context_system`` is set.

Pinned renders (a chat template that reads the date, a template that drops the context): `mechopd.evaluation.pinning`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import torch

from mechopd.core.errors import ConfigError, TaskError
from mechopd.core.options import PLACEMENTS


@dataclass
class RenderSpec:
    """How prompts are rendered into the two views.

    placement:          "system" (c as a system message) or "user" (c spliced before the user turn).
    no_context_system:  None = the no-context view has NO system message (refused if the template injects a default
                        one); a string (``""`` included) = an explicit system message present in the no-context view;
                        the context view then uses ``no_context_system + "\\n\\n" + c`` ("system" placement, or just
                        ``c`` when it is ``""``) or keeps it unchanged ("user" placement).
    chat_template_kwargs: extra variables for the template (e.g. ``{"enable_thinking": False}`` for Qwen3,
                        ``{"date_string": "26 Jul 2024"}`` for Llama-3 so the date header is fixed).
    """

    placement: str = "system"
    no_context_system: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"render placement {self.placement!r} is not one of {PLACEMENTS}")
        if isinstance(self.chat_template_kwargs, dict):
            self.chat_template_kwargs = template_flags(self.chat_template_kwargs)


BOOL_WORDS = {"0": False, "1": True, "false": False, "true": True}


def template_flags(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Chat-template variables given as the text ``0/1/true/false`` (any case) read as booleans: templates test a
    flag with ``is false`` / ``is true`` (Qwen3's ``enable_thinking is false``), which ``"0"`` never passes, so
    ``--chat-template-kwarg enable_thinking=0`` (kept as text, `config_parse.template_options`) turns thinking off. A
    number stays a number (``max_turns: 1`` renders "1", not "True")."""
    out = {}
    for key, value in kwargs.items():
        word = value.strip().lower() if isinstance(value, str) else None
        out[key] = BOOL_WORDS[word] if word in BOOL_WORDS else value
    return out


def _messages(prompt: str, context: str | None, spec: RenderSpec) -> list[dict[str, str]]:
    base_sys = spec.no_context_system
    if spec.placement == "system":
        if context is None:
            system = base_sys
        else:
            system = context if not base_sys else base_sys + "\n\n" + context
        user = prompt
    else:
        system = base_sys
        user = prompt if context is None else context + "\n\n" + prompt
    msgs = [] if system is None else [{"role": "system", "content": system}]
    return msgs + [{"role": "user", "content": user}]


def render_prompt_text(tokenizer: Any, prompt: str, context: str | None, spec: RenderSpec) -> str:
    """The prompt string of one view (context=None: no-context view), ending where the response begins."""
    if getattr(tokenizer, "chat_template", None):
        if spec.placement == "system" and spec.no_context_system is None and _refuses_system(tokenizer, spec):
            spec = dataclasses.replace(spec, placement="user")  # Gemma-2: said once in the log
        text = tokenizer.apply_chat_template(
            _messages(prompt, context, spec), tokenize=False, add_generation_prompt=True, **spec.chat_template_kwargs
        )
        if context is None and spec.no_context_system is None:
            _refuse_default_system(text, prompt, tokenizer)
        return text
    body = prompt if context is None else context + "\n\n" + prompt
    if spec.no_context_system:
        body = spec.no_context_system + "\n\n" + body
    return body + "\n"


_SYSTEM_REFUSED: dict[str, bool] = {}  # chat template -> it raises on a system message (and renders without one)


def _refuses_system(tokenizer: Any, spec: RenderSpec) -> bool:
    """Whether the tokenizer's chat template refuses a system role (Gemma-2 raises "System role not supported"); the
    first time, a warning says that the context goes into the user turn instead (placement user)."""
    template = str(tokenizer.chat_template)
    if template not in _SYSTEM_REFUSED:
        import jinja2

        def renders(msgs: list[dict[str, str]]) -> bool:
            try:
                tokenizer.apply_chat_template(
                    msgs, tokenize=False, add_generation_prompt=True, **spec.chat_template_kwargs
                )
            except jinja2.TemplateError:
                return False
            return True

        user = [{"role": "user", "content": "q"}]
        refused = renders(user) and not renders([{"role": "system", "content": "c"}, *user])
        _SYSTEM_REFUSED[template] = refused
        if refused:
            logging.getLogger("mechopd").warning(
                "placement system: the chat template of %s refuses a system role, so the context goes at the top of "
                "the user turn (placement user) in every view; set placement: user to say so in the config",
                getattr(tokenizer, "name_or_path", "") or "this tokenizer",
            )
    return _SYSTEM_REFUSED[template]


def _refuse_default_system(text: str, prompt: str, tokenizer: Any) -> None:
    """A template that renders a system block for a conversation without one would make 'no context' implicit."""
    head = text[: text.find(prompt)] if prompt in text else text
    if "system" in head:
        name = getattr(tokenizer, "name_or_path", "") or "this tokenizer"
        raise TaskError(
            f"the chat template of {name} inserts a default system prompt when no system message is given; "
            "set no_context_system (train: --set no_context_system=TEXT; eval and probe: --no-context-system TEXT; "
            "'' for an explicit empty system message, or the default text) so that what 'no context' means is "
            "explicit and identical in training and evaluation"
        )


def render_prompt_ids(tokenizer: Any, prompt: str, context: str | None, spec: RenderSpec) -> list[int]:
    """Token ids of one view's prompt (special tokens included exactly once)."""
    text = render_prompt_text(tokenizer, prompt, context, spec)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    # A chat template already wrote BOS (if any) into the text; raw text gets the tokenizer's own special tokens.
    return tokenizer(text, add_special_tokens=not has_template)["input_ids"]


def render_prompt_ids_batch(tokenizer: Any, pairs: list[tuple[str, str | None]], spec: RenderSpec) -> list[list[int]]:
    """`render_prompt_ids` of every (prompt, context) pair, tokenized in ONE batched call (the same ids: a fast
    tokenizer encodes each text of a batch independently; used where thousands of prompts are rendered at once)."""
    if not pairs:
        return []
    texts = [render_prompt_text(tokenizer, prompt, context, spec) for prompt, context in pairs]
    has_template = bool(getattr(tokenizer, "chat_template", None))
    return tokenizer(texts, add_special_tokens=not has_template)["input_ids"]


@dataclass
class TwoViewBatch:
    """Both views of a batch of (prompt, context, response) triples, response ids identical in both.

    input_ids_x, attention_mask_x, position_ids_x: ``[batch, Lx]`` the no-context view (x, y).
    input_ids_c, attention_mask_c, position_ids_c: ``[batch, Lc]`` the context view (c, x, y).
    response_ids:  ``[batch, R]`` (right-padded with pad_id); response_mask ``[batch, R]`` bool.
    cols_x, cols_c: ``[batch, R]`` column of response token t in each view (``P + t`` in the left layout).
    """

    input_ids_x: torch.Tensor
    attention_mask_x: torch.Tensor
    position_ids_x: torch.Tensor
    input_ids_c: torch.Tensor
    attention_mask_c: torch.Tensor
    position_ids_c: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    cols_x: torch.Tensor
    cols_c: torch.Tensor
    layout: str = "left"

    @property
    def batch_size(self) -> int:
        return self.response_ids.shape[0]

    def view(self, which: str) -> dict[str, torch.Tensor]:
        """Model kwargs of one view: ``which`` is "x" (no context) or "c" (context)."""
        if which not in ("x", "c"):
            raise ValueError(f"view must be 'x' or 'c', got {which!r}")
        return {
            "input_ids": getattr(self, f"input_ids_{which}"),
            "attention_mask": getattr(self, f"attention_mask_{which}"),
            "position_ids": getattr(self, f"position_ids_{which}"),
        }

    def _take(self, tensor: torch.Tensor, which: str, shift: int) -> torch.Tensor:
        cols = (self.cols_x if which == "x" else self.cols_c) + shift  # [B, R]
        if self.layout == "left":  # contiguous: a slice, no gather
            start = int(cols[0, 0])
            return tensor[:, start : start + cols.shape[1]]
        idx = cols.clamp(min=0, max=tensor.shape[1] - 1)
        return tensor[torch.arange(tensor.shape[0], device=tensor.device)[:, None], idx]

    def response_logits(self, logits: torch.Tensor, which: str) -> torch.Tensor:
        """``[batch, L, V]`` -> ``[batch, R, V]``: index t holds the logits that predict response token t."""
        return self._take(logits, which, -1)

    def response_hidden(self, hidden: torch.Tensor, which: str) -> torch.Tensor:
        """``[batch, L, d]`` -> ``[batch, R, d]``: index t holds the hidden state at response token t."""
        return self._take(hidden, which, 0)

    def to(self, device: torch.device | str) -> TwoViewBatch:
        moved: dict[str, Any] = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()
        }
        return TwoViewBatch(**moved)


def pad_id(tokenizer: Any) -> int:
    """The padding id (pad, else eos); a tokenizer with neither raises `TaskError`."""
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id
    if pad is None:
        raise TaskError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token before batching")
    return int(pad)


def _assemble(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad: int, layout: str):
    """One view's tensors. Returns ids, mask, positions, response columns (each built from one flat list)."""
    B, R = len(prompts), max((len(r) for r in responses), default=0)
    P = max(len(p) for p in prompts)
    L = P + R
    starts = [P - len(p) if layout == "left" else 0 for p in prompts]  # where each prompt begins
    ns = [len(p) + len(r) for p, r in zip(prompts, responses)]
    flat = chain.from_iterable(
        [pad] * s + [*p, *r] + [pad] * (L - s - n) for s, n, p, r in zip(starts, ns, prompts, responses)
    )
    ids = _long(flat, B * L).view(B, L)
    at = torch.arange(L)
    begin, end = torch.tensor(starts).view(B, 1), torch.tensor([s + n for s, n in zip(starts, ns)]).view(B, 1)
    mask = ((at >= begin) & (at < end)).long()
    cols = torch.tensor([s + len(p) for s, p in zip(starts, prompts)], dtype=torch.long).view(B, 1) + torch.arange(R)
    if layout == "right":  # padded response slots point past the real tokens; keep them in range
        cols = cols.clamp(max=L - 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions, cols


def _long(values: Iterable[int], count: int) -> torch.Tensor:
    """A flat int64 tensor of `count` Python ints (through numpy: ~5x faster than ``torch.tensor`` of a list)."""
    return torch.from_numpy(np.fromiter(values, dtype=np.int64, count=count))


def build_two_view_batch(
    tokenizer: Any,
    prompts: Sequence[str],
    contexts: Sequence[str],
    responses: Sequence[Sequence[int]],
    spec: RenderSpec,
    *,
    layout: str = "left",
    max_length: int | None = None,
) -> TwoViewBatch:
    """Render both views of each (prompt x, context c, response ids y) and batch them aligned on y.

    prompts, contexts: ``[batch]`` strings; responses: ``[batch]`` lists of token ids (already generated or encoded).
    max_length: the model's maximum; a context view longer than it raises a `TaskError` naming both lengths (the
    context is never silently truncated).
    """
    if not (len(prompts) == len(contexts) == len(responses)) or not prompts:
        raise ValueError("prompts, contexts and responses must be non-empty and of equal length")
    if layout not in ("left", "right"):
        raise ValueError(f"layout must be 'left' or 'right', got {layout!r}")
    px = [render_prompt_ids(tokenizer, p, None, spec) for p in prompts]
    pc = [render_prompt_ids(tokenizer, p, c, spec) for p, c in zip(prompts, contexts)]
    return assemble_two_views(px, pc, responses, pad_id(tokenizer), layout=layout, max_length=max_length)


def assemble_two_views(
    prompt_ids_x: Sequence[Sequence[int]],
    prompt_ids_c: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
    *,
    layout: str = "left",
    max_length: int | None = None,
) -> TwoViewBatch:
    """`build_two_view_batch` from already-tokenized prompts of both views (the trainer caches prompt ids)."""
    if max_length is not None:
        for p, r in zip(prompt_ids_c, responses):
            if len(p) + len(r) > max_length:
                raise TaskError(
                    f"context + prompt ({len(p)} tokens) plus response ({len(r)} tokens) exceeds the model's maximum "
                    f"length {max_length}; shorten the context or prompt, or lower max_new_tokens "
                    "(the context is never truncated silently)"
                )
    ids_x, m_x, pos_x, cols_x = _assemble(prompt_ids_x, responses, pad_id, layout)
    ids_c, m_c, pos_c, cols_c = _assemble(prompt_ids_c, responses, pad_id, layout)
    R = cols_x.shape[1]
    B = len(responses)
    resp = _long(chain.from_iterable([*r] + [pad_id] * (R - len(r)) for r in responses), B * R).view(B, R)
    rmask = torch.arange(R) < torch.tensor([len(r) for r in responses], dtype=torch.long).view(B, 1)
    batch = TwoViewBatch(ids_x, m_x, pos_x, ids_c, m_c, pos_c, resp, rmask, cols_x, cols_c, layout)
    _assert_same_response(batch)
    return batch


def _assert_same_response(b: TwoViewBatch) -> None:
    """The response ids must be identical in both views; only the prompt differs."""
    rx = torch.where(b.response_mask, b.response_hidden(b.input_ids_x.unsqueeze(-1), "x").squeeze(-1), -1)
    rc = torch.where(b.response_mask, b.response_hidden(b.input_ids_c.unsqueeze(-1), "c").squeeze(-1), -1)
    ry = torch.where(b.response_mask, b.response_ids, -1)
    assert torch.equal(rx, ry) and torch.equal(rc, ry), "response ids differ between the two views"


def left_pad(prompt_ids: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts for batched generation: ``ids [batch, P]``, ``attention_mask [batch, P]``."""
    P = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), P), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        if p:
            ids[i, P - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, P - len(p) :] = 1
    return ids, mask
