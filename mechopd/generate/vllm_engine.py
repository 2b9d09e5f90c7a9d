"""vLLM as the rollout engine (``rollout_engine: vllm``): colocated in the training process, weights synced in place.

What it is: one ``vllm.LLM`` per process, built from the student's checkpoint directory, sharing the device with the
trainer (as TRL's ``vllm_mode="colocate"``). `VllmEngine.sample` has the lean path's contract: prompt ids in,
response ids out (cut after the first stop id, the stop id kept), `max_new_tokens`, temperature dividing the logits,
top-p / top-k off, greedy = temperature 0, one seed per row (``SamplingParams(seed=...)``: a row's draw does not
depend on its batch). The streams differ from the lean path's inverse-CDF uniforms, so sampled ids are the same
DISTRIBUTION, not the same ids; greedy ids are the same ids (tests/vllm).

Weights: after every optimizer step the trainer calls `load_weights(student)`: the student's full parameters (under
FSDP inside ``sharding.gathered``, one all-gather per step) go to vLLM's in-place reload
(``collective_rpc("reload_weights", weights_iterator=...)``: the model's own ``load_weights``, which fuses q/k/v and
gate/up, then start-up's post-load processing; then `_refresh_embeddings` for the tied LM head that reload skips), in
the same process: no checkpoint round trip, no copy on disk. The prefix cache is reset after each load (its
keys/values were computed with the old weights).

Not the same as TRL: vLLM's ``generation_config.json`` defaults are ignored (``generation_config="vllm"``), so the
sampling settings are exactly the config's; prompts go in as token ids (the trainer's own rendering), never text.
vLLM is an optional extra (``pip install mechopd[vllm]``); nothing imports it unless this engine is asked for.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from mechopd.config.sections import ScaleOptions
from mechopd.core.errors import ModelError
from mechopd.core.model_checks import require_vllm
from mechopd.generate.engines import Generation, cut_at_stop

# head sizes vLLM 0.32's CPU attention accepts (vllm/v1/attention/backends/cpu_attn.py: get_supported_head_sizes)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


CPU_KV_CACHE_BYTES = 1 << 30  # the KV cache on a CPU unless gpu_memory_utilization / kv_cache_memory_bytes is set


def head_dim_of(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def check_shape(config: Any, device: str) -> None:
    """vLLM's CPU attention supports a fixed set of head sizes: refuse others with the constraint and the sizes."""
    hd = head_dim_of(config)
    if device == "cpu" and hd not in CPU_HEAD_SIZES:
        raise ModelError(
            f"rollout_engine=vllm: vLLM's CPU attention does not support head_dim {hd} (this model: "
            f"hidden_size {config.hidden_size} / {config.num_attention_heads} heads); supported head "
            f"sizes: {', '.join(map(str, CPU_HEAD_SIZES))}. Use a model whose head_dim is one of them "
            "(organism: `mechopd pretrain --task rules --num-heads 3 --num-kv-heads 1`: head_dim 32) or "
            "rollout_engine=lean"
        )


class VllmEngine:
    """One colocated ``vllm.LLM`` over the checkpoint at `model_dir`; `sample` and `load_weights` (see the module).

    A `engines.RolloutEngine`: sample with it by putting it in the settings,
    ``sampler.sample(model, ids, SamplingSettings(..., engine=VllmEngine(model_dir)), seeds)``."""

    name = "vllm"

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = ScaleOptions.dtype,
        seed: int = 0,
        device: str = "cpu",
        max_model_len: int | None = None,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool = True,
        max_num_seqs: int = 256,
        world: int = 1,
        kv_cache_memory_bytes: int | None = None,
    ):
        require_vllm()
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(str(model_dir))
        check_shape(hf_config, device)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process: weights loadable
        from vllm import LLM

        # vLLM 0.32 on CPU crashes when a SEEDED request's prefill is split over steps ("CPU Generator does not use
        # offset"): the step budget covers the longest prompt, and `sample` submits at most a budget of prompt tokens
        longest = max_model_len if max_model_len else getattr(hf_config, "max_position_embeddings", 4096)
        self.budget = max(4096, int(longest))
        self.max_num_seqs = max_num_seqs
        self.head_rows = int(hf_config.vocab_size)  # ids its logits cover; `sample` masks those >= settings.vocab
        kw: dict[str, Any] = {"max_num_batched_tokens": self.budget}
        if kv_cache_memory_bytes is None and device == "cpu" and gpu_memory_utilization is None:
            # vLLM's CPU budget is share x RAM minus this process's whole RSS (trainer, models, imports): in a
            # training process that leaves nothing ("requested memory for kv (-0.0/0.89 GiB)"); size the KV cache
            kv_cache_memory_bytes = CPU_KV_CACHE_BYTES
        if kv_cache_memory_bytes is not None:
            kw["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        if gpu_memory_utilization is None:  # share of the device memory (CPU: of the RAM) for weights + KV cache
            gpu_memory_utilization = 0.05 if device == "cpu" else 0.3  # GPU: TRL's colocate default
        if world > 1:  # one engine per training process, in the trainer's own process group (TRL's colocate mode)
            kw["distributed_executor_backend"] = "external_launcher"
        self.llm = LLM(
            model=str(model_dir),
            dtype=dtype,
            seed=seed,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            generation_config="vllm",
            skip_tokenizer_init=False,
            **kw,
        )
        self.loads = 0  # how many weight loads this engine received (logged; tests)

    # -- sampling ------------------------------------------------------------------------------------------------------
    def sample(
        self, prompt_ids: Sequence[Sequence[int]], settings: Any, row_seeds: Sequence[int] | None = None
    ) -> Generation:
        """One response per prompt (``[batch]`` lists of ids) under `settings` (a `settings.SamplingSettings`; its
        engine, shared_prefix and batch_size are the sampler's business: vLLM caches prefixes and batches itself).
        Ids ``>= settings.vocab`` are masked out (``allowed_token_ids``) when the head has more rows than that."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if row_seeds is not None and len(row_seeds) != len(prompt_ids):
            raise ValueError(f"row_seeds has {len(row_seeds)} seeds for {len(prompt_ids)} prompts")
        stop, greedy = list(settings.stop), settings.greedy
        vocab = settings.vocab if settings.vocab is not None else self.head_rows
        allowed = list(range(vocab)) if vocab < self.head_rows else None

        def params(row: int) -> Any:
            seed = None if (greedy or row_seeds is None) else int(row_seeds[row]) % (2**63)
            return SamplingParams(
                n=1,
                temperature=0.0 if greedy else float(settings.temperature),
                top_p=1.0,
                top_k=0,
                min_p=0.0,
                max_tokens=int(settings.max_new_tokens),
                stop_token_ids=stop,
                ignore_eos=True,
                seed=seed,
                detokenize=False,
                skip_special_tokens=False,
                allowed_token_ids=allowed,
            )

        outs = []
        for rows in _chunks([len(p) for p in prompt_ids], self.budget, self.max_num_seqs):
            prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in prompt_ids[i]]) for i in rows]
            outs += self.llm.generate(prompts, [params(i) for i in rows], use_tqdm=False)
        return cut_at_stop([list(o.outputs[0].token_ids) for o in outs], stop, 0)

    # -- weights -------------------------------------------------------------------------------------------------------
    def load_weights(self, model: torch.nn.Module) -> None:
        """Copy `model`'s full parameters into vLLM's model in place (call with full weights: FSDP inside gathered)."""
        named = list(_full_named_parameters(model))
        # vLLM's in-place reload: checkpoint-format names through the model's own load_weights, then the same
        # post-load processing as at start-up (the CPU backend repacks linear weights after loading)
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(named), "is_checkpoint_format": True}
        )
        self.llm.apply_model(_refresh_embeddings)
        self.llm.reset_prefix_cache()  # cached keys/values belong to the old weights
        self.loads += 1

    def close(self) -> None:
        """Shut the engine down and free its memory (a second engine in the same process needs it; tests)."""
        self.llm.llm_engine.engine_core.shutdown()  # also tears down vLLM's (and torch's) process group
        del self.llm
        gc.collect()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """vLLM's own parameters (fused names: ``qkv_proj``, ``gate_up_proj``), copied to the CPU (tests)."""
        return self.llm.apply_model(lambda m: {n: p.detach().float().cpu().clone() for n, p in m.named_parameters()})[0]


def _refresh_embeddings(vmodel: torch.nn.Module) -> None:
    """Redo the embeddings' post-load processing (CPU: the LM head's oneDNN copy of its weight).

    vLLM 0.32's layerwise reload skips a TIED LM head ("ParallelLMHead: Failed to load weights"): its weight is the
    embedding's, already updated, but on CPU its matmul runs on a packed copy made at start-up, so without this the
    logits would keep the initial embedding (caught by tests/vllm/test_default_kernels.py).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in vmodel.modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "quant_method"):
            module.quant_method.process_weights_after_loading(module)


def _chunks(lengths: list[int], budget: int, max_rows: int) -> Iterator[range]:
    """Consecutive row ranges whose prompt tokens fit one scheduler step (every prefill whole in its first step)."""
    start, used = 0, 0
    for i, n in enumerate(lengths):
        if i > start and (used + n > budget or i - start >= max_rows):
            yield range(start, i)
            start, used = i, 0
        used += n
    if lengths:
        yield range(start, len(lengths))


def _full_named_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for name, p in model.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):  # a sharded DTensor outside `gathered`: gather it (one collective per tensor)
            t = t.full_tensor()
        yield name, t
