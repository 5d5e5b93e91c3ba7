"""Resource report of the AOT cubins the plugins ship, read from their SASS without a GPU.

    python -m wide_export.kernels.report [--build-dir DIR | --archs "80;90" [--only GLOB]] [--json FILE] [--check]

One row per cubin (key, variant, arch): registers, spill frame (STACK and
LOCAL bytes of ``cuobjdump -res-usage``; either non-zero means the kernel
spills), shared memory, whether global loads are pipelined (``LDGSTS`` =
cp.async, ``UTMALDG`` = TMA), the tensor-core op (``HGMMA`` = Hopper wgmma,
``HMMA`` = mma.sync) and the widest global load (``LDG``/``LDGSTS`` width in
bits: 128 and 64 are vector loads, 16 is one fp16 element at a time), with the
counts of vector and of 16-bit load instructions (``vec/16b``).

``--build-dir`` reads a finished build (``DIR/aot/wide_aot.bin`` +
``wide_aot_table.inc``, or those files in DIR itself); otherwise the cubins
are compiled here (``--only`` keeps the keys matching a glob). ``--check``
exits 1 when ``problems()`` finds any: a spill anywhere, a GEMM main loop of
an ``a16`` cubin without pipelined loads, an sm_90 fp16/bf16 GEMM without
wgmma. cuobjdump comes from the Triton wheel (``triton/backends/nvidia/bin``),
else from the CUDA toolkit.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from wide_export.base.errors import WideError

GEMM_KERNELS = ("tile_n", "tile_k", "grouped_n", "grouped_k")  # key prefixes whose main loop is a tl.dot GEMM
_TOOLKIT_CUOBJDUMP = "/usr/local/cuda/bin/cuobjdump"
_ROW = re.compile(r'\{"([^"]+)", (\d+), (\d+), (\d+), "([^"]+)", (\d+), (\d+), (\d+)(?:, (\d+), (\d+)u?)?\},')


@dataclass
class CubinReport:
    key: str
    variant: str  # "a16" (pointers + dimensions hinted divisible by 16) or "any"
    arch: int
    name: str
    registers: int
    stack: int  # bytes of the spill frame (STACK) ...
    local: int  # ... and of local memory (LOCAL): either > 0 means spills
    shared: int  # bytes of shared memory per CTA (the launch's dynamic size when known, else the static one)
    pipelined: str  # "LDGSTS", "UTMALDG", "LDGSTS+UTMALDG" or "" (no asynchronous global -> shared copies)
    mma: str  # "HGMMA", "HMMA" or "" (no tensor-core op)
    load_bits: int  # widest global load (LDG / LDGSTS), bits
    vector_loads: int  # global loads of 64 bits or more
    scalar16_loads: int  # 16-bit global loads (one fp16/bf16 element each)

    @property
    def spills(self) -> bool:
        return self.stack > 0 or self.local > 0

    @property
    def is_gemm(self) -> bool:
        return self.key.split("/")[0] in GEMM_KERNELS

    @property
    def dtype(self) -> str:
        parts = self.key.split("/")
        return parts[1] if len(parts) > 1 else ""


def find_cuobjdump() -> str:
    """cuobjdump from the Triton wheel, else the CUDA toolkit's; WideError when neither exists."""
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    for cand in (shutil.which("cuobjdump"), _TOOLKIT_CUOBJDUMP):
        if cand and Path(cand).is_file():
            return cand
    raise WideError("cuobjdump was not found",
                    hint="install the project's triton (its wheel bundles it) or the CUDA toolkit")


def _load_bits(op: str) -> int:
    for suffix, bits in ((".128", 128), (".64", 64), (".U16", 16), (".S16", 16), (".U8", 8), (".S8", 8)):
        if suffix in op:
            return bits
    return 32


def parse(res_usage: str, sass: str) -> dict:
    """The numbers of one function from `cuobjdump -res-usage` and `-sass` output."""
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res_usage)
    if not m:
        raise WideError("cuobjdump -res-usage printed no REG/STACK line", hint="is the file a cubin?")
    ops = re.findall(r"\b((?:LDGSTS|UTMALDG|HGMMA|HMMA|LDG)(?:\.[A-Z0-9_]+)*)", sass)
    loads = [_load_bits(o) for o in ops if o.startswith("LDG")]
    pipe = [p for p in ("LDGSTS", "UTMALDG") if any(o.startswith(p) for o in ops)]
    mma = next((p for p in ("HGMMA", "HMMA") if any(o.startswith(p) for o in ops)), "")
    return {"registers": int(m[1]), "stack": int(m[2]), "static_shared": int(m[3]), "local": int(m[4]),
            "pipelined": "+".join(pipe), "mma": mma, "load_bits": max(loads, default=0),
            "vector_loads": sum(b >= 64 for b in loads), "scalar16_loads": sum(b == 16 for b in loads)}


def analyze(cubin: bytes, cuobjdump: Optional[str] = None) -> dict:
    """parse() of one cubin image (one `cuobjdump -res-usage -sass` run)."""
    tool = cuobjdump or find_cuobjdump()
    with tempfile.TemporaryDirectory(prefix="wide-cubin-") as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([tool, "-res-usage", "-sass", str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise WideError(f"cuobjdump failed: {proc.stderr.strip()[-300:]}",
                        hint="the cubin may be for an architecture this cuobjdump does not know")
    return parse(proc.stdout, proc.stdout)


def read_build(build_dir: Path) -> list[dict]:
    """The table rows (key, arch, variant, name, shared, cubin bytes) of a finished build."""
    d = Path(build_dir)
    for cand in (d / "aot", d):
        if (cand / "wide_aot_table.inc").is_file() and (cand / "wide_aot.bin").is_file():
            d = cand
            break
    else:
        raise WideError(f"no wide_aot_table.inc + wide_aot.bin under {build_dir}",
                        hint="build first (wide-export build --build-dir DIR), or pass --archs to compile here")
    blob = (d / "wide_aot.bin").read_bytes()
    rows = []
    for m in _ROW.finditer((d / "wide_aot_table.inc").read_text()):
        off, size = int(m[3]), int(m[4])
        align = int(m[9]) if m[9] else 16  # a table without the variant column hinted pointers only
        rows.append({"key": m[1], "arch": int(m[2]), "variant": "a16" if align > 1 else "any", "name": m[5],
                     "shared": int(m[6]), "cubin": blob[off:off + size]})
    if not rows:
        raise WideError(f"{d / 'wide_aot_table.inc'} lists no cubins", hint="rebuild it")
    return rows


def compile_rows(archs: Iterable[int], only: Optional[str | Sequence[str]] = None, jobs: int = 0,
                 log=None) -> list[dict]:
    """Compile the shipped cubins in fresh processes; `only`: globs (a list, or comma-separated) of the keys
    to keep."""
    import concurrent.futures as cf
    import multiprocessing

    from wide_export.kernels import aot

    globs = [g.strip() for g in only.split(",")] if isinstance(only, str) else list(only or [])

    def wanted(key: str) -> bool:
        return not globs or any(fnmatch.fnmatchcase(key, g) for g in globs)

    work = [(s, a) for a in archs for s in aot.arch_specs(a) if wanted(s.key)]
    if not work:
        raise WideError(f"no shipped specialization matches {only!r}", hint="see aot.specs() for the keys")
    jobs = jobs or max(1, min(len(work), os.cpu_count() or 1))
    out = []
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for i, r in enumerate(pool.map(aot.compile_spec, *zip(*work)), 1):
            out.append(r)
            if log:
                log(f"report: {i}/{len(work)} compiled")
    return out


def report(rows: list[dict], cuobjdump: Optional[str] = None) -> list[CubinReport]:
    """One CubinReport per row (read_build / compile_rows), cuobjdump run in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    tool = cuobjdump or find_cuobjdump()
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        facts = list(pool.map(lambda r: analyze(r["cubin"], tool), rows))
    out = []
    for r, f in zip(rows, facts):
        shared = r.get("shared") or f["static_shared"]
        f = {k: v for k, v in f.items() if k != "static_shared"}
        out.append(CubinReport(key=r["key"], variant=r["variant"], arch=r["arch"], name=r["name"], shared=shared, **f))
    out.sort(key=lambda c: (c.key, c.arch, c.variant))
    return out


def problems(reports: list[CubinReport]) -> list[str]:
    """What the issue forbids in a shipped cubin, one line each (empty: all good)."""
    bad = []
    for c in reports:
        where = f"{c.key} [{c.variant}] sm_{c.arch}"
        if c.spills:
            bad.append(f"{where}: spills (STACK {c.stack} B, LOCAL {c.local} B, {c.registers} registers)")
        if c.is_gemm and c.variant == "a16" and not c.pipelined:
            bad.append(f"{where}: GEMM main loop without pipelined loads (no LDGSTS / UTMALDG)")
        if c.is_gemm and c.arch == 90 and c.dtype in ("float16", "bfloat16") and c.mma != "HGMMA":
            bad.append(f"{where}: fp16/bf16 GEMM without wgmma (HGMMA); tensor-core op: {c.mma or 'none'}")
    return bad


def table(reports: list[CubinReport]) -> str:
    head = ("key", "variant", "arch", "regs", "stack", "local", "shared", "pipelined", "mma", "max load", "vec/16b")
    lines = [head]
    for c in reports:
        lines.append((c.key, c.variant, f"sm_{c.arch}", str(c.registers), str(c.stack), str(c.local), str(c.shared),
                      c.pipelined or "no", c.mma or "none", f"{c.load_bits}b" if c.load_bits else "-",
                      f"{c.vector_loads}/{c.scalar16_loads}"))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in lines]
    return "\n".join(text)


def summary(reports: list[CubinReport]) -> str:
    gemm16 = [c for c in reports if c.is_gemm and c.variant == "a16"]
    return (f"{len(reports)} cubins, max {max((c.registers for c in reports), default=0)} registers, "
            f"{sum(c.spills for c in reports)} spilling, {sum(bool(c.pipelined) for c in gemm16)}/{len(gemm16)} "
            f"a16 GEMMs pipelined, {sum(c.mma == 'HGMMA' for c in reports)} with HGMMA")


def _archs(text: str) -> list[int]:
    try:
        return sorted({int(a.strip().lower().removeprefix("sm_").rstrip("a"))
                       for a in text.replace(",", ";").split(";") if a.strip()})
    except ValueError:
        raise WideError(f"bad --archs {text!r}", hint='use numbers, e.g. --archs "80;90"') from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wide_export.kernels.report", description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--build-dir", type=Path, help="read the cubins of a finished build (e.g. build/native)")
    src.add_argument("--archs", help='compile the cubins here for these architectures, e.g. "80;90"')
    ap.add_argument("--only", metavar="GLOBS", help="with --archs: only keys matching these comma-separated globs, "
                                                    "e.g. 'tile_*,grouped_n/*/gated/*'")
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--check", action="store_true", help="exit 1 when a cubin spills or a GEMM is not pipelined")
    args = ap.parse_args(argv)
    try:
        tool = find_cuobjdump()
        if args.build_dir is not None:
            if args.only:
                raise WideError("--only works with --archs", hint="drop --only, or compile with --archs")
            rows = read_build(args.build_dir)
        else:
            rows = compile_rows(_archs(args.archs or "80;90"), args.only, args.jobs,
                                log=lambda m: print(m, file=sys.stderr, flush=True))
        reports = report(rows, tool)
    except WideError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(reports))
    print(summary(reports))
    bad = problems(reports)
    for line in bad:
        print(f"problem: {line}")
    if args.json:
        payload = [dict(asdict(c), spills=c.spills) for c in reports]
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps({"cubins": payload, "problems": bad}, indent=1) + "\n")
        tmp.replace(args.json)
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
