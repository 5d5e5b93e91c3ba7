"""scripts/gpu-check.sh without a GPU: its stage budget, and its summary on a run cut short by a timeout."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"


def _defaults() -> dict:
    text = SCRIPT.read_text()
    return {k: int(v) for k, v in re.findall(r"\b(T_[A-Z0-9]+)=\$\{T_[A-Z0-9]+:-(\d+)\}", text)} | {
        k: int(v) for k, v in re.findall(r"\b(T_KILL)=(\d+)", text)}


def test_stage_timeouts_fit_one_480_s_run():
    t = _defaults()
    assert set(t) == {"T_BUILD", "T_TESTS", "T_BENCH", "T_E2E", "T_KILL"}
    assert t["T_BUILD"] + t["T_TESTS"] + t["T_BENCH"] + t["T_E2E"] + 4 * t["T_KILL"] <= 460, t
    text = SCRIPT.read_text()
    assert "timeout -s INT" in text  # pytest writes junit and the benchmark keeps its cases on SIGINT
    assert "--junitxml" in text and "-v" in text  # per-test lines in run.log as the tests go


def _summary_program() -> str:
    return re.search(r"<<'PY' \| tee \"\$OUT/summary.txt\"\n(.*?)\nPY\n", SCRIPT.read_text(), re.S).group(1)


def test_summary_of_a_timed_out_run_rebuilds_junit_and_prints_the_table(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    log = tmp_path / "tests.log"
    log.write_text("tests/kernels/test_kernels.py::test_masked_gemm_gpu[n-gemv] PASSED [ 1%]\n"
                   "tests/kernels/test_kernels.py::test_masked_gemm_gpu[k-gemv] FAILED [ 2%]\n"
                   "tests/kernels/test_kernels.py::test_router_gpu[x] SKIPPED (no) [ 3%]\n")
    row = {"kernel": "k", "shape": "llama-3.1-8b/down", "tokens": 1, "mask": "random", "sparsity": 0.5,
           "group_size": 128, "speedup": 1.9, "auto_algo": "gemv", "dense_ms": 0.031, "algo_ms": {"gemv": 0.016},
           "pct_of_roofline": 81.0}
    (out / "kernels.json").write_text(json.dumps({"rows": [row], "complete": False, "copy_bandwidth_gbs": 4300.0,
                                                  "tensor_tflops": 790.0, "measured_policy": None, "targets": []}))
    res = subprocess.run([sys.executable, "-", str(out), str(log), "ok", "TIMEOUT", "TIMEOUT", "skipped"],
                         input=_summary_program(), capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    gpu = next(line for line in lines if line.startswith("gpu tests"))
    assert "TIMEOUT" in gpu and "1 passed, 1 failed, 1 skipped" in gpu and "rebuilt" in gpu
    suite = ET.parse(out / "gpu-tests.xml").getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    assert any("1 cases (INCOMPLETE)" in line for line in lines)
    assert any(line.startswith("  T=1") and "81% of roofline" in line for line in lines)
    assert "MISSING" in lines[-1] and "e2e.json" in lines[-1] and "policy-sm_XX.json" in lines[-1]


def test_summary_prints_the_measured_policy_and_its_tile_buckets(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "tests.log").write_text("")
    tiles = {"tile_n": [[0, "small"], [4096, "wide"]], "grouped_n": [[0, "large"]]}
    pol = {"sm_90": {"measured": True, "fallback": "tile", "prefill_tiles": tiles}}
    (out / "kernels.json").write_text(json.dumps({"rows": [], "complete": True, "copy_bandwidth_gbs": 4300.0,
                                                  "tensor_tflops": 790.0, "measured_policy": pol, "targets": []}))
    res = subprocess.run([sys.executable, "-", str(out), str(tmp_path / "tests.log"), "ok", "ok", "ok", "ok"],
                         input=_summary_program(), capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    policy = next(line for line in lines if line.startswith("  policy"))
    assert '"fallback": "tile"' in policy and "prefill_tiles" not in policy
    assert any(line.startswith("  tiles") and line.endswith("tile_n=0:small,4096:wide grouped_n=0:large")
               for line in lines), lines


def test_an_unknown_argument_is_a_usage_line_and_exit_2(tmp_path):
    res = subprocess.run(["bash", str(SCRIPT), "--dryrun"], capture_output=True, text=True, check=False,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    assert res.returncode == 2 and res.stderr.strip() == "usage: scripts/gpu-check.sh [--dry-run]", res
    assert not list(tmp_path.iterdir())  # nothing started, nothing written
