"""`bench kernels --device cpu` and `bench e2e --device cpu`: real timings of the CPU kernels next to the dense
GEMM on the same weights, with the bytes each reads (tiny presets here; figures in docs/kernels.md)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error

ops = pytest.importorskip("wide_export.cpu.ops")
pytestmark = pytest.mark.skipif(not ops.available(), reason="no C++ compiler: the CPU kernels are not built")


def test_bench_kernels_on_cpu_puts_wide_and_dense_side_by_side(tmp_path):
    from wide_export.cli import app

    res = CliRunner().invoke(app, ["bench", "kernels", "--device", "cpu", "--preset", "tiny", "--output",
                                   str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "cpu-kernels.json").read_text())
    assert data["complete"] and data["copy_bandwidth_gbs"] > 0 and data["isa"]
    # tiny: 3 shapes x fp32/bf16 x tokens 1/4 x sparsity 0/0.5, every one timed on both sides
    assert len(data["rows"]) == 24
    sizes = {"q": (256, 192, 1), "gate_up": (384, 192, 2), "down": (192, 384, 1)}
    for r in data["rows"]:
        n, k, mats = sizes[r["shape"]]
        assert r["weight_bytes"] == n * k * mats * (4 if r["dtype"] == "fp32" else 2)  # by hand
        assert r["masked_bytes"] == int(r["weight_bytes"] * r["union"])
        assert r["dense_ms"] > 0 and r["masked_ms"] > 0 and r["speedup"] == pytest.approx(r["dense_ms"] / r["masked_ms"])
        assert r["union"] == 1.0 if r["sparsity"] == 0 else r["union"] <= 1.0
    one = [r for r in data["rows"] if r["tokens"] == 1 and r["sparsity"] == 0.5]
    assert all(r["union"] == pytest.approx(0.5) for r in one)  # one token skips exactly half the groups
    pol = next(iter(json.loads((tmp_path / "cpu-policy.json").read_text()).values()))
    assert set(pol) == {"float32", "bfloat16"} and set(pol["float32"]["masked_max_m"]) == {"n", "gated", "k"}
    assert (tmp_path / "cpu-kernels.png").read_bytes()[:4] == b"\x89PNG"
    line = assert_one_line_error(CliRunner().invoke(app, ["bench", "kernels", "--device", "cpu", "--dtype", "fp8",
                                                          "--preset", "tiny", "--output", str(tmp_path / "x")]))
    assert "unknown dtype 'fp8' for the CPU kernels" in line


def test_bench_e2e_on_cpu_times_the_kernels_for_real(tmp_path):
    from wide_export.cli import app

    res = CliRunner().invoke(app, ["bench", "e2e", "--device", "cpu", "--preset", "tiny", "--sparsity", "0.5",
                                   "--output", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "e2e.json").read_text())
    assert data["timings_meaningful"] is True and data["device"].startswith("cpu: ") and data["algo"] == "cpu"
    assert "timings mean nothing" not in res.output
    from wide_export.bench.llamacpp import available

    if not available():  # llama.cpp's rows: one line instead (tests/llamacpp/test_bench_rows.py times them)
        assert data["llamacpp"] == {} and len(data["notes"]) == 1 and "llama.cpp rows skipped" in res.output
    decode1 = next(c for c in data["cases"] if c["phase"] == "decode" and c["tokens"] == 1)
    assert set(decode1["algos"].values()) == {"masked"}  # one token: always the masked kernels
    check = data["check"]["0.5"]
    assert check["mask_agreement"] == 1.0 and check["max_rel_error"] < 1e-3
    line = assert_one_line_error(CliRunner().invoke(app, ["bench", "e2e", "--device", "cpu", "--dtype", "fp8",
                                                          "--output", str(tmp_path / "x")]))
    assert "--device cpu runs" in line


def test_without_a_compiler_one_warning_line_and_the_dense_path(tmp_path):
    """No C++ compiler: one warning line (once), every call dense and still right; a benchmark refuses in one
    line instead of timing dense as WIDE."""
    import subprocess
    import sys

    code = """
import torch
from wide_export.cpu import ops
from wide_export.ops import reference as ref
x, w = torch.randn(1, 64), torch.randn(96, 64)
m = torch.tensor([[1, 0, 1]], dtype=torch.int32)
for _ in range(3):
    y = ops.masked_gemm_n(x, w, m, 32)
torch.testing.assert_close(y, ref.masked_gemm_n(x, w, m, 32))
print(dict(ops.PATHS))
"""
    env = {"PATH": str(tmp_path / "empty"), "WIDE_CPU_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert res.returncode == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: no C++ compiler for the CPU kernels"), warnings
    assert "run dense" in warnings[0]
    assert res.stdout.strip() == "{('n', 'dense'): 3}"
    res = subprocess.run([sys.executable, "-m", "wide_export", "bench", "kernels", "--device", "cpu", "--preset",
                          "tiny", "--output", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                         check=False)
    assert res.returncode == 2 and res.stderr.startswith("error: the CPU kernels could not be built"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_record_merges_a_measured_cpu_policy_and_refuses_a_malformed_one(tmp_path):
    import shutil

    from wide_export.bench.cpu_kernels import record_policy
    from wide_export.cpu.ops import POLICY_FILE
    from wide_export.base.errors import WideError

    dest = tmp_path / "policy.json"
    shutil.copy(POLICY_FILE, dest)
    entry = {"float32": {"masked_max_m": {"n": 8, "gated": 8, "k": 4}, "dense_union_min": 0.9,
                         "masked_full_union_min_m": {"n": 4}}}
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"Some CPU": entry}))
    assert record_policy(good, dest) == ["Some CPU"]
    table = json.loads(dest.read_text())
    assert table["Some CPU"] == entry and "default" in table
    half = {"float16": {**entry["float32"], "dense_union_min": 0.8}}  # one dtype's run keeps the others
    good.write_text(json.dumps({"Some CPU": half}))
    record_policy(good, dest)
    assert json.loads(dest.read_text())["Some CPU"] == {**entry, **half}
    before = dest.read_text()
    for bad in ({"Some CPU": {"float32": {"masked_max_m": {"n": 0, "gated": 8, "k": 4}, "dense_union_min": 0.9}}},
                {"Some CPU": {"float64": entry["float32"]}}, {"_doc": entry}, [], "x"):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(WideError, match="not a"):
            record_policy(tmp_path / "bad.json", dest)
    with pytest.raises(WideError, match="no policy record"):
        record_policy(tmp_path / "missing.json", dest)
    assert dest.read_text() == before  # refused records leave the table as it was


def _row(kind, tokens, sparsity, dense_ms, masked_ms, dtype="fp32"):
    from wide_export.bench.cpu_kernels import CpuRow

    return CpuRow("s", kind, dtype, 64, 64, 16, tokens, sparsity, 1.0, dense_ms, masked_ms, "dense", 1, 1)


def test_measured_cpu_policy_reads_the_full_union_run_and_the_choice_follows_it(monkeypatch):
    """Hand-made timings: at 50 % the masked kernel wins up to 32 tokens; at sparsity 0 it wins (by 3 % or
    more) at 4, 8 and 16 tokens only. The policy says so, and ops.choose then takes the masked kernel at a
    full union from 4 to 16 tokens, dense at 2 and 32 (where the union decides)."""
    from wide_export.bench.cpu_kernels import CpuReport, measured_policy, validate_entry
    from wide_export.cpu import ops

    half = {1: (2.0, 1.0), 2: (2.0, 1.1), 4: (4.0, 2.0), 8: (6.0, 3.0), 16: (8.0, 5.0), 32: (9.0, 8.9),
            64: (10.0, 12.0)}
    zero = {1: (2.0, 2.1), 2: (2.0, 2.2), 4: (4.0, 3.0), 8: (6.0, 5.0), 16: (8.0, 7.5), 32: (9.0, 12.0),
            64: (10.0, 20.0)}
    rows = [_row(kind, t, 0.5, *half[t]) for kind in ("n", "gated", "k") for t in half]
    rows += [_row(kind, t, 0.0, *zero[t]) for kind in ("n", "gated", "k") for t in zero]
    report = CpuReport(cpu="c", isa="avx2", threads=2, preset="short", copy_bandwidth_gbs=10.0, l3_bytes=1,
                       rows=rows)
    entry = measured_policy(report)["float32"]
    assert entry["masked_max_m"] == {"n": 32, "gated": 32, "k": 32}
    assert entry["masked_full_union_min_m"] == {"n": 4, "gated": 4, "k": 4}
    assert entry["masked_full_union_max_m"] == {"n": 16, "gated": 16, "k": 16}
    assert validate_entry({"float32": entry}) == []
    monkeypatch.setattr(ops, "policy", lambda dtype="float32": entry)
    full, partial = (lambda: 1.0), (lambda: 0.5)
    assert [ops.choose("gated", m, "float32", full) for m in (1, 2, 4, 16, 32, 64)] == \
        ["dense", "dense", "masked", "masked", "dense", "dense"]
    assert [ops.choose("k", m, "float32", partial) for m in (1, 32, 64)] == ["masked", "masked", "dense"]
