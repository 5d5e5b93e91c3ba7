#!/usr/bin/env bash
# The llama.cpp tests (tests/llamacpp, marker `llamacpp`) in their own environment, .venv-llamacpp
# ($LLAMACPP_VENV): llama-cpp-python compiles llama.cpp when it installs (about 5-11 minutes on 2 cores the
# first time; pip keeps the built wheel in its cache, so a later run of this script installs in seconds), which
# the other environments should not pay for. Set-up included, from the project's own files:
#   pip install -e '.[llamacpp]'   llama-cpp-python 0.3.36 + gguf (torch stays the pinned CPU wheel)
# The tests write GGUF files of synthetic WIDE checkpoints (wide_export/export/gguf.py) and compare llama.cpp's
# greedy tokens and logits with transformers on the same folders (docs/cpu.md, "llama.cpp on the same weights").
# The GGUF writer's own tests need only gguf and run in .venv-test (tests/export/test_gguf.py).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LLAMACPP_VENV:-.venv-llamacpp}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e '.[llamacpp]' 'pytest>=8' 'pytest-timeout>=2.3' 'filelock>=3.12'
"$VENV/bin/python" -m pytest -m llamacpp tests/llamacpp tests/bench/test_generate_bench.py -p no:cacheprovider "$@"
