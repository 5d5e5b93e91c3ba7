"""Child of test_big_offsets.py: one kernel, under TRITON_INTERPRET=1, on an x whose last row starts 2^31
elements into its storage (66 rows, row stride 2^25: rows 64 and 65, the second 64-row tile, start at
2^31 and past). The storage is one 4 GiB torch.empty of which only the rows' pages are ever touched, so
the resident memory stays small. With int32 row offsets the last
row's address wraps outside the tensor (a crash or garbage); with int64 ones the result equals the
reference on a contiguous copy. Prints the max relative error as JSON.

    TRITON_INTERPRET=1 python tests/kernels/big_offsets_child.py KERNEL
"""

import json
import sys

import torch

from wide_export.kernels.launch import group_rows, kernels
from wide_export.ops import reference as ref

M, K, N, GS = 66, 64, 64, 32
LDX = 2**25  # row 64 starts at element 2^31: past int32


def strided_rows(gen, width=K):
    storage = torch.empty(LDX * (M - 1) + width, dtype=torch.float16)
    x = storage.as_strided((M, width), (LDX, 1))
    x.copy_(torch.randn(M, width, generator=gen).half())
    return x


def main(name: str) -> float:
    gen = torch.Generator().manual_seed(7)
    ks = kernels()
    x = strided_rows(gen)
    w = (torch.randn(N, K, generator=gen) / 8).half()
    w2 = (torch.randn(N, K, generator=gen) / 8).half()
    y = torch.zeros(M, N, dtype=torch.float16)
    dense = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
    if name in ("tile_n", "grouped_n", "apply_mask"):
        G = N // GS
        mask = (torch.rand(M, N // GS, generator=gen) < 0.6).to(torch.int32)
        want = ref.masked_gated_mlp(x.contiguous(), w, w2, mask, GS)
        if name == "tile_n":
            ks.wide_tile_gemm_n_kernel[(2, 1)](x, w, w2, w, mask, y, M, N, K, G, GS, LDX, HAS_BIAS=False,
                                               GATED=True, PRECISE=True, GROUP_M=8, **dense)
        elif name == "grouped_n":
            rows, counts = group_rows(mask)
            ks.wide_grouped_gemm_n_kernel[(2, N // GS)](x, w, w2, w, rows, counts, y, M, N, K, GS, LDX,
                                                        HAS_BIAS=False, GATED=True, PRECISE=True,
                                                        BLOCK_M=64, BLOCK_N=GS, BLOCK_K=32)
        else:  # the dense path's mask pass: src is the gate product with row stride LDX, src2 the up product
            gate = strided_rows(gen, N)
            up = torch.randn(M, N, generator=gen).half()
            want = (torch.nn.functional.silu(gate.float()) * up.float()
                    * ref.expand_mask(mask, GS, torch.float32)).half()
            ks.wide_apply_mask_kernel[(9, 1)](gate, up, y, mask, M, N, G, GS, LDX, GATED=True, BLOCK_M=8,
                                              BLOCK_N=64)
    elif name in ("tile_k", "grouped_k"):
        G = K // GS
        mask = (torch.rand(M, K // GS, generator=gen) < 0.6).to(torch.int32)
        want = ref.masked_gemm_k(x.contiguous(), w, mask, GS)
        if name == "tile_k":
            ks.wide_tile_gemm_k_kernel[(2, 1)](x, w, w, mask, y, M, N, K, G, GS, LDX, HAS_BIAS=False,
                                               PRECISE=True, GROUP_M=8, **dense)
        else:
            rows, counts = group_rows(mask)
            acc = torch.zeros(M, N, dtype=torch.float32)
            ks.wide_grouped_gemm_k_kernel[(2, 1, G)](x, w, rows, counts, acc, M, N, K, GS, LDX, PRECISE=True,
                                                     **dense)
            y = acc.half()
    elif name == "router":
        R, G = 16, 4
        wc = torch.randn(R, K, generator=gen) / 8
        bc = torch.randn(R, generator=gen)
        wr = torch.randn(2 * G, R, generator=gen)
        br = torch.randn(2 * G, generator=gen)
        mask = torch.full((M, G), -1, dtype=torch.int32)
        ks.wide_router_kernel[(5,)](x, wc, bc, wr, br, mask, M, K, R, G, LDX, BLOCK_M=16, BLOCK_H=64,
                                    BLOCK_R=16, BLOCK_G=16)
        want = ref.wide_router(x.contiguous(), wc, bc, wr, br)
        return float((mask != want).sum())  # decisions that differ
    else:
        raise SystemExit(f"unknown kernel {name}")
    return (y.float() - want.float()).abs().max().item() / max(1.0, want.float().abs().max().item())


if __name__ == "__main__":
    print(json.dumps({"error": main(sys.argv[1])}))
