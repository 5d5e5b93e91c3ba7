"""The CUDA kernels of the `wide` ops on torch CUDA tensors, through ctypes.

Each wrapper validates its arguments completely (shapes, dtypes, strides,
group divisibility, devices) before the library is loaded or CUDA is touched,
so every argument error is a ValueError testable on CPU tensors. A missing
library or a missing GPU is a WideError. The PyTorch oracles of these
functions are in `wide_export.ops.reference`.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from wide_export.errors import WideError
from wide_export.native.build import DEFAULT_BUILD_DIR, KERNELS_LIB_NAME

if TYPE_CHECKING:
    import torch

LIB_ENV = "WIDE_KERNELS_LIB"
API_VERSION = 1
ALGOS = {"auto": 0, "dense": 1, "sparse": 2}
_c_int64, _c_void_p, _c_size_t = ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t


class GemmParams(ctypes.Structure):
    """Mirror of wide_gemm_params_t (checked against the library's sizeof at load)."""

    _fields_ = [
        ("M", _c_int64), ("N", _c_int64), ("K", _c_int64),
        ("group_size", _c_int64), ("num_groups", _c_int64),
        ("x", _c_void_p), ("ldx", _c_int64),
        ("w", _c_void_p), ("ldw", _c_int64),
        ("w2", _c_void_p), ("bias", _c_void_p),
        ("mask", _c_void_p), ("ldmask", _c_int64),
        ("layout", _c_void_p),
        ("y", _c_void_p), ("ldy", _c_int64),
        ("dtype", ctypes.c_int), ("algo", ctypes.c_int),
    ]


# ---------------------------------------------------------------------------
# Library loading
def library_path() -> Path:
    """$WIDE_KERNELS_LIB, else <repo>/build/native/lib/libwide_kernels.so."""
    env = os.environ.get(LIB_ENV)
    return Path(env) if env else DEFAULT_BUILD_DIR / "lib" / KERNELS_LIB_NAME


@functools.lru_cache(maxsize=None)
def _load(path: str) -> ctypes.CDLL:
    p = Path(path)
    if not p.is_file():
        raise WideError(f"CUDA kernel library not found at {p}",
                        hint=f"run `wide-export build`, or point ${LIB_ENV} at libwide_kernels.so")
    try:
        lib = ctypes.CDLL(str(p))
    except OSError as err:
        raise WideError(f"cannot load the CUDA kernel library {p}: {err}",
                        hint="rebuild it with `wide-export build` for this machine") from None
    try:
        lib.wide_kernels_api_version.restype, lib.wide_kernels_api_version.argtypes = ctypes.c_int, []
        version = lib.wide_kernels_api_version()
    except AttributeError:
        raise WideError(f"{p} is not the wide kernel library (no wide_kernels_api_version)") from None
    if version != API_VERSION:
        raise WideError(f"{p} has kernel API version {version}, this wide_export needs {API_VERSION}",
                        hint="rebuild with `wide-export build`")
    _declare(lib)
    if lib.wide_gemm_params_sizeof() != ctypes.sizeof(GemmParams):
        raise WideError(f"{p}: wide_gemm_params_t layout differs from the Python mirror",
                        hint="rebuild with `wide-export build` from this checkout")
    return lib


def load_library(path: Optional[Path] = None) -> ctypes.CDLL:
    """Load (once per path) and sanity-check libwide_kernels.so."""
    return _load(str(Path(path) if path else library_path()))


def _declare(lib: ctypes.CDLL) -> None:
    P = ctypes.POINTER(GemmParams)
    sigs = {
        "wide_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "wide_last_cuda_error_string": (ctypes.c_char_p, []),
        "wide_gemm_params_sizeof": (_c_size_t, []),
        "wide_router_workspace_size": (_c_size_t, [_c_int64] * 4),
        "wide_router": (ctypes.c_int, [_c_void_p, _c_int64, ctypes.c_int, _c_int64, _c_int64,
                                       _c_void_p, _c_void_p, _c_int64, _c_void_p, _c_void_p, _c_int64,
                                       _c_void_p, _c_int64, _c_void_p, _c_size_t, _c_void_p]),
        "wide_layout_ints": (_c_int64, [_c_int64, _c_int64]),
        "wide_mask_layout": (ctypes.c_int, [_c_void_p, _c_int64, _c_int64, _c_int64, _c_void_p, _c_void_p]),
        "wide_gemm_workspace_size": (_c_size_t, [P]),
        "wide_gemm_n": (ctypes.c_int, [P, _c_void_p, _c_size_t, _c_void_p]),
        "wide_gemm_n_gated": (ctypes.c_int, [P, _c_void_p, _c_size_t, _c_void_p]),
        "wide_gemm_k": (ctypes.c_int, [P, _c_void_p, _c_size_t, _c_void_p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc == 0:
        return
    msg = lib.wide_status_string(rc).decode()
    if rc == 4:
        msg += ": " + lib.wide_last_cuda_error_string().decode()
    raise RuntimeError(f"{what} failed with status {rc} ({msg})")


# ---------------------------------------------------------------------------
# Validation (pure shape/dtype logic; no CUDA, no library)
def _torch():
    import torch

    return torch


def _dtype_code(t: "torch.Tensor", name: str) -> int:
    torch = _torch()
    codes = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
    if t.dtype not in codes:
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    return codes[t.dtype]


def _rows(t: "torch.Tensor", name: str, width: int) -> tuple[int, int]:
    """(rows, leading dim) of a [..., width] tensor whose rows are evenly strided."""
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() < 1 or t.shape[-1] != width:
        raise ValueError(f"{name} must have last dimension {width}, got shape {tuple(t.shape)}")
    if width > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dimension (use .contiguous())")
    rows = 1
    for s in t.shape[:-1]:
        rows *= s
    ld = t.stride(-2) if t.dim() >= 2 else width
    expect = ld
    for d in range(t.dim() - 2, -1, -1):  # leading dims must collapse into one row index
        if t.shape[d] != 1 and t.stride(d) != expect:
            raise ValueError(f"{name} rows are not evenly strided (strides {t.stride()}); use .contiguous()")
        expect *= t.shape[d]
    if rows > 1 and ld < width:
        raise ValueError(f"{name} rows overlap (row stride {ld} < {width})")
    return rows, max(ld, width)


def _same_dtype(ref: "torch.Tensor", *named: tuple[str, Optional["torch.Tensor"]]) -> None:
    for name, t in named:
        if t is not None and t.dtype != ref.dtype:
            raise ValueError(f"{name} must have dtype {ref.dtype} like x, got {t.dtype}")


def _mask_rows(mask: "torch.Tensor", lead: tuple, groups: int) -> int:
    torch = _torch()
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.int32:
        raise ValueError(f"mask must be an int32 tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    if tuple(mask.shape) != tuple(lead) + (groups,):
        raise ValueError(f"mask must have shape {tuple(lead) + (groups,)}, got {tuple(mask.shape)}")
    return _rows(mask, "mask", groups)[1]


def _group_count(width: int, group_size: int, axis: str) -> int:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if width % group_size:
        raise ValueError(f"{axis} = {width} is not a multiple of group_size = {group_size}")
    return width // group_size


def _on_one_gpu(*named: tuple[str, Optional["torch.Tensor"]]) -> None:
    """Last check before CUDA: every tensor on the same CUDA device."""
    devices = {t.device for _, t in named if t is not None}
    for name, t in named:
        if t is not None and t.device.type != "cuda":
            raise WideError(f"the CUDA kernels need CUDA tensors; {name} is on {t.device}",
                            hint="move the tensors to a GPU (.cuda())")
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def _algo(algo: str) -> int:
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {sorted(ALGOS)}, got {algo!r}")
    return ALGOS[algo]


def _prepare_gemm(kind: str, x, w, mask, group_size, w2=None, bias=None, layout=None, out=None,
                  algo="auto") -> tuple[GemmParams, "torch.Tensor", list]:
    """Validate a masked GEMM call; returns (params without pointers, output, named tensors)."""
    torch = _torch()
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"weight must be a 2-D [N, K] tensor, got {getattr(w, 'shape', type(w).__name__)}")
    N, K = w.shape
    M, ldx = _rows(x, "x", K)
    dtype = _dtype_code(x, "x")
    _same_dtype(x, ("weight", w), ("up weight", w2), ("bias", bias), ("out", out))
    _, ldw = _rows(w, "weight", K)
    if w2 is not None:
        if tuple(w2.shape) != (N, K) or w2.stride() != w.stride():
            raise ValueError(f"up weight must have the gate weight's shape {(N, K)} and strides {w.stride()}")
    G = _group_count(K if kind == "k" else N, group_size, "K" if kind == "k" else "N")
    lead = tuple(x.shape[:-1])
    ldmask = _mask_rows(mask, lead, G)
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != N or (N > 1 and bias.stride(0) != 1)):
        raise ValueError(f"bias must be a contiguous [{N}] tensor, got shape {tuple(bias.shape)}")
    if layout is not None:
        if kind == "k":
            raise ValueError("layout is only used by the N-pruned GEMMs")
        need = G + G * M
        if layout.dtype != torch.int32 or layout.dim() != 1 or layout.numel() != need or not layout.is_contiguous():
            raise ValueError(f"layout must be a contiguous int32 tensor of {need} elements (mask_layout())")
    if out is None:
        out = torch.empty(lead + (N,), dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != lead + (N,):
        raise ValueError(f"out must have shape {lead + (N,)}, got {tuple(out.shape)}")
    _, ldy = _rows(out, "out", N)
    p = GemmParams(M=M, N=N, K=K, group_size=group_size, num_groups=G, ldx=ldx, ldw=ldw,
                   ldmask=ldmask, ldy=ldy, dtype=dtype, algo=_algo(algo))
    tensors = [("x", x), ("weight", w), ("up weight", w2), ("bias", bias), ("mask", mask),
               ("layout", layout), ("out", out)]
    _on_one_gpu(*tensors)
    return p, out, tensors


def _ptr(t: Optional["torch.Tensor"]) -> Optional[int]:
    return None if t is None else t.data_ptr()


_GEMM_FUNCS = {"n": "wide_gemm_n", "gated": "wide_gemm_n_gated", "k": "wide_gemm_k"}


class PreparedGemm:
    """A validated masked-GEMM call bound to its tensors and workspace.

    Calling it only launches (on the current stream): no validation, no
    allocation. The benchmark uses it to time kernels, not Python.
    """

    def __init__(self, kind: str, p: GemmParams, tensors: list, out: "torch.Tensor"):
        torch = _torch()
        named = dict(tensors)
        self.out = out
        self._keep = [t for _, t in tensors if t is not None]  # keep the buffers alive
        self._lib = load_library()
        self._fn = getattr(self._lib, _GEMM_FUNCS[kind])
        self._name = _GEMM_FUNCS[kind]
        p.x, p.w, p.w2, p.bias = (_ptr(named[k]) for k in ("x", "weight", "up weight", "bias"))
        p.mask, p.layout, p.y = _ptr(named["mask"]), _ptr(named["layout"]), _ptr(out)
        self._p = p
        self.device = out.device
        self.workspace_size = int(self._lib.wide_gemm_workspace_size(ctypes.byref(p)))
        self._ws = torch.empty(max(self.workspace_size, 1), dtype=torch.uint8, device=self.device)

    def __call__(self) -> "torch.Tensor":
        torch = _torch()
        with torch.cuda.device(self.device):  # launch on the tensors' GPU, not the current one
            stream = torch.cuda.current_stream(self.device).cuda_stream
            rc = self._fn(ctypes.byref(self._p), self._ws.data_ptr(), self.workspace_size, stream)
        _check(self._lib, rc, self._name)
        return self.out


def prepare_gemm(kind: str, x, w, mask, group_size: int, *, w2=None, bias=None, layout=None, out=None,
                 algo: str = "auto") -> PreparedGemm:
    """Validate once, then return a launcher; kind is 'n', 'gated' or 'k'."""
    if kind not in _GEMM_FUNCS:
        raise ValueError(f"kind must be one of {sorted(_GEMM_FUNCS)}, got {kind!r}")
    if kind == "gated" and w2 is None:
        raise ValueError("the gated GEMM needs the up weight (w2)")
    if kind != "gated" and w2 is not None:
        raise ValueError("w2 is only used by the gated GEMM")
    if kind != "n" and bias is not None:
        raise ValueError("bias is only supported by the N-pruned GEMM")
    p, out, tensors = _prepare_gemm(kind, x, w, mask, group_size, w2=w2, bias=bias, layout=layout,
                                    out=out, algo=algo)
    return PreparedGemm(kind, p, tensors, out)


# ---------------------------------------------------------------------------
# Public wrappers
def masked_gemm_n(x, w, mask, group_size: int, bias=None, *, layout=None, out=None, algo: str = "auto"):
    """WideMaskedGemmN on CUDA: y = (x W^T + b) * mask (per output group); [.., K] -> [.., N]."""
    return prepare_gemm("n", x, w, mask, group_size, bias=bias, layout=layout, out=out, algo=algo)()


def masked_gated_mlp(x, w_gate, w_up, mask, group_size: int, *, layout=None, out=None, algo: str = "auto"):
    """WideMaskedGatedMlp on CUDA: silu(x Wg^T) * (x Wu^T) * mask (per output group)."""
    return prepare_gemm("gated", x, w_gate, mask, group_size, w2=w_up, layout=layout, out=out, algo=algo)()


def masked_gemm_k(x, w, mask, group_size: int, *, out=None, algo: str = "auto"):
    """WideMaskedGemmK on CUDA: inputs of skipped groups ignored, y = x_masked W^T."""
    return prepare_gemm("k", x, w, mask, group_size, out=out, algo=algo)()


def mask_layout(mask):
    """Mask reordering of a [.., G] int32 mask: int32 [G + G*M] (counts, then rows per group)."""
    torch = _torch()
    if not isinstance(mask, torch.Tensor) or mask.dim() < 1:
        raise ValueError("mask must be a tensor [.., G]")
    G = mask.shape[-1]
    if G < 1:
        raise ValueError("mask must have at least one group")
    ldmask = _mask_rows(mask, tuple(mask.shape[:-1]), G)
    M = mask.numel() // G
    _on_one_gpu(("mask", mask))
    lib = load_library()
    layout = torch.empty(G + G * M, dtype=torch.int32, device=mask.device)
    with torch.cuda.device(mask.device):
        stream = torch.cuda.current_stream(mask.device).cuda_stream
        _check(lib, lib.wide_mask_layout(mask.data_ptr(), ldmask, M, G, layout.data_ptr(), stream),
               "wide_mask_layout")
    return layout


def wide_router(hidden, wc, bc, wr, br, *, out=None):
    """WideRouter on CUDA: int32 mask [.., G] from hidden [.., H] and float32 router weights."""
    torch = _torch()
    for name, t, dims in (("compressor weight", wc, 2), ("compressor bias", bc, 1),
                          ("router weight", wr, 2), ("router bias", br, 1)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.dim() != dims or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 {dims}-D tensor")
    R, H = wc.shape
    M, ldx = _rows(hidden, "hidden", H)
    dtype = _dtype_code(hidden, "hidden")
    if bc.shape[0] != R or wr.shape[1] != R or wr.shape[0] % 2 or br.shape[0] != wr.shape[0]:
        raise ValueError(f"router shapes disagree: wc {tuple(wc.shape)}, bc {tuple(bc.shape)}, "
                         f"wr {tuple(wr.shape)}, br {tuple(br.shape)} (need [R,H], [R], [2G,R], [2G])")
    G = wr.shape[0] // 2
    lead = tuple(hidden.shape[:-1])
    if out is None:
        out = torch.empty(lead + (G,), dtype=torch.int32, device=hidden.device)
    ldmask = _mask_rows(out, lead, G)
    _on_one_gpu(("hidden", hidden), ("wc", wc), ("bc", bc), ("wr", wr), ("br", br), ("out", out))
    lib = load_library()
    with torch.cuda.device(hidden.device):
        size = lib.wide_router_workspace_size(M, H, R, G)
        ws = torch.empty(max(size, 1), dtype=torch.uint8, device=hidden.device)
        stream = torch.cuda.current_stream(hidden.device).cuda_stream
        rc = lib.wide_router(hidden.data_ptr(), ldx, dtype, M, H, wc.data_ptr(), bc.data_ptr(), R,
                             wr.data_ptr(), br.data_ptr(), G, out.data_ptr(), ldmask, ws.data_ptr(), size, stream)
        _check(lib, rc, "wide_router")
    return out
