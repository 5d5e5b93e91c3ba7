"""Count the cold JIT specialisations a set of kernel calls needs, without a GPU and without running a kernel.

Every launch of ``wide_export.kernels.launch`` is recorded instead of executed, and keyed as Triton's JIT
cache keys it: the kernel, its constexprs, num_warps / num_stages, the dtypes of the tensor arguments and the
specialisation of each int argument not in the kernel's ``do_not_specialize`` (1, a multiple of 16, other;
an upper bound: Triton may fold some of these). Used by tests/kernels/test_gpu_budget.py and printed by
``python -m tests.kernels.jit_budget`` (what scripts/gpu-check.sh's test stage will compile).
"""

from __future__ import annotations

import contextlib


def _int_class(v: int) -> str:
    return "1" if v == 1 else ("D" if v % 16 == 0 else "N")


@contextlib.contextmanager
def recording():
    """Within: kernel launches are recorded (set of JIT keys yielded), not run; device checks are off, and
    the tensors (on the CPU) are taken for an sm_90 GPU's (the H200 of gpu-check.sh): its policy decides
    `auto` and the tile sizes (prefill_tiles), not the interpreter's."""
    import torch

    from wide_export.kernels import launch

    keys: set = set()
    real_launch, real_check, real_arch = launch._launch, launch._check_device, launch.arch_of

    def record(kernel, grid, *args, num_warps, num_stages=3, **constexprs):
        fn = getattr(kernel, "fn", kernel)
        names = list(getattr(kernel, "arg_names", [])) or list(fn.__code__.co_varnames[:fn.__code__.co_argcount])
        dns = set(getattr(kernel, "do_not_specialize", None) or getattr(kernel, "kwargs", {}).get("do_not_specialize")
                  or ())  # JITFunction, or the interpreter's InterpretedFunction (kwargs)
        sig = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                sig.append(str(a.dtype))
            elif isinstance(a, int) and i not in dns and (names[i] if i < len(names) else None) not in dns:
                sig.append(_int_class(a))
            else:
                sig.append("i")
        keys.add((fn.__name__, tuple(sorted(constexprs.items())), num_warps, num_stages, tuple(sig)))

    launch._launch, launch._check_device, launch.arch_of = record, lambda *t: None, lambda device: "sm_90"
    try:
        yield keys
    finally:
        launch._launch, launch._check_device, launch.arch_of = real_launch, real_check, real_arch


def gpu_test_keys() -> set:
    """The JIT keys of the gpu-marked cases of tests/kernels/test_kernels.py."""
    import torch

    from tests.kernels import test_kernels as tk
    from wide_export import kernels

    with recording() as keys:
        for p in tk._params(tk.GPU_SHAPES, gpu=True):
            kind, algo, dtype, (lead, gs, G, s) = p.values
            t = tk.make_inputs(kind, lead, gs, G, s, dtype, "cpu", 0)
            if kind.startswith("k"):
                kernels.masked_gemm_k(t["x"], t["w"], t["mask"], gs, t["b"] if kind == "k_bias" else None, algo=algo)
            elif kind == "gated":
                kernels.masked_gated_mlp(t["x"], t["w"], t["w2"], t["mask"], gs, algo=algo)
            else:
                kernels.masked_gemm_n(t["x"], t["w"], t["mask"], gs, t["b"] if kind == "n_bias" else None, algo=algo)
        for case in tk.GPU_ROUTER_CASES:
            for dtype in tk.DTYPES:
                lead, H, R, G = case
                kernels.router(*tk._router_inputs(lead, H, R, G, dtype, "cpu", 0))
    del torch
    return keys


if __name__ == "__main__":
    ks = gpu_test_keys()
    by = {}
    for k in ks:
        by[k[0]] = by.get(k[0], 0) + 1
    print(f"{len(ks)} JIT specialisations:", ", ".join(f"{n} {c}" for n, c in sorted(by.items())))
