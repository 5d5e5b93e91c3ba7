#!/usr/bin/env bash
# device-dry-run.sh: scripts/gpu-check.sh --dry-run in an environment like the device's, without a GPU (CI runs it).
#
# The device image (library: device/README.md) has python3 with a CUDA torch, triton 3.6.0, numpy 2.4, pytest,
# rich, typer, cmake and nvcc, and no tensorrt, polygraphy or tritonclient. Here: the test environment's Python
# (CPU torch) with triton 3.6.0 and numpy 2.4 first on PYTHONPATH (.ci-triton36, installed by this script), and
# the packages the device lacks made unimportable (.ci-device-hide: each an __init__ that raises ImportError).
# Then gpu-check.sh --dry-run: the AOT cubins of every sm_80 and sm_90 spec built with Triton 3.6.0 and the C
# runtime linked (Python warnings are errors, nvcc's too), the gpu tests collected, each benchmark started with
# --dry-run; and the cubins' resource report (no spill) under 3.6.0. Fails when any of it fails.
#   PYTHON: the interpreter (default .venv-test/bin/python, else python3); OUT: results (build/device-dry-run).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv-test/bin/python" ]; then PYTHON=$ROOT/.venv-test/bin/python; else PYTHON=python3; fi
fi
TRITON36=$ROOT/.ci-triton36 HIDE=$ROOT/.ci-device-hide
OUT=${OUT:-$ROOT/build/device-dry-run} BUILD=${BUILD_DIR:-$ROOT/build/device-dry-run/build}
t0=$(date +%s)
if ! PYTHONPATH=$TRITON36 "$PYTHON" -c 'import numpy, triton; assert (triton.__version__, numpy.__version__[:3]) == ("3.6.0", "2.4")' 2>/dev/null; then
  "$PYTHON" -m pip install --quiet --target "$TRITON36" --no-deps 'triton==3.6.0' 'numpy==2.4.*'
fi
rm -rf "$HIDE"
for m in tensorrt tensorrt_rtx polygraphy tritonclient pytriton; do  # what the device image lacks
  mkdir -p "$HIDE/$m"
  echo "raise ImportError('$m is not on the device image (scripts/device-dry-run.sh)')" > "$HIDE/$m/__init__.py"
done
export PYTHONPATH="$HIDE:$TRITON36" PYTHON OUT BUILD_DIR=$BUILD CUDA_ARCH=${CUDA_ARCH:-80;90} PYTHONWARNINGS=error
"$PYTHON" - <<'PY'
import importlib, numpy, triton
assert (triton.__version__, numpy.__version__[:3]) == ("3.6.0", "2.4"), (triton.__version__, numpy.__version__)
for m in ("tensorrt", "tensorrt_rtx", "polygraphy", "tritonclient", "pytriton"):
    try:
        importlib.import_module(m)
    except ImportError:
        continue
    raise SystemExit(f"{m} is importable: the dry run would not be like the device")
print(f"device-like environment: triton {triton.__version__}, numpy {numpy.__version__}; "
      "tensorrt, tensorrt_rtx, polygraphy, tritonclient, pytriton hidden")
PY
rc=0
# The build stage on 2 CPU cores (the device has 16): a longer limit than the device's 75 s.
T_BUILD=${T_BUILD:-900} T_TESTS=${T_TESTS:-300} T_BENCH=${T_BENCH:-120} T_E2E=${T_E2E:-120} \
  scripts/gpu-check.sh --dry-run || rc=$?
"$PYTHON" -m wide_export.kernels.report --build-dir "$BUILD" --check > "$OUT/report.txt" 2>&1 || rc=$?
tail -n 2 "$OUT/report.txt"
echo "device dry run: $([ $rc = 0 ] && echo ok || echo FAILED) in $(( $(date +%s) - t0 )) s"
exit $rc
