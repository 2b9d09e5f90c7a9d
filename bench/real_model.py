"""A real checkpoint for bench/train_step.py (``--model DIR``): the same comparison on a real vocabulary and depth.

Two edits, both for the bench only (a copy of the model is written to the bench's temp dir; the user's is not touched):

* Every response must be exactly --new-tokens long in every variant (the ratios compare equal work). A real model
  ends a reply when it samples a stop id; here the LM-head rows of the stop ids (`generate.settings.stop_ids`: the
  tokenizer's eos, the chat end-of-turn token, the generation config's eos ids) are set to 0 (untied from the input
  embedding first when tied), so those ids score a logit of 0 against the top logits of a trained model (tens):
  their probability is ~e^-20 per step. The bench prints each variant's mean response length and checks that they
  are equal, so a reply that still ends early is seen.
* A chat template that inserts a default system prompt when none is given (SmolLM2's, Qwen2.5's) renders the same ids
  for the bare loop and TRL (which send no system message) as for mechopd with ``no_context_system`` set to that
  default text, which mechopd requires to be explicit (README, "Where the context goes"). `default_system` reads the
  text off the template.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SENTINEL = "\x00mechopd-bench-sentinel\x00"


def default_system(tok: Any) -> str | None:
    """The system text the chat template inserts for a conversation with none (None: it inserts none).

    Rendered twice, without a system message and with a sentinel one; the sentinel's surroundings locate the default.
    """
    user = [{"role": "user", "content": "Q"}]
    plain = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    marked = tok.apply_chat_template(
        [{"role": "system", "content": SENTINEL}, *user], tokenize=False, add_generation_prompt=True
    )
    before, after = marked.split(SENTINEL)
    if not plain.startswith(before):
        return None
    rest = plain[len(before) :]
    end = rest.find(after)
    return rest[:end] if end > 0 else None


def prepare_real(src: str | Path, out: Path) -> tuple[Path, str | None]:
    """Copy `src` to `out` with the stop ids' LM-head rows zeroed (untied if tied); returns (out, default system)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mechopd.generate.settings import stop_ids

    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    head = model.get_output_embeddings()
    if head.weight is model.get_input_embeddings().weight:  # tied: give the head its own copy before editing it
        head.weight = torch.nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
        if hasattr(model.config, "get_text_config"):
            model.config.get_text_config().tie_word_embeddings = False
    stops = stop_ids(tok, model)
    with torch.no_grad():
        head.weight[stops] = 0.0
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(
        f"real model {src}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"vocabulary {head.weight.shape[0]}, {model.config.num_hidden_layers} layers; LM-head rows of stop ids "
        f"{stops} zeroed (responses run to --new-tokens)"
    )
    return out, default_system(tok)
