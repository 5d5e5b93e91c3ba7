// tc.h: the tensor-core prefill GEMM and its device-side plan (not installed).
#pragma once

#include "internal.h"

namespace wide {

constexpr int kTcBK = 32;    // reduction depth per pipeline stage
// Tokens per tile: 64 for few rows (less padding, more tiles), else 128.
inline int tc_bm(int64_t M) { return M <= 128 ? 64 : 128; }
inline int tc_bn(Op op) { return op == OP_GATED ? 64 : 128; }  // channels per tile
constexpr int kTcMaxGroupsK = 32768;  // plan_k keeps one byte per group in shared memory
constexpr int kTcMaxSplits = 16;      // split-K factor cap (tc_splits)

// Device-side plan, written by the plan kernels into the caller's workspace.
// The tile grid is launched at its host-known upper bound; blocks beyond the
// plan's tile count exit at once, so no host sync is ever needed.
struct TcPlan {
  const int* mode;         // gemm_n family: 0 = dense tiles, 1 = per-group (reordered) tiles
  const int* prefix;       // [G + 1]: first tile of group g in sparse mode
  const int32_t* counts;   // layout: active rows per group [G]
  const int32_t* rows;     // layout: rows[g * M + i], i < counts[g]
  const int* kcount;       // gemm_k: active k-tiles per m-tile [ceil(M / BM)]
  const int* klist;        // gemm_k: their indices [ceil(M / BM)][ceil(K / BK)]
  float* partial;          // split-K (gridDim.y > 1): raw fp32 sums [split][M][NB * N], else NULL
};

// Split-K factor for few-tile problems (decided on the host from sizes only,
// so the workspace query is exact and device independent).
int tc_splits(Op op, int64_t M, int64_t N, int64_t K);

int tc_launch(Op op, wide_dtype_t dtype, const KArgs& a, const TcPlan& plan, int64_t grid,
              int splits, cudaStream_t stream);

}  // namespace wide
