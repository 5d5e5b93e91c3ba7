"""`bench kernels`' attention rows (bench/attention.py): on CPU the tiny cases through Triton's interpreter, at
0 % and the requested sparsity, the skipped fraction measured from the masks the kernels were given; the table
says the timings mean nothing there; the command writes attention.json and refuses an unknown --attention."""

from __future__ import annotations

import json
import subprocess
import sys

from wide_export.bench.attention import CASE_SETS, TINY_CASES, attention_table, rows_json, run_attention_bench


def test_tiny_rows_on_cpu():
    rows = run_attention_bench(cuda=False, sparsity=0.5, dtype="fp32", seed=1)
    assert [(r.phase, r.batch, r.tokens, r.past, r.sparsity) for r in rows] == [
        (phase, b, t, p, s) for phase, b, t, p in TINY_CASES for s in (0.0, 0.5)]
    assert all(r.skipped == 0.0 for r in rows if r.sparsity == 0.0)
    assert all(0.1 < r.skipped < 0.9 for r in rows if r.sparsity == 0.5)
    assert all(r.dense_ms > 0 and r.wide_ms > 0 and r.speedup == r.dense_ms / r.wide_ms for r in rows)
    assert all(r.op_ms > 0 and r.op_speedup == r.dense_ms / r.op_ms for r in rows)  # the plugin's kernel
    assert rows_json(rows)[0]["speedup"] == rows[0].speedup and rows_json(rows)[0]["op_speedup"] == rows[0].op_speedup
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(attention_table(rows, "CPU", interpreter=True))
    text = " ".join(console.export_text().split())
    assert "timings mean nothing" in text and "op vs SDPA" in text


def test_the_gpu_case_sets_are_the_ones_asked_for():
    assert ("prefill", 1, 16384, 0) in CASE_SETS["all"] and ("decode", 64, 1, 32768) in CASE_SETS["all"]
    assert set(CASE_SETS["short"]) <= set(CASE_SETS["all"]) and len(CASE_SETS["short"]) == 2


def test_the_command_writes_attention_json_and_refuses_an_unknown_set(tmp_path):
    cmd = [sys.executable, "-m", "wide_export", "bench", "kernels", "--preset", "tiny", "--output", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "attention.json").read_text())
    assert data["interpreter"] is True and len(data["rows"]) == 2 * len(TINY_CASES)
    bad = subprocess.run([*cmd, "--attention", "most"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown --attention 'most'" in bad.stderr and "Traceback" not in bad.stderr
