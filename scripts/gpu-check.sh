#!/usr/bin/env bash
# gpu-check.sh: the one prepared GPU run for the WIDE kernels (fits one 480 s device call).
#   1. build plugins/kernels for sm_$CUDA_ARCH (Triton AOT cubins + C runtime)      <=  75 s
#   2. pytest -m gpu tests/kernels tests/bench: the Triton kernels (JIT), the C
#      runtime's AOT cubins (the plugins' path) and one Llama layer on the kernels
#      against the PyTorch references; ~78 cold JIT specialisations (counted on CPU
#      by tests/kernels/test_gpu_budget.py)                                     <= 145 s
#   3. wide-export bench kernels --preset short --attention short (bf16 vs cuBLAS; attention vs SDPA; roofline; JSON
#      rewritten after every case, token counts outermost)                      <= 120 s
#   4. wide-export bench e2e --sparsity 0.5 (WIDE vs dense Llama-3.1-8B layers)  <=  80 s
#   5. a short pass/fail + speed table, printed last (summary.txt)
# Stage timeouts send SIGINT first (pytest then still writes its junit file, the benchmark keeps the cases
# it finished), SIGKILL 5 s later: 75 + 145 + 120 + 80 + 4 x 5 = 440 s, plus environment and summary
# (~10 s), under 460 s. The test stage also logs one line per test as it goes (-rA -v in run.log); when
# it is killed before writing junit, the summary rebuilds gpu-tests.xml from those lines. Results go to
# $OUT (the device tool's output folder) or ./gpu-results, 8 files:
#   run.log gpu-tests.xml kernels.json kernels.png policy-sm_XX.json e2e.json e2e.png summary.txt
# Needs: python3 with a CUDA torch, triton (>= 3.6), pytest, rich, typer; cmake (+ninja), nvcc.
#
# scripts/gpu-check.sh --dry-run: the same stages without a GPU (CI runs it through scripts/device-dry-run.sh in
# an environment like the device's): the build for real, the gpu tests collected (an import or collection
# error fails it), each benchmark with --dry-run (its preset parsed, the kernels imported, no CUDA call), then
# a short table; the tp and vLLM stages say skipped as they do on one GPU.
set -uo pipefail
DRY_RUN=
case "${1:-}" in
  --dry-run) DRY_RUN=--dry-run ;;
  "") ;;
  *) echo "usage: scripts/gpu-check.sh [--dry-run]" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-results}
ARCH=${CUDA_ARCH:-90}
BUILD=${BUILD_DIR:-$ROOT/build/gpu-check}
T_BUILD=${T_BUILD:-75} T_TESTS=${T_TESTS:-145} T_BENCH=${T_BENCH:-120} T_E2E=${T_E2E:-80} T_KILL=5
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export WIDE_KERNELS_BUILD_DIR="$BUILD" WIDE_KERNELS_TEST_ARCHS="$ARCH" TRITON_DEFAULT_FP_FUSION=1
unset TRITON_INTERPRET

LOG="$OUT/run.log"
: > "$LOG"
build_status=skipped tests_status=skipped bench_status=skipped e2e_status=skipped
step() { printf '\n=== %s (%s) ===\n' "$1" "$(date -u +%H:%M:%S)" | tee -a "$LOG"; }
# run NAME TIMEOUT CMD...: the command's output appended to run.log, its tail shown
run() {
  local name=$1 t=$2; shift 2
  local start=$(wc -l < "$LOG")
  local rc=0
  timeout -s INT -k "$T_KILL" "$t" "$@" >> "$LOG" 2>&1 || rc=$?
  case $rc in
    0) eval "${name}_status=ok" ;;
    124|130|137) eval "${name}_status=TIMEOUT" ;;  # SIGINT at the timeout (124 / 130), or killed after it (137)
    *) eval "${name}_status=FAILED" ;;
  esac
  tail -n +"$((start + 1))" "$LOG" | tail -n 30
}

step "environment + build (sm_$ARCH)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$LOG" 2>&1 || true
"$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available(), 'triton', triton.__version__)" >> "$LOG" 2>&1 || true
run build "$T_BUILD" "$PYTHON" -c "
import time
from wide_export.native.build import build_native
t = time.time()
r = build_native(build_dir='$BUILD', cuda_archs='$ARCH', targets=('wide_kernels', 'wide_kernels_static'))
print('built in %.0f s:' % (time.time() - t), *r.libraries, sep='\n  ')
"

step "gpu tests"
# The Triton-JIT tests need no build; the C-runtime tests rebuild incrementally (a no-op after step 1).
TESTS_START=$(wc -l < "$LOG")
if [ -n "$DRY_RUN" ]; then  # collected, not run: any import or collection error (or a module skipped whole) fails
  run tests "$T_TESTS" "$PYTHON" -m pytest --collect-only -q -rs -m gpu tests/kernels tests/bench -p no:cacheprovider
  if [ "$tests_status" = ok ] && tail -n +"$((TESTS_START + 1))" "$LOG" | grep -Eq '^SKIPPED|[0-9]+ skipped'; then
    echo "gpu tests: a test module was skipped whole at collection (see above)" | tee -a "$LOG"
    tests_status=FAILED
  fi
else
  run tests "$T_TESTS" "$PYTHON" -m pytest -v -rA -m gpu tests/kernels tests/bench -p no:cacheprovider --maxfail=20 \
      --junitxml="$OUT/gpu-tests.xml"
fi
TESTS_LOG=$(mktemp)
trap 'rm -f "$TESTS_LOG"' EXIT
tail -n +"$((TESTS_START + 1))" "$LOG" > "$TESTS_LOG"

step "benchmark: kernels (short preset)"
run bench "$T_BENCH" "$PYTHON" -c "from wide_export.cli import main; main()" bench kernels --preset short --attention short --output "$OUT" $DRY_RUN

step "benchmark: end to end (Llama-3.1-8B layers, 50 %)"
run e2e "$T_E2E" "$PYTHON" -c "from wide_export.cli import main; main()" bench e2e --preset llama-3.1-8b \
    --sparsity 0.5 --output "$OUT" $DRY_RUN

# --- tensor parallelism, >= 2 GPUs only (a stage of its own, kept apart from the rest) ------
# `wide-export run-tp --backend nccl`: one rank process per GPU, the all-reduces over NCCL, greedy tokens
# equal to the unsharded PyTorch reference's (tests/tp/test_tp_run.py). With fewer GPUs: one line, skipped
# (the one-GPU H200 run's budget above does not include it; T_TP adds up to 240 s on a multi-GPU machine).
tp_status=skipped
tp_check() {
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  if [ "${gpus:-0}" -lt 2 ]; then
    echo "tp: skipped (${gpus:-0} GPU(s); run-tp --backend nccl needs >= 2)" | tee -a "$LOG"
    return
  fi
  run tp "${T_TP:-240}" "$PYTHON" -m pytest -q -m gpu tests/tp/test_tp_run.py -k nccl -p no:cacheprovider \
      --junitxml="$BUILD/tp-tests.xml"   # not in $OUT: the device returns at most 8 files
}
step "tensor parallelism (run-tp over NCCL, >= 2 GPUs)"
tp_check
echo "tp (run-tp over NCCL, >= 2 GPUs): $tp_status" | tee -a "$LOG"   # and a row of summary.txt
# --- end of the tensor-parallelism stage --------------------------------------------------------------

# --- vLLM, only where vllm is importable: a stage of its own, outside the 460 s above -------------
# `wide-export bench vllm`: the WIDE folder and its dense twin through vLLM's engine (the plugin's Triton
# kernels on CUDA), prefill / decode tokens/s, TTFT and ITL at batch 1 and 16, and the WIDE side's greedy
# tokens against the PyTorch reference (float32). The device image has no vLLM and its wheel is far over
# carry's 64 MiB: there the stage says so in one line (T_VLLM adds up to 300 s where vLLM is installed).
vllm_status=skipped
vllm_check() {
  if ! "$PYTHON" -c "import vllm" >/dev/null 2>&1; then
    echo "vllm: skipped (vllm is not importable by $PYTHON; pip install -e '.[vllm]')" | tee -a "$LOG"
    return
  fi
  run vllm "${T_VLLM:-300}" "$PYTHON" -c "from wide_export.cli import main; main()" bench vllm --dtype float32 \
      --batch 1 --batch 16 --output "$BUILD/vllm"   # not in $OUT: the device returns at most 8 files
  if [ -f "$BUILD/vllm/vllm.json" ]; then
    "$PYTHON" -c "
import json, sys
d = json.load(open(sys.argv[1]))
r = d['ratios']
print('vllm:', d['hardware'], '| tokens = reference:', d['tokens_equal_reference'], '|',
      ' '.join(f\"b{b} prefill {v['prefill_tok_s']:.2f}x decode {v['decode_tok_s']:.2f}x\" for b, v in r.items()))
" "$BUILD/vllm/vllm.json" | tee -a "$LOG"
  fi
}
step "vLLM (WIDE vs its dense twin, where vllm is installed)"
vllm_check
echo "vllm (bench vllm): $vllm_status" | tee -a "$LOG"
# --- end of the vLLM stage ---------------------------------------------------------------------------------

step "summary"
if [ -n "$DRY_RUN" ]; then
  collected=$(tail -n +"$((TESTS_START + 1))" "$LOG" | grep -Eo '[0-9]+(/[0-9]+)? tests? collected' | tail -n 1)
  {
    echo "dry run on $("$PYTHON" -c 'import torch, triton, numpy; print(f"torch {torch.__version__}, triton \
{triton.__version__}, numpy {numpy.__version__}")' 2>&1)"
    printf '%-16s %s\n' build "$build_status" "gpu tests" "$tests_status (${collected:-nothing collected}, not run)" \
      bench "$bench_status ($(grep -m1 -o 'would time [0-9]* cases' "$LOG" || echo 'no plan'))" \
      e2e "$e2e_status ($(grep -o 'would time [0-9]* cases' "$LOG" | sed -n 2p || true))" \
      "tp (>= 2 GPUs)" "$tp_status" vllm "$vllm_status"
  } | tee "$OUT/summary.txt"
  [ "$build_status" = ok ] && [ "$tests_status" = ok ] && [ "$bench_status" = ok ] && [ "$e2e_status" = ok ]
  exit
fi
"$PYTHON" - "$OUT" "$TESTS_LOG" "$build_status" "$tests_status" "$bench_status" "$e2e_status" <<'PY' | tee "$OUT/summary.txt"
import json, re, sys, xml.etree.ElementTree as ET
from pathlib import Path
out, tests_log, build, tests, bench, e2e = Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:]
rows = [("build", build, "")]
xml = out / "gpu-tests.xml"
suite = None
if xml.exists():
    try:
        root = ET.parse(xml).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
    except ET.ParseError:
        suite = None
if suite is None:  # pytest was killed before writing junit: rebuild it from the per-test lines it logged
    results = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", tests_log.read_text()
                         if tests_log.exists() else "", re.M)
    suite = ET.Element("testsuite", name="gpu-check (rebuilt from run.log: pytest stopped before writing junit)")
    for nodeid, res in results:
        case = ET.SubElement(suite, "testcase", classname=nodeid.split("::")[0], name=nodeid.split("::", 1)[1])
        if res in ("FAILED", "ERROR"):
            ET.SubElement(case, "failure", message=res)
        elif res in ("SKIPPED", "XFAIL"):
            ET.SubElement(case, "skipped")
    fails = sum(r in ("FAILED", "ERROR") for _, r in results)
    skips = sum(r in ("SKIPPED", "XFAIL") for _, r in results)
    suite.set("tests", str(len(results)))
    suite.set("failures", str(fails))
    suite.set("errors", "0")
    suite.set("skipped", str(skips))
    ET.ElementTree(suite).write(xml, encoding="unicode")
    note = " (junit rebuilt from the log)"
else:
    note = ""
n, f, e, sk = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
rows.append(("gpu tests", tests, f"{n - f - e - sk} passed, {f + e} failed, {sk} skipped{note}"))
js = out / "kernels.json"
if js.exists():
    data = json.loads(js.read_text())
    sp = [r["speedup"] for r in data["rows"]] or [0.0]
    rows.append(("bench", bench, f"{len(data['rows'])} cases{'' if data.get('complete') else ' (INCOMPLETE)'}, "
                                 f"auto speedup min {min(sp):.2f}x max {max(sp):.2f}x, copy bw "
                                 f"{data['copy_bandwidth_gbs']:.0f} GB/s, {data.get('tensor_tflops', 0):.0f} TFLOP/s"))
    for t in data.get("targets") or []:
        rows.append(("  target", "met" if t["met"] else "MISSED", f"{t['target']}: {t['evidence']}"))
    pol = data.get("measured_policy") or {}
    entry = next(iter(pol.values()), {})
    rows.append(("  policy", "measured" if pol else "none",
                 json.dumps({k: v for k, v in entry.items() if k != "prefill_tiles"})[:300]))
    if entry.get("prefill_tiles"):  # the measured tile size per M bucket, per GEMM family
        rows.append(("  tiles", "measured", " ".join(f"{fam}=" + ",".join(f"{m}:{z}" for m, z in b)
                                                     for fam, b in entry["prefill_tiles"].items())))
    for T in (1, 4, 256, 4096, 16384):
        for r in data["rows"]:
            if r["tokens"] == T and r["mask"] == "random" and r["sparsity"] == 0.5 and r["group_size"] == 128:
                pct = f", {r['pct_of_roofline']:.0f}% of roofline" if r.get("pct_of_roofline") else ""
                algos = " ".join(f"{a}={ms:.3f}" for a, ms in sorted(r["algo_ms"].items()))
                rows.append((f"  T={T}", f"{r['speedup']:.2f}x",
                             f"{r['kernel']} {r['shape']} auto={r['auto_algo']} dense={r['dense_ms']:.3f}ms "
                             f"{algos}{pct}"))
else:
    rows.append(("bench", bench, "no kernels.json"))
ej = out / "e2e.json"
if ej.exists():
    data = json.loads(ej.read_text())
    rows.append(("e2e", e2e, f"{data.get('device', '')} {data.get('layers')} layers -> {data.get('model_layers')}"))
    for c in data.get("cases", []):
        paper = data.get("paper", {}).get(c["phase"])
        rows.append((f"  {c['phase']} {c['tokens']}", f"{c['speedup']:.2f}x",
                     f"dense {c['dense_tokens_per_s']:.0f} tok/s, WIDE {c['wide_tokens_per_s']:.0f} tok/s"
                     + (f" (paper {paper}x)" if paper else "") + (" graph" if c.get("cuda_graph") else "")))
else:
    rows.append(("e2e", e2e, "no e2e.json"))
files = ["run.log", "gpu-tests.xml", "kernels.json", "kernels.png", "e2e.json", "e2e.png"]
missing = [f for f in files if not (out / f).exists()] + ([] if list(out.glob("policy-sm_*.json")) else ["policy-sm_XX.json"])
rows.append(("files", "ok" if not missing else "MISSING", ", ".join(missing)))
w = max(len(a) for a, _, _ in rows)
for a, b, c in rows:
    print(f"{a:<{w}}  {b:<8}  {c}")
PY
echo "tp (>= 2 GPUs)  $tp_status" | tee -a "$OUT/summary.txt"
echo "vllm            $vllm_status$(grep -m1 '^vllm: ' "$LOG" | sed 's/^vllm:/ /')" | tee -a "$OUT/summary.txt"
[ "$build_status" = ok ] && [ "$tests_status" = ok ] && [ "$bench_status" = ok ] && [ "$e2e_status" = ok ]
