#!/usr/bin/env bash
# gpu-check.sh: the one prepared GPU run for the WIDE kernels (fits one 480 s device call).
#   1. build plugins/kernels for sm_$CUDA_ARCH (Triton AOT cubins + C runtime)      <= 120 s
#   2. pytest -m gpu tests/kernels: the Triton kernels (JIT) and the C runtime's
#      AOT cubins (the plugins' path) against the PyTorch references           <= 180 s
#   3. wide-export bench kernels --preset short (vs cuBLAS; JSON, PNG, policy)   <= 150 s
#   4. a short pass/fail + speed table, printed last (summary.txt)
# Every stage has its own timeout; the whole run stays under 480 s. Results go to $OUT
# (the device tool's output folder) or ./gpu-results, at most 8 files:
#   build.txt gpu-tests.txt gpu-tests.xml bench.txt kernels.json kernels.png policy-sm_XX.json summary.txt
# Needs: python3 with a CUDA torch, triton (>= 3.6), pytest, rich, typer; cmake (+ninja), nvcc.
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-results}
ARCH=${CUDA_ARCH:-90}
BUILD=${BUILD_DIR:-$ROOT/build/gpu-check}
T_BUILD=${T_BUILD:-120} T_TESTS=${T_TESTS:-180} T_BENCH=${T_BENCH:-150}
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export WIDE_KERNELS_BUILD_DIR="$BUILD" WIDE_KERNELS_TEST_ARCHS="$ARCH" TRITON_DEFAULT_FP_FUSION=1
unset TRITON_INTERPRET

build_status=skipped tests_status=skipped bench_status=skipped
step() { printf '\n=== %s (%s) ===\n' "$1" "$(date -u +%H:%M:%S)"; }

step "environment + build (sm_$ARCH)"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  "$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available(), 'triton', triton.__version__)" 2>&1 || true
  timeout "$T_BUILD" "$PYTHON" -c "
import time
from wide_export.native.build import build_native
t = time.time()
r = build_native(build_dir='$BUILD', cuda_archs='$ARCH', targets=('wide_kernels', 'wide_kernels_static'))
print('built in %.0f s:' % (time.time() - t), *r.libraries, sep='\n  ')
"
} > "$OUT/build.txt" 2>&1 && build_status=ok || build_status=FAILED
tail -n 20 "$OUT/build.txt"

step "gpu tests"
# The Triton-JIT tests need no build; the C-runtime tests skip themselves when the build failed.
if timeout "$T_TESTS" "$PYTHON" -m pytest -q -m gpu tests/kernels -p no:cacheprovider --maxfail=20 \
    --junitxml="$OUT/gpu-tests.xml" > "$OUT/gpu-tests.txt" 2>&1; then
  tests_status=ok
else
  tests_status=FAILED
fi
tail -n 25 "$OUT/gpu-tests.txt"

step "benchmark (short preset)"
if timeout "$T_BENCH" "$PYTHON" -c "from wide_export.cli import main; main()" bench kernels --preset short \
    --output "$OUT" > "$OUT/bench.txt" 2>&1; then
  bench_status=ok
else
  bench_status=FAILED
fi
tail -n 40 "$OUT/bench.txt"

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
    rows.append(("bench", bench, f"{len(sp)} cases, auto speedup min {min(sp):.2f}x max {max(sp):.2f}x, "
                                 f"copy bw {data['copy_bandwidth_gbs']:.0f} GB/s"))
    for t in data.get("targets", []):
        rows.append(("  target", "met" if t["met"] else "MISSED", f"{t['target']}: {t['evidence']}"))
    rows.append(("  policy", "measured", json.dumps(next(iter(data.get("measured_policy", {}).values()), {}))))
    for T in (1, 4, 256, 4096, 16384):
        for r in data["rows"]:
            if r["tokens"] == T and r["mask"] == "random" and r["sparsity"] == 0.5 and r["group_size"] == 128:
                bw = f", {r['bandwidth_pct_of_copy']:.0f}% bw" if r.get("bandwidth_pct_of_copy") else ""
                algos = " ".join(f"{a}={ms:.3f}" for a, ms in sorted(r["algo_ms"].items()))
                rows.append((f"  T={T}", f"{r['speedup']:.2f}x",
                             f"{r['kernel']} {r['shape']} auto={r['auto_algo']} dense={r['dense_ms']:.3f}ms "
                             f"{algos}{bw}"))
else:
    rows.append(("bench", bench, "no kernels.json"))
w = max(len(a) for a, _, _ in rows)
for a, b, c in rows:
    print(f"{a:<{w}}  {b:<8}  {c}")
PY
[ "$build_status" = ok ] && [ "$tests_status" = ok ] && [ "$bench_status" = ok ]
