"""Ahead-of-time build of the Triton kernels for the TensorRT plugins.

    python -m wide_export.kernels.aot --out DIR --archs "80;90" [--jobs N]

compiles every specialization the plugins launch (``specs()``: kernel x dtype
x variant x tile, the tiles of ``configs.py``) with ``triton.compile`` for each
architecture, no GPU needed, and writes into DIR:

- ``wide_aot.bin``: all cubins back to back;
- ``wide_aot_table.inc``: one C++ initializer per cubin (key, arch, offset,
  size, kernel name, shared memory, warps, parameter count, alignment (16 for
  ``a16``, 1 for ``any``), mask of the hinted parameters), included by
  ``plugins/kernels/src/wide_kernels.cpp``, which embeds the blob with
  ``.incbin`` and launches through the CUDA driver API;
- ``wide_aot_policy.inc``: the ``policy.json`` thresholds and prefill_tiles
  buckets as C++ constants.

Variants: Triton's JIT specializes every pointer argument whose address and
every integer argument whose value is a multiple of 16 (``tt.divisibility``;
``BaseBackend.get_{int,tensor}_specialization``), and integers equal to 1
become constants (not done here: one cubin serves every M of its size class;
the ``/large`` (128-row) and ``/wide`` (128 x 256) classes of the prefill GEMMs
are built for ``configs.LARGE_ARCHS`` only, and the runtime picks the class from
the policy's ``prefill_tiles`` buckets). Those
hints are what let it prove 16-byte vector loads and ``cp.async`` / TMA pipelines. So each specialization is compiled twice where
its loads depend on integers: ``a16``, hinted like the JIT's call on aligned
tensors (every pointer, and the model dimensions and strides of
``ALIGNED_INTS``), and ``any``, hinted nothing, correct for every call. The
table row carries the hinted parameters as a bit mask; the C runtime launches
``a16`` only when every hinted argument of the call is a multiple of 16.
Token counts (``M``), group and rank counts (``G``, ``R``) are never hinted:
they vary per call or need not be multiples of 16, and no load's vector width
depends on them.

    python -m wide_export.kernels.aot --cubin KEY --archs 90 --out K.cubin [--variant any]

writes one specialization's cubin (``--print-ptx KEY``: its PTX) for reading
with ``cuobjdump`` (``wide_export.kernels.report``) while tuning a tile.

Why not ``triton.tools.compile``'s C launcher: its template calls ``exit()``
on any CUDA error (fatal inside TensorRT), loads modules for one context
only, and emits one 100 KB hex array per variant; the table + blob keeps
one source of tile shapes and a per-context module cache in our runtime.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import functools
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from wide_export.kernels import configs as cfg
from wide_export.kernels.policy import POLICY_FILE, read_table

_TRITON_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}

ALIGN = cfg.ALIGN  # the divisibility Triton's JIT specializes on
ALIGNED_INTS = ("N", "K", "H", "ldx", "ld_src", "group_size", "numel",  # hinted in the a16 variant (see above)
                "D", "sqb", "sqh", "sqt", "skb", "skh", "svb", "svh", "sob", "soh", "sot")  # attention: head size, strides
FLOAT_ARGS = ("scale",)  # float32 scalars (every other non-pointer argument is an i32)
VARIANTS = ("a16", "any")
GEMMS = ("tile_n", "tile_k", "grouped_n", "grouped_k")  # key prefixes of the tl.dot GEMM kernels


@dataclass(frozen=True)
class Spec:
    """One compiled cubin per architecture: ``key`` (+ ``variant``) is what the C++ runtime looks up."""

    key: str
    kernel: str
    ptr_types: tuple  # (arg name, triton pointer type) for every pointer argument
    constexprs: tuple  # (name, value)
    num_warps: int
    num_stages: int = cfg.STAGES
    variant: str = "a16"  # "a16": pointers and ALIGNED_INTS hinted divisible by 16; "any": no hints
    archs: tuple = ()  # the architecture families (90 = sm_90, sm_90a) it is built for; () = every one

    def for_arch(self, arch: int) -> bool:
        return not self.archs or cfg.in_families(arch, self.archs)


def hinted_params(spec: Spec, arg_names) -> list[str]:
    """The runtime parameters (constexprs excluded, declaration order) the variant hints divisible by 16."""
    if spec.variant == "any":
        return []
    consts = dict(spec.constexprs)
    ptrs = dict(spec.ptr_types)
    return [n for n in arg_names if n not in consts and (n in ptrs or n in ALIGNED_INTS)]


@functools.lru_cache(maxsize=None)
def _arg_names(kernel: str) -> tuple:
    """The parameters of `kernel`, read from triton_kernels.py's text: importing it would import Triton, which fixes
    interpreter vs compiled mode for this process (see compile_spec_ptx)."""
    tree = ast.parse((Path(__file__).with_name("triton_kernels.py")).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == kernel)
    return tuple(a.arg for a in fn.args.args)


def _twins(spec: Spec) -> list[Spec]:
    """a16 + any when the kernel has an integer of ALIGNED_INTS, else only any (pointer hints alone change
    no load of such a kernel, and `any` needs no run-time check)."""
    consts = dict(spec.constexprs)
    if not any(n in ALIGNED_INTS and n not in consts for n in _arg_names(spec.kernel)):
        return [replace(spec, variant="any")]
    return [replace(spec, variant=v) for v in VARIANTS]


def _ptrs(dt: str, *names: str, **special: str) -> tuple:
    return tuple((n, special.get(n, f"*{dt}")) for n in names)


def _gemm(key: str, kernel: str, ptrs: tuple, flags: tuple, tile_of, sizes: tuple = ("small",)) -> list[Spec]:
    """Both variants of a GEMM per size class (tile_of(aligned, size) -> configs.Tile; same BLOCK_M / N): the
    key itself for "small", key + "/large" / "/wide" for the others (configs.LARGE_ARCHS only; "wide": a16
    only, configs.ALIGNED_ONLY_SIZES)."""
    out = []
    for size in sizes:
        for variant in VARIANTS:
            if variant == "any" and size in cfg.ALIGNED_ONLY_SIZES:
                continue
            t = tile_of(variant == "a16", size)
            out.append(Spec(key + ("" if size == "small" else f"/{size}"), kernel, ptrs,
                            flags + (("BLOCK_M", t.block_m), ("BLOCK_N", t.block_n), ("BLOCK_K", t.block_k)),
                            t.num_warps, t.num_stages, variant, () if size == "small" else cfg.LARGE_ARCHS))
    return out


def _sizes(fam: str, dtype: str) -> tuple:
    """The size classes compiled for a family in `dtype` (float32: "small" only)."""
    return ("small",) if dtype == "float32" else cfg.TILE_FAMILIES[fam]


def specs() -> list[Spec]:
    """Every cubin the plugins need per architecture (fp32: no grouped kernels, prefill runs the tile kernels)."""
    out = _twins(Spec("group_rows", "wide_group_rows_kernel", (("mask_ptr", "*i32"), ("rows_ptr", "*i32"),
                                                               ("counts_ptr", "*i32")),
                      (("BLOCK", cfg.GROUP_ROWS_BLOCK),), 4))
    flavours = {"plain": (False, False), "bias": (True, False), "gated": (False, True)}
    for br in cfg.ROUTER_BLOCK_RS:  # the split router's second pass: float32 whatever the activations
        out += _twins(Spec(f"router_logits/r{br}", "wide_router_logits_kernel",
                           _ptrs("fp32", "part_ptr", "bc_ptr", "wr_ptr", "br_ptr", "mask_ptr", mask_ptr="*i32"),
                           (("BLOCK_M", cfg.ROUTER_BLOCK_M), ("BLOCK_R", br), ("BLOCK_G", cfg.ROUTER_BLOCK_G)),
                           cfg.ROUTER_WARPS))
    for dtype in cfg.DTYPES:
        dt = _TRITON_DTYPE[dtype]
        precise = dtype == "float32"
        for br in cfg.ROUTER_BLOCK_RS:
            block_h, warps = cfg.router_tile(br)
            out += _twins(Spec(f"router/{dtype}/r{br}", "wide_router_kernel",
                               _ptrs("fp32", "x_ptr", "wc_ptr", "bc_ptr", "wr_ptr", "br_ptr", "mask_ptr",
                                     x_ptr=f"*{dt}", mask_ptr="*i32"),
                               (("BLOCK_M", cfg.ROUTER_BLOCK_M), ("BLOCK_H", block_h),
                                ("BLOCK_R", br), ("BLOCK_G", cfg.ROUTER_BLOCK_G)), warps))
        out += _twins(Spec(f"router_split/{dtype}", "wide_router_split_kernel",
                           _ptrs("fp32", "x_ptr", "wc_ptr", "part_ptr", x_ptr=f"*{dt}"),
                           (("BLOCK_M", cfg.ROUTER_SPLIT_BLOCK_M), ("BLOCK_R", cfg.ROUTER_SPLIT_BLOCK_R),
                            ("BLOCK_H", cfg.ROUTER_SPLIT_BLOCK_H)), cfg.ROUTER_SPLIT_WARPS))
        gemm_n_ptrs = _ptrs(dt, "x_ptr", "w_ptr", "w2_ptr", "b_ptr", "mask_ptr", "y_ptr", mask_ptr="*i32")
        grouped_ptrs = _ptrs(dt, "x_ptr", "w_ptr", "w2_ptr", "b_ptr", "rows_ptr", "counts_ptr", "y_ptr",
                             rows_ptr="*i32", counts_ptr="*i32")
        for var, (has_bias, gated) in flavours.items():
            flags = (("HAS_BIAS", has_bias), ("GATED", gated))
            out += _twins(Spec(f"gemv_n/{dtype}/{var}", "wide_gemv_n_kernel", gemm_n_ptrs + (("part_ptr", "*fp32"),),
                               flags + (("BLOCK_N", cfg.GEMV_BLOCK_N), ("BLOCK_K", cfg.GEMV_BLOCK_K)),
                               cfg.GEMV_WARPS))
            out += _gemm(f"tile_n/{dtype}/{var}", "wide_tile_gemm_n_kernel", gemm_n_ptrs,
                         flags + (("PRECISE", precise), ("GROUP_M", cfg.TILE_GROUP_M)),
                         lambda aligned, size, g=gated: cfg.tile_tile(dtype, gated=g, aligned=aligned, size=size),
                         _sizes(cfg.family("gated" if gated else "n", "tile"), dtype))
            if not precise:
                for bn in cfg.GROUPED_BLOCK_NS:
                    # gated bn128 has no "/large" (its large tile is bn64's): never launched
                    sizes = ("small",) if gated and bn > cfg.LARGE_GATED_BLOCK_N else _sizes(
                        cfg.family("gated" if gated else "n", "grouped"), dtype)
                    out += _gemm(f"grouped_n/{dtype}/{var}/bn{bn}", "wide_grouped_gemm_n_kernel", grouped_ptrs,
                                 flags + (("PRECISE", False),),
                                 lambda aligned, size, b=bn, g=gated: cfg.grouped_n_tile(b, gated=g, aligned=aligned,
                                                                                         size=size), sizes)
        # the N-pruned split GEMV's reduction: gated (silu(gate) * up); its bias is in split 0's partial
        out += _twins(Spec(f"splitk_reduce/{dtype}/gated", "wide_splitk_reduce_kernel",
                           (("part_ptr", "*fp32"), ("b_ptr", f"*{dt}"), ("y_ptr", f"*{dt}")),
                           (("HAS_BIAS", False), ("GATED", True), ("BLOCK", cfg.SPLITK_REDUCE_BLOCK)), 4))
        gemm_k_ptrs = _ptrs(dt, "x_ptr", "w_ptr", "b_ptr", "mask_ptr", "y_ptr", mask_ptr="*i32")
        for suffix, has_bias in (("", False), ("/bias", True)):  # K-pruned: plain keys unchanged, "/bias" added
            # decode: split-K GEMV (+ float32 partials) and its fixed-order reduction (launch.gemv_k_plan)
            out += _twins(Spec(f"gemv_k/{dtype}{suffix}", "wide_gemv_k_kernel",
                               gemm_k_ptrs + (("part_ptr", "*fp32"),),
                               (("HAS_BIAS", has_bias), ("BLOCK_N", cfg.GEMV_K_BLOCK_N),
                                ("BLOCK_K", cfg.GEMV_K_BLOCK_K)), cfg.GEMV_WARPS))
            out += _twins(Spec(f"splitk_reduce/{dtype}{suffix}", "wide_splitk_reduce_kernel",
                               (("part_ptr", "*fp32"), ("b_ptr", f"*{dt}"), ("y_ptr", f"*{dt}")),
                               (("HAS_BIAS", has_bias), ("GATED", False), ("BLOCK", cfg.SPLITK_REDUCE_BLOCK)), 4))
            out += _gemm(f"tile_k/{dtype}{suffix}", "wide_tile_gemm_k_kernel", gemm_k_ptrs,
                         (("HAS_BIAS", has_bias), ("PRECISE", precise), ("GROUP_M", cfg.TILE_GROUP_M)),
                         lambda aligned, size: cfg.tile_tile(dtype, aligned=aligned, size=size),
                         _sizes("tile_k", dtype))
            if not precise:
                out += _twins(Spec(f"cast/{dtype}{suffix}", "wide_cast_kernel",
                                   (("src_ptr", "*fp32"), ("dst_ptr", f"*{dt}"), ("b_ptr", f"*{dt}")),
                                   (("HAS_BIAS", has_bias), ("BLOCK", cfg.CAST_BLOCK)), 4))
        for var, gated in (("plain", False), ("gated", True)):  # the cuBLASLt dense path's mask pass
            out += _twins(Spec(f"apply_mask/{dtype}/{var}", "wide_apply_mask_kernel",
                               _ptrs(dt, "src_ptr", "src2_ptr", "dst_ptr", "mask_ptr", mask_ptr="*i32"),
                               (("GATED", gated), ("BLOCK_M", cfg.APPLY_MASK_BLOCK_M),
                                ("BLOCK_N", cfg.APPLY_MASK_BLOCK_N)), 4))
        for bd in cfg.ATTENTION_BLOCK_DS:  # WideMaskedAttention: the op's causal contract, a head mask always given
            # a16 only (head sizes a multiple of 16, as the C plan requires): `any` spilled (Triton 3.6, sm_80)
            out += [t for t in _twins(Spec(f"masked_attention/{dtype}/d{bd}", "wide_masked_attention_kernel",
                               _ptrs(dt, "q_ptr", "k_ptr", "v_ptr", "allowed_ptr", "mask_ptr", "out_ptr",
                                     allowed_ptr="*u8", mask_ptr="*i32"),
                               (("BLOCK_M", cfg.ATTENTION_BLOCK_M), ("BLOCK_N", cfg.ATTENTION_BLOCK_N), ("BLOCK_D", bd),
                                ("HAS_MASK", True), ("HAS_ALLOWED", True), ("CAUSAL", True), ("PRECISE", precise)),
                               cfg.ATTENTION_PREFILL_WARPS,
                               cfg.ATTENTION_STAGES)) if t.variant == "a16"]
            for partial in (False, True):  # one query: the decode kernel, whole or split over the keys
                out += _twins(Spec(f"masked_decode/{dtype}/d{bd}" + ("/split" if partial else ""),
                                   "wide_decode_attention_kernel",
                                   _ptrs(dt, "q_ptr", "k_ptr", "v_ptr", "len_ptr", "allowed_ptr", "mask_ptr", "out_ptr",
                                         "pacc_ptr", "pm_ptr", "pl_ptr", len_ptr="*i32", allowed_ptr="*u8",
                                         mask_ptr="*i32", pacc_ptr="*fp32", pm_ptr="*fp32", pl_ptr="*fp32"),
                                   (("BLOCK_H", cfg.ATTENTION_DECODE_BLOCK_H), ("BLOCK_L", cfg.ATTENTION_DECODE_BLOCK_L),
                                    ("BLOCK_D", bd), ("HAS_MASK", True), ("HAS_ALLOWED", True), ("PARTIAL", partial),
                                    ("PRECISE", precise)),
                                   cfg.ATTENTION_D128_DECODE_WARPS if bd == 128 else cfg.ATTENTION_WARPS,
                                   cfg.ATTENTION_STAGES))
            out += _twins(Spec(f"attention_reduce/{dtype}/d{bd}", "wide_attention_reduce_kernel",
                               (("pacc_ptr", "*fp32"), ("pm_ptr", "*fp32"), ("pl_ptr", "*fp32"), ("out_ptr", f"*{dt}")),
                               (("BLOCK_S", cfg.ATTENTION_MAX_SPLITS), ("BLOCK_D", bd)), cfg.ATTENTION_WARPS))
        if not precise:
            out += _gemm(f"grouped_k/{dtype}", "wide_grouped_gemm_k_kernel",
                         _ptrs(dt, "x_ptr", "w_ptr", "rows_ptr", "counts_ptr", "acc_ptr", rows_ptr="*i32",
                               counts_ptr="*i32", acc_ptr="*fp32"),
                         (("PRECISE", False),), lambda aligned, size: cfg.grouped_k_tile(aligned=aligned))
    return out


def arch_specs(arch: int) -> list[Spec]:
    """The specializations built for sm_<arch> (the large / wide tiles only for configs.LARGE_ARCHS)."""
    return [s for s in specs() if s.for_arch(arch)]


def keys() -> list[str]:
    """The keys the C runtime looks up (each with one or two variants per architecture)."""
    return list(dict.fromkeys(s.key for s in specs()))


def _compile(spec: Spec, arch: int):
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 3.6 fuses by default
    import triton
    from triton.backends.compiler import GPUTarget

    from wide_export.kernels import triton_kernels

    fn = getattr(triton_kernels, spec.kernel)
    consts = dict(spec.constexprs)
    ptrs = dict(spec.ptr_types)
    signature = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n in FLOAT_ARGS else "i32")
                 for n in fn.arg_names}
    hinted = set(hinted_params(spec, fn.arg_names))
    attrs = {(i,): [["tt.divisibility", ALIGN]] for i, n in enumerate(fn.arg_names) if n in hinted}
    target = GPUTarget("cuda", arch, 32)
    options = triton.compiler.make_backend(target).parse_options(
        {"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    return fn, consts, triton.compile(src, target=target, options=options.__dict__)


def compile_spec_ptx(key: str, arch: int) -> str:
    """The PTX of the specialization `key` for sm_<arch>, compiled in a fresh process.

    A fresh process because Triton fixes interpreter vs compiled mode when it is first imported: a
    process that already ran the kernels on CPU tensors cannot compile them.
    """
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "wide_export.kernels.aot", "--print-ptx", key, "--archs", str(arch)],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"PTX of {key} for sm_{arch} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def _worker_ready() -> None:
    """A compiler process's initializer: the slow imports (Triton, our kernels; ~10 s each on 2 cores) done
    before the first kernel, then one line, so `wide-export build`'s progress moves while they start."""
    os.environ.pop("TRITON_INTERPRET", None)
    import triton  # noqa: F401
    import triton.backends.compiler  # noqa: F401

    from wide_export.kernels import triton_kernels  # noqa: F401

    print(WORKER_READY, flush=True)


WORKER_READY = "aot: compiler process ready"


def compile_spec(spec: Spec, arch: int) -> dict:
    """triton.compile one specialization for sm_<arch>; returns the cubin and its launch facts."""
    fn, consts, compiled = _compile(spec, arch)
    md = compiled.metadata
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        raise RuntimeError(f"{spec.key} sm_{arch} needs scratch memory, which the plugin runtime does not provide")
    params = [n for n in fn.arg_names if n not in consts]
    hinted = set(hinted_params(spec, fn.arg_names))
    hint_mask = sum(1 << i for i, n in enumerate(params) if n in hinted)
    return {"key": spec.key, "arch": arch, "variant": spec.variant, "name": md.name, "shared": int(md.shared),
            "num_warps": spec.num_warps, "nparams": len(params), "hint_mask": hint_mask,
            "cubin": compiled.asm["cubin"]}


def _policy_inc(table: dict | None = None) -> str:
    """wide_aot_policy.inc's text for `table` (default: policy.json)."""
    table = read_table() if table is None else table
    lines = ["// generated by wide_export/kernels/aot.py from policy.json: do not edit"]
    for arch, p in table.items():
        if arch.startswith("_") or arch == "interpreter":
            continue
        base, _, device = arch.partition("@")  # "sm_90@NVIDIA H200": one GPU model's entry (policy.DEVICE_NAME)
        num = 0 if arch == "default" else int(base.split("_")[1])
        g = p["gemv_max_m"]
        shapes = []  # per-shape gemv_max_m overrides: {kind ('n', 'g' = gated, 'k'), N, K, max M}
        for key, v in p.get("gemv_max_m_shapes", {}).items():
            kind, nk = key.split(":")
            n, k = nk.split("x")
            shapes.append(f"{{'{'g' if kind == 'gated' else kind}', {n}, {k}, {v}}}")
        # prefill_tiles: per family (configs.TILE_FAMILIES' order) {bucket count, {min_m...}, {size index...}}
        tiles = []
        for fam in cfg.TILE_FAMILIES:
            buckets = p["prefill_tiles"][fam]
            tiles.append(f"{{{len(buckets)}, {{{', '.join(str(m) for m, _ in buckets)}}}, "
                         f"{{{', '.join(str(cfg.SIZES.index(z)) for _, z in buckets)}}}}}")
        lines.append(f"{{{num}, {json.dumps(device)}, {g['n']}, {g['gated']}, {g['k']}, {p['grouped_n_min_m']}, "
                     f"{p['grouped_n_min_group_size']}, {p['grouped_k_min_m']}, {p['grouped_k_min_group_size']}, "
                     f"{1 if p.get('fallback', 'dense') == 'dense' else 0}, {{{', '.join(tiles)}}}, "
                     f"{{{', '.join(shapes)}}}}},")
    return "\n".join(lines) + "\n"


def build(out_dir: Path, archs: list[int], jobs: int = 0, log=print) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    work = [(s, a) for a in archs for s in arch_specs(a)]
    jobs = jobs or max(1, min(len(work), os.cpu_count() or 1))
    t0 = time.time()
    log(f"aot: compiling {len(work)} Triton kernel specializations for sm_{', sm_'.join(map(str, archs))} "
        f"({jobs} processes)")
    results: list[dict] = []
    # spawn, not fork: a child must import Triton fresh, in compiled mode, whatever this process did.
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                initializer=_worker_ready) as pool:
        futures = [pool.submit(compile_spec, s, a) for s, a in work]
        for i, fut in enumerate(cf.as_completed(futures), 1):
            results.append(fut.result())
            # every one: `wide-export build` draws its progress bar from these lines
            log(f"aot: {i}/{len(work)} compiled ({time.time() - t0:.0f} s)")
    results.sort(key=lambda r: (r["key"], r["arch"], r["variant"]))
    blob, rows, offset = bytearray(), [], 0
    for r in results:
        while len(blob) % 16:
            blob.append(0)
        offset = len(blob)
        blob += r["cubin"]
        rows.append(f'{{"{r["key"]}", {r["arch"]}, {offset}, {len(r["cubin"])}, "{r["name"]}", {r["shared"]}, '
                    f'{r["num_warps"]}, {r["nparams"]}, {ALIGN if r["variant"] == "a16" else 1}, '
                    f'{r["hint_mask"]}u}},')
    _write(out_dir / "wide_aot.bin", bytes(blob))
    _write(out_dir / "wide_aot_table.inc",
           "// generated by wide_export/kernels/aot.py: do not edit\n" + "\n".join(rows) + "\n")
    _write(out_dir / "wide_aot_policy.inc", _policy_inc())
    log(f"aot: {len(results)} cubins, {len(blob) / 1e6:.1f} MB, in {time.time() - t0:.0f} s")
    return [{k: v for k, v in r.items() if k != "cubin"} for r in results]


def _write(path: Path, data) -> None:
    """Write only when the content changed (keeps CMake's incremental build incremental)."""
    data = data.encode() if isinstance(data, str) else data
    if path.exists() and path.read_bytes() == data:
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="output folder (required unless --print-ptx)")
    ap.add_argument("--archs", default="80;90", help='";"-separated compute capabilities, e.g. "80;90"')
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--print-ptx", metavar="KEY", help="print the PTX of one specialization (first arch) and exit")
    ap.add_argument("--cubin", metavar="KEY", help="write the cubin of one specialization (first arch) to --out")
    ap.add_argument("--variant", choices=VARIANTS, default="a16", help="with --print-ptx / --cubin (default a16)")
    args = ap.parse_args(argv)
    archs = sorted({int(a.strip().lower().removeprefix("sm_").split("-")[0].rstrip("a"))
                    for a in args.archs.replace(",", ";").split(";") if a.strip()})
    one = args.print_ptx or args.cubin
    if one:
        spec = next((s for s in specs() if s.key == one and s.variant == args.variant), None)
        if spec is None:
            ap.error(f"no specialization {one!r} with variant {args.variant} (python -c 'from "
                     f"wide_export.kernels import aot; print(aot.keys())' lists the keys)")
        if args.cubin and args.out is None:
            ap.error("--cubin needs --out FILE")
        compiled = _compile(spec, archs[0])[2]
        if args.print_ptx:
            print(compiled.asm["ptx"])
        else:
            _write(args.out, compiled.asm["cubin"])
        return 0
    if args.out is None:
        ap.error("--out is required")
    build(args.out, archs, args.jobs, log=lambda m: print(m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
