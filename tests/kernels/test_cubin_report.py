"""What the shipped AOT cubins compile to, read from their SASS without a GPU (wide_export.kernels.report).

The cubins come from the CI build ($WIDE_KERNELS_BUILD_DIR, every shipped
cubin) or, without one, are compiled here for a representative subset (the
kernels and variants that spilled or were not pipelined before). Fails on any
spill, on a GEMM main loop of an aligned cubin without cp.async / TMA, on an
sm_90 fp16/bf16 GEMM without wgmma, and when an aligned variant does not use
vector loads where its unaligned twin cannot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wide_export.base.errors import WideError
from wide_export.kernels import aot, report

ARCHS = (80, 90)
# compiled when no build is at hand: the worst cases of each GEMM kind and dtype, both variants
SUBSET = ("tile_n/float16/gated", "tile_k/bfloat16/bias", "tile_n/float32/gated", "tile_k/float32",
          "grouped_n/float16/gated/bn64", "grouped_n/bfloat16/bias/bn128", "grouped_k/float16", "cast/float16/bias")
FAMILIES = ("router", "gemv_n", "gemv_k", "tile_n", "tile_k", "grouped_n", "grouped_k", "cast", "group_rows",
            "apply_mask")

# A trimmed `cuobjdump -res-usage` / `-sass` of an sm_90 cubin (hand-copied from a real one).
RES = """
Resource usage:
 Common:
  GLOBAL:0
 Function wide_tile_gemm_k_kernel:
  REG:255 STACK:304 SHARED:1024 LOCAL:8 CONSTANT[0]:608 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
SASS = """
        /*0990*/              @!P3 LDG.E R105, desc[UR14][R86.64] ;
        /*09c0*/              @!P2 LDG.E.U16 R92, desc[UR14][R92.64] ;
        /*0c70*/                   LDGSTS.E.BYPASS.128 [R95], desc[UR14][R88.64], P3 ;
        /*0cb0*/                   LDG.E.64 R4, desc[UR14][R86.64] ;
        /*0d10*/                   HGMMA.64x64x16.F32 R24, gdesc[UR4], R24 ;
"""


def _build_dir() -> Path | None:
    d = os.environ.get("WIDE_KERNELS_BUILD_DIR")
    if d and (Path(d) / "aot" / "wide_aot_table.inc").is_file():
        return Path(d)
    return None


@pytest.fixture(scope="session")
def cubins():
    """(reports, whether they cover every shipped cubin)."""
    try:
        tool = report.find_cuobjdump()
    except WideError as err:
        pytest.skip(str(err))
    build = _build_dir()
    if build is not None:
        return report.report(report.read_build(build), tool), True
    return report.report(report.compile_rows(ARCHS, SUBSET), tool), False


def test_parse_reads_registers_spills_and_instructions():
    got = report.parse(RES, SASS)
    assert (got["registers"], got["stack"], got["local"], got["static_shared"]) == (255, 304, 8, 1024)
    assert got["pipelined"] == "LDGSTS" and got["mma"] == "HGMMA"
    assert (got["load_bits"], got["vector_loads"], got["scalar16_loads"]) == (128, 2, 1)
    quiet = report.parse(RES.replace("STACK:304", "STACK:0").replace("LOCAL:8", "LOCAL:0"),
                         "LDG.E.U16 R1, desc[UR4][R2.64] ;\n HMMA.16816.F32 R4, R8, R12, R4 ;")
    assert (quiet["stack"], quiet["local"], quiet["pipelined"], quiet["mma"], quiet["load_bits"]) == (0, 0, "", "HMMA", 16)


def test_problems_name_each_broken_rule():
    base = dict(name="k", registers=100, stack=0, local=0, shared=0, pipelined="LDGSTS", mma="HGMMA", load_bits=128,
                vector_loads=4, scalar16_loads=0)
    good = report.CubinReport(key="tile_n/float16/plain", variant="a16", arch=90, **base)
    assert report.problems([good]) == []
    spill = report.CubinReport(key="gemv_k/float16", variant="any", arch=80, **dict(base, stack=8))
    flat = report.CubinReport(key="tile_k/bfloat16", variant="a16", arch=90, **dict(base, pipelined="", mma="HMMA"))
    unaligned = report.CubinReport(key="tile_k/bfloat16", variant="any", arch=80, **dict(base, pipelined=""))
    bad = report.problems([spill, flat, unaligned])
    assert len(bad) == 3 and "spills" in bad[0] and "pipelined" in bad[1] and "HGMMA" in bad[2]


@pytest.mark.parametrize("family", FAMILIES)
def test_no_shipped_cubin_spills(cubins, family):
    reports, _ = cubins
    rows = [c for c in reports if c.key.split("/")[0] == family]
    if not rows:
        pytest.skip(f"no {family} cubin in the compiled subset")
    spilling = [f"{c.key} [{c.variant}] sm_{c.arch}: {c.registers} regs, STACK {c.stack}, LOCAL {c.local}"
                for c in rows if c.spills]
    assert not spilling, "\n".join(spilling)


def test_gemm_main_loops_are_pipelined(cubins):
    reports, _ = cubins
    gemms = [c for c in reports if c.is_gemm and c.variant == "a16"]
    assert gemms
    flat = [f"{c.key} sm_{c.arch}" for c in gemms if not c.pipelined]
    assert not flat, f"aligned GEMMs without LDGSTS / UTMALDG: {flat}"


def test_sm90_half_precision_gemms_use_wgmma(cubins):
    reports, _ = cubins
    half = [c for c in reports if c.is_gemm and c.arch == 90 and c.dtype in ("float16", "bfloat16")]
    assert half
    assert all(c.mma == "HGMMA" for c in half), [(c.key, c.variant, c.mma) for c in half if c.mma != "HGMMA"]
    sm80 = [c for c in reports if c.is_gemm and c.arch == 80 and c.dtype in ("float16", "bfloat16")]
    assert sm80 and all(c.mma == "HMMA" for c in sm80)  # Ampere: mma.sync


def test_aligned_variants_load_vectors_where_their_twins_cannot(cubins):
    reports, _ = cubins
    by = {(c.key, c.arch, c.variant): c for c in reports}
    pairs = [(c, by[(c.key, c.arch, "any")]) for c in reports if c.variant == "a16" and (c.key, c.arch, "any") in by]
    assert pairs
    for a16, anyv in pairs:
        assert a16.vector_loads > 0 and a16.load_bits >= 64, (a16.key, a16.arch, a16.load_bits)
        assert anyv.vector_loads == 0 and anyv.load_bits <= 32, (anyv.key, anyv.arch, anyv.load_bits)


def test_the_report_covers_every_shipped_cubin(cubins):
    reports, complete = cubins
    if not complete:
        pytest.skip("no build at $WIDE_KERNELS_BUILD_DIR: only a subset was compiled")
    archs = sorted({c.arch for c in reports})
    want = {(s.key, s.variant, a) for a in archs for s in aot.arch_specs(a)}
    assert {(c.key, c.variant, c.arch) for c in reports} == want


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run([sys.executable, "-m", "wide_export.kernels.report", *args], capture_output=True, text=True,
                          env=env, check=False)


def _small_build(build: Path, dest: Path, n: int = 4) -> Path:
    """The first n cubins of a build (table rows keep their offsets: the blob is cut after the last one)."""
    lines = (build / "aot" / "wide_aot_table.inc").read_text().splitlines()
    rows = [ln for ln in lines if ln.startswith("{")][:n]
    end = max(int(r.split(", ")[2]) + int(r.split(", ")[3]) for r in rows)
    (dest / "aot").mkdir(parents=True)
    (dest / "aot" / "wide_aot_table.inc").write_text("\n".join(rows) + "\n")
    (dest / "aot" / "wide_aot.bin").write_bytes((build / "aot" / "wide_aot.bin").read_bytes()[:end])
    return dest


def test_cli_prints_the_table_and_writes_json(tmp_path):
    try:
        report.find_cuobjdump()
    except WideError as err:
        pytest.skip(str(err))
    build = _build_dir()
    args = (["--build-dir", str(_small_build(build, tmp_path / "b"))] if build
            else ["--archs", "90", "--only", "cast/float16"])
    out = tmp_path / "r.json"
    proc = _cli(*args, "--json", str(out), "--check")
    assert proc.returncode in (0, 1), proc.stderr
    data = json.loads(out.read_text())
    assert len(data["cubins"]) == (4 if build else 2)
    assert {"key", "variant", "arch", "registers", "stack", "pipelined", "mma"} <= set(data["cubins"][0])
    assert proc.stdout.splitlines()[0].split()[:3] == ["key", "variant", "arch"]
    assert len(proc.stdout.splitlines()) == 1 + len(data["cubins"]) + 1 + len(data["problems"])
    assert (proc.returncode == 1) == bool(data["problems"])
    assert f"{len(data['cubins'])} cubins" in proc.stdout


def test_cli_bad_build_dir_is_one_error_line(tmp_path):
    proc = _cli("--build-dir", str(tmp_path / "nothing"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: no wide_aot_table.inc") and "hint:" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_missing_cuobjdump_is_a_clear_error(monkeypatch, tmp_path):
    import triton

    monkeypatch.setattr(triton, "__file__", str(tmp_path / "triton" / "__init__.py"))
    monkeypatch.setattr(report.shutil, "which", lambda name: None)
    monkeypatch.setattr(report, "_TOOLKIT_CUOBJDUMP", str(tmp_path / "none"))
    with pytest.raises(WideError, match="cuobjdump was not found"):
        report.find_cuobjdump()
