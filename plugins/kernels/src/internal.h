// internal.h: launchers shared between the kernel sources (not installed).
#pragma once

#include <stdint.h>

#include "wide_kernels.h"

namespace wide {

// What a GEMM-shaped kernel computes, y[m, n] for x [M, K] and w [N, K]:
//  OP_N     (x . w[n] + bias[n]) * mask[m, n / gs]           (bias optional, dtype T)
//  OP_GATED silu(x . w[n]) * (x . w2[n]) * mask[m, n / gs]
//  OP_K     sum_k x[m, k] * mask[m, k / gs] * w[n, k]
//  OP_LIN   x . w[n] + bias[n], w and bias float32, y float32 (router stages)
enum Op { OP_N = 0, OP_GATED = 1, OP_K = 2, OP_LIN = 3 };

// Validated problem description (sizes fit in int32; see gemm_api.cu).
struct KArgs {
  int M, N, K, gs, G;
  const void* x; int64_t ldx;
  const void* w; const void* w2; int64_t ldw;
  const void* bias;
  const int32_t* mask; int64_t ldmask;
  void* y; int64_t ldy;
};

// Decode path: warp per output channel, M <= kGemvMaxRows rows at once, reads
// only the weight bytes of groups active in at least one row when `skip`.
constexpr int kGemvMaxRows = 8;
constexpr int kGemvMaxGroupsK = 4096;  // OP_K keeps a per-block group list in shared memory
int gemv(Op op, wide_dtype_t dtype, const KArgs& a, bool skip, cudaStream_t stream);

// Simple tiled fp32-accumulating SIMT GEMM for any M: the float32 path, odd
// (unaligned) shapes and the router stages. Correct first, not fast.
int simt_gemm(Op op, wide_dtype_t dtype, const KArgs& a, cudaStream_t stream);

// Tensor-core prefill path (fp16/bf16, 16-byte aligned rows, K % 8 == 0, and
// gs % 8 == 0 for OP_K). Uses `workspace` for the plan (and the layout when
// `layout` is NULL).
bool tc_supported(Op op, wide_dtype_t dtype, const KArgs& a);
size_t tc_workspace_size(int64_t M, int64_t N, int64_t K, int64_t G);
int tc_gemm(Op op, wide_dtype_t dtype, const KArgs& a, const int32_t* layout, wide_algo_t algo,
            void* workspace, size_t workspace_size, cudaStream_t stream);

// Mask reordering into `layout` (wide_layout_ints(M, G) ints), see wide_kernels.h.
int mask_layout(const int32_t* mask, int64_t ldmask, int M, int G, int32_t* layout,
                cudaStream_t stream);

}  // namespace wide
