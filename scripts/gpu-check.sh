#!/usr/bin/env bash
# gpu-check.sh: the one prepared GPU session for the WIDE CUDA kernels.
#   1. build plugins/kernels for sm_90 (override: CUDA_ARCH=80 scripts/gpu-check.sh)
#   2. pytest -m gpu tests/kernels      (every kernel vs its PyTorch reference)
#   3. wide-export bench kernels --preset short   (vs cuBLAS; JSON + PNG)
#   4. a short table, printed last
# Results go to $OUT (the device tool's output folder) or ./gpu-results.
# Needs: nvcc, cmake (+ninja), python with a CUDA build of torch, pytest.
# Budget: ~6 minutes on an H100/H200 (build ~1, tests ~2, bench ~3).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-results}
ARCH=${CUDA_ARCH:-90}
BUILD=${BUILD_DIR:-$ROOT/build/gpu-check}
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export WIDE_KERNELS_LIB="$BUILD/lib/libwide_kernels.so"
export WIDE_KERNELS_BUILD_DIR="$BUILD" WIDE_KERNELS_TEST_ARCHS="$ARCH"

build_status=skipped tests_status=skipped bench_status=skipped
step() { printf '\n=== %s (%s) ===\n' "$1" "$(date -u +%H:%M:%S)"; }

step "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt" || true
"$PYTHON" - <<'PY' 2>&1 | tee "$OUT/torch.txt" || true
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
PY

step "build (sm_$ARCH)"
if timeout 600 "$PYTHON" -c "
import sys, time
from wide_export.native.build import build_native
t = time.time()
r = build_native(build_dir='$BUILD', cuda_archs='$ARCH', targets=('wide_kernels', 'wide_kernels_static'))
print('built in %.0f s:' % (time.time() - t), *r.libraries, sep='\n  ')
" 2>&1 | tee "$OUT/build.txt"; then build_status=ok; else build_status=FAILED; fi
cp "$BUILD/build.log" "$OUT/build.log" 2>/dev/null || true

if [ "$build_status" = ok ]; then
  step "gpu tests"
  if timeout 300 "$PYTHON" -m pytest -q -m gpu tests/kernels -p no:cacheprovider \
      --junitxml="$OUT/gpu-tests.xml" --maxfail=200 2>&1 | tail -n 60 | tee "$OUT/gpu-tests.txt"; then
    tests_status=ok
  else
    tests_status=FAILED
  fi
  step "benchmark (short preset)"
  if timeout 330 "$PYTHON" -c "from wide_export.cli import main; main()" bench kernels --preset short \
      --output "$OUT" 2>&1 | tee "$OUT/bench.txt"; then
    bench_status=ok
  else
    bench_status=FAILED
  fi
fi

step "summary"
"$PYTHON" - "$OUT" "$build_status" "$tests_status" "$bench_status" <<'PY' | tee "$OUT/summary.txt"
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, build, tests, bench = Path(sys.argv[1]), *sys.argv[2:]
rows = [("build", build, "")]
xml = out / "gpu-tests.xml"
if xml.exists():
    s = ET.parse(xml).getroot()
    s = s if s.tag == "testsuite" else s.find("testsuite")
    n, f, e, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    rows.append(("gpu tests", tests, f"{n - f - e - sk} passed, {f + e} failed, {sk} skipped"))
else:
    rows.append(("gpu tests", tests, "no junit report"))
js = out / "kernels.json"
if js.exists():
    data = json.loads(js.read_text())
    sp = [r["speedup"] for r in data["rows"]]
    rows.append(("bench", bench, f"{len(sp)} cases, speedup min {min(sp):.2f}x max {max(sp):.2f}x, "
                                 f"copy bw {data['copy_bandwidth_gbs']:.0f} GB/s"))
    for t in data.get("targets", []):
        rows.append(("  target", "met" if t["met"] else "MISSED", f"{t['target']}: {t['evidence']}"))
    for T in (1, 4, 4096, 16384):
        sel = [r for r in data["rows"] if r["tokens"] == T and r["mask"] == "random" and r["sparsity"] == 0.5]
        for r in sel:
            bw = f", {r['bandwidth_pct_of_copy']:.0f}% bw" if r.get("bandwidth_pct_of_copy") else ""
            rows.append((f"  T={T}", f"{r['speedup']:.2f}x", f"{r['kernel']} {r['shape']} G={r['G']}{bw}"))
else:
    rows.append(("bench", bench, "no kernels.json"))
w = max(len(a) for a, _, _ in rows)
for a, b, c in rows:
    print(f"{a:<{w}}  {b:<8}  {c}")
PY
