"""The cache argument's name follows the installed transformers (``cache`` from 5.24 on, ``past_key_values`` before):
the wrong name lands in ``**kwargs`` and is ignored silently, so a shared-prefix prefill would run without its prefix
(found by running the vLLM tests, whose venv pins transformers 5.19)."""

from __future__ import annotations

import pytest

from mechopd.generate.prefix import cache_kwargs, output_cache


class _New:
    def forward(self, input_ids=None, cache=None, **kwargs): ...


class _Old:
    def forward(self, input_ids=None, past_key_values=None, **kwargs): ...


class _Neither:
    def forward(self, input_ids=None, **kwargs): ...


def test_cache_argument_name_is_read_from_the_signature(tiny_qwen3):
    marker = object()
    assert cache_kwargs(_New(), marker) == {"cache": marker}
    assert cache_kwargs(_Old(), marker) == {"past_key_values": marker}
    with pytest.raises(TypeError, match="shared_prefix: off"):
        cache_kwargs(_Neither(), marker)
    assert set(cache_kwargs(tiny_qwen3, marker)) <= {"cache", "past_key_values"}  # the installed version's name


def test_output_cache_reads_either_attribute():
    class New:
        cache, past_key_values = "new", None

    class Old:
        past_key_values = "old"

    assert output_cache(New()) == "new" and output_cache(Old()) == "old"
