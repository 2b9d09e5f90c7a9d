# %% [markdown]
# # Hooking into a checkpoint: both views, one layer, one patch
#
# A notebook in "percent" format (`# %%` cells; `probes/interactive.ipynb` holds the same cells). It also runs as a
# script: `python probes/interactive.py [CHECKPOINT_DIR]` (or `MECHOPD_CHECKPOINT=DIR`). Without a checkpoint it
# builds a tiny random organism (Qwen3 from a config, the rules task's word-level tokenizer) so that it runs anywhere
# in seconds; point it at `runs/<name>/final` to look at a trained student. Task options as `mechopd eval` takes
# them: `--option KEY=VALUE` (repeated) or `MECHOPD_TASK_OPTIONS` (JSON), e.g. a JSONL task on a real model:
# `MECHOPD_TASK=jsonl python probes/interactive.py DIR --option path=qa.jsonl --option context_file=ctx.txt`
# (in a notebook: set TASK and TASK_OPTIONS in the next cell).
#
# 1. render a few items of the task in both views (no context x, context c) with the same response ids y;
# 2. cache the residual stream of both views at the response tokens (`capture_views`);
# 3. compare one layer token by token, then every layer (`two_view_cosine`);
# 4. the probes themselves, on the same items: the logit lens per view (`mechopd probe lens`) and activation patching
#    between the views (`mechopd probe patching`), then one patch by hand with the capture/edit primitive (`Trace`).

# %%
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from mechopd.core.config_parse import parse_options
from mechopd.models import load_model, load_tokenizer
from mechopd.probes.capture import capture_views, forward
from mechopd.probes.items import make_batches
from mechopd.probes.lens import lens
from mechopd.probes.patching import patching
from mechopd.probes.view_cosine import token_cosine, two_view_cosine
from mechopd.tasks.base import get_task

torch.manual_seed(0)
TASK = os.environ.get("MECHOPD_TASK", "rules")
pairs = [v for flag, v in zip(sys.argv[1:], sys.argv[2:]) if flag == "--option"]
TASK_OPTIONS = {**json.loads(os.environ.get("MECHOPD_TASK_OPTIONS") or "{}"), **parse_options(pairs, "--option")}
args = [a for a in sys.argv[1:] if Path(a).is_dir()]  # a kernel's own argv (-f ...) is ignored
CHECKPOINT = args[0] if args else os.environ.get("MECHOPD_CHECKPOINT")


def tiny_organism(out_dir: str) -> str:
    """A random tiny Qwen3 with the organism tokenizer, saved like a trainer checkpoint."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from mechopd.organisms.tokenizer import build_tokenizer

    tok = build_tokenizer(get_task(TASK, **TASK_OPTIONS).vocab())  # an organism task's words (JSONL: pass a model)
    cfg = Qwen3Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=len(tok),
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
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
model, tok, task = load_model(CHECKPOINT), load_tokenizer(CHECKPOINT), get_task(TASK, **TASK_OPTIONS)
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
# ## The logit lens per view
# Each site's residual decoded through the final norm and the LM head, in both views, at the scored positions (the
# last prompt token and every response token but the last): KL(p_c || p_x) by depth. At `final_norm` it is the output
# KL between the views. Same function as `mechopd probe lens`.

# %%
for row in lens(model, items, temperature=task.temperature).rows:
    print(f"{row['site']:>22}  KL(p_c || p_x) {row['kl_c_x']:.5f}  top-1 agree {row['top1_agree']:.3f}")

# %% [markdown]
# ## Patch the context view into the no-context view
# `recovered` = 1 - KL(p_c || p_x patched) / KL(p_c || p_x): replacing the no-context view's activation at the scored
# positions (only those: the two prompts differ in length) by the context view's. `resid` is the residual at the site,
# `attn` / `mlp` that layer's attention / MLP output. Same function as `mechopd probe patching`.

# %%
rows = patching(model, items, temperature=task.temperature).rows
for row in rows:
    if row["direction"] == "c_to_x":
        print(f"{row['site']:>22} {row['component']:>5}  recovered {row['recovered']:+.3f}")
final = next(r for r in rows if (r["site"], r["component"], r["direction"]) == ("final_norm", "resid", "c_to_x"))
assert abs(final["recovered"] - 1) < 1e-6, "patching the final norm must reproduce the context view exactly"

# %% [markdown]
# ## One patch by hand
# `forward(model, batch, view, capture=[...], edit={...}, positions=...)` is the one capture/edit primitive the probes
# use (`mechopd.probes.capture.Trace`, baukit-TraceDict-like). Here: the context view's layer output, written into
# the no-context view.

# %%
site = f"layers.{LAYER}.resid_post"
donor = forward(model, batch, "c", capture=[site], positions="predict")
patched = forward(model, batch, "x", edit={site: donor[site]}, positions="predict")
clean = forward(model, batch, "x", positions="predict")
moved = (patched.logits - clean.logits)[batch.response_mask].abs().max()
print(f"patching {site}: the no-context logits moved by up to {float(moved):.4f}")
print("done")
