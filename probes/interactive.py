# %% [markdown]
# # Hooking into a checkpoint: both views, one layer, one patch
#
# A notebook in "percent" format (`# %%` cells; `probes/interactive.ipynb` holds the same cells). It also runs as a
# script: `python probes/interactive.py [CHECKPOINT_DIR]` (or `MECHOPD_CHECKPOINT=DIR`). Without a checkpoint it
# builds a tiny random organism (Qwen3 from a config, the rules task's word-level tokenizer) so that it runs anywhere
# in seconds; point it at `runs/<name>/final` to look at a trained student.
#
# 1. render a few items of the task in both views (no context x, context c) with the same response ids y;
# 2. cache the residual stream of both views at the response tokens (`capture_views`);
# 3. compare one layer token by token, then every layer (`two_view_cosine`);
# 4. patch the context view's residual at layer l into the no-context view (same response positions) and watch the
#    next-token distribution move toward the context view's: KL(q_c || q_x) before and after.

# %%
import os
import sys
import tempfile
from pathlib import Path

import torch

from mechopd.models import load_model, load_tokenizer
from mechopd.probes.capture import all_sites, capture_views, patch_response
from mechopd.probes.similarity import make_batches, token_cosine, two_view_cosine
from mechopd.tasks.base import get_task

torch.manual_seed(0)
TASK = os.environ.get("MECHOPD_TASK", "rules")
args = [a for a in sys.argv[1:] if Path(a).is_dir()]  # a kernel's own argv (-f ...) is ignored
CHECKPOINT = args[0] if args else os.environ.get("MECHOPD_CHECKPOINT")


def tiny_organism(out_dir: str) -> str:
    """A random tiny Qwen3 with the organism tokenizer, saved like a trainer checkpoint."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from mechopd.organisms.tokenizer import build_tokenizer

    tok = build_tokenizer(get_task(TASK).vocab())
    cfg = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=len(tok), max_position_embeddings=512,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


if CHECKPOINT is None:
    CHECKPOINT = tiny_organism(tempfile.mkdtemp(prefix="mechopd-organism-"))
print("checkpoint:", CHECKPOINT)

# %% [markdown]
# ## Items and responses
# Responses are sampled greedily from the checkpoint on the no-context view, as the student samples in OPD.

# %%
model, tok, task = load_model(CHECKPOINT), load_tokenizer(CHECKPOINT), get_task(TASK)
items = make_batches(tok, task, n=4, seed=0, batch_size=4, responses_from=model, greedy=True)
batch = next(iter(items))
for ex, resp in zip(items.examples, items.responses):
    print(f"x: {ex.prompt!r}\n   c: {ex.context!r}\n   y: {tok.decode(resp)!r}")

# %% [markdown]
# ## Cache both views
# `caps["x"][site]` and `caps["c"][site]` are `[batch, R, d]`: index t is the same response token in both views.

# %%
caps = capture_views(model, batch)
print({site: tuple(h.shape) for site, h in caps["x"].items()})

# %% [markdown]
# ## Compare one layer, then all of them

# %%
LAYER = len(model.model.layers) // 2
site = f"layers.{LAYER}.resid_post"
cos = token_cosine(caps["x"][site], caps["c"][site])  # [batch, R]
mask = batch.response_mask
for i in range(batch.batch_size):
    print(f"example {i}: per-token cosine at {site}:", [round(v, 3) for v in cos[i][mask[i]].tolist()])
for row in two_view_cosine(model, items).rows:
    print(f"{row['site']:>22}  cos_mean {row['cos_mean']:.4f}  median {row['cos_median']:.4f}")

# %% [markdown]
# ## Patch the context view's residual into the no-context view
# The next-token distribution after response token t (logits at token t's own position), temperature as in rollouts.
# Patching layer l replaces the no-context view's residual at every response token by the context view's; the prompt
# positions keep their own states, so attention to the prompt still sees x alone. Patching the LAST layer makes the
# two distributions identical (a sanity check of the alignment).


# %%
def next_token_logp(which: str, patch_site: str | None = None) -> torch.Tensor:
    """``[batch, R, V]`` log-probabilities after each response token in view `which` (optionally patched)."""
    with torch.inference_mode():
        if patch_site is None:
            logits = model(**batch.view(which)).logits
        else:
            with patch_response(model, batch, which, patch_site, caps["c"][patch_site]):
                logits = model(**batch.view(which)).logits
    return torch.log_softmax(batch.response_hidden(logits, which) / task.temperature, -1)


def kl_c_to_x(logp_c: torch.Tensor, logp_x: torch.Tensor) -> float:
    """Token mean of KL(q_c || q_x) = sum_v q_c(v) (log q_c(v) - log q_x(v)) over real response tokens."""
    kl = (logp_c.exp() * (logp_c - logp_x)).sum(-1)  # [batch, R]
    return float(kl[mask].mean())


logp_c, logp_x = next_token_logp("c"), next_token_logp("x")
before = kl_c_to_x(logp_c, logp_x)
print(f"KL(q_c || q_x) without patching: {before:.4f}")
results = {}
for s in all_sites(model)[1:-1]:
    results[s] = kl_c_to_x(logp_c, next_token_logp("x", s))
    print(f"patch {s:>20}: KL {before:.4f} -> {results[s]:.4f}")
last = all_sites(model)[-2]
assert results[last] < 1e-8, "patching the last layer must reproduce the context view exactly"
print("done")
