"""The real-model path on the fixture zoo (mechopd.testing.zoo): Qwen3, Qwen2.5 and Llama-3 architectures with
byte-level BPE tokenizers and their chat-template behaviour, built once per machine (cached by content hash)."""

from __future__ import annotations

import pytest

from mechopd.testing.zoo import Zoo, build_zoo


@pytest.fixture(scope="session")
def zoo() -> Zoo:
    return build_zoo()
