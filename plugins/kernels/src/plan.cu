// plan.cu: mask reordering (token layout), the device-side tile plans of the
// tensor-core path, and the host orchestration of that path. Everything is
// queued on the caller's stream; decisions that depend on the mask (sparse or
// dense tiles, which k-tiles to visit) are taken on the device.
#include <cub/block/block_scan.cuh>

#include "common.cuh"
#include "tc.h"

namespace wide {
namespace {

constexpr int kScanThreads = 256;
constexpr int kPlanThreads = 1024;

// One block per group: rows with mask on, in ascending order (block-wide scan).
__global__ void __launch_bounds__(kScanThreads)
layout_kernel(const int32_t* mask, int64_t ldmask, int M, int G, int32_t* layout) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int g = blockIdx.x;
  int32_t* rows = layout + G + static_cast<int64_t>(g) * M;
  int carry = 0;
  for (int m0 = 0; m0 < M; m0 += kScanThreads) {
    const int m = m0 + static_cast<int>(threadIdx.x);
    const int flag = (m < M && mask[static_cast<int64_t>(m) * ldmask + g] != 0) ? 1 : 0;
    int pos, total;
    Scan(tmp).ExclusiveSum(flag, pos, total);
    if (flag) rows[carry + pos] = m;
    carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) layout[g] = carry;
}

// gemm_n family: tiles per group -> prefix, then dense or sparse.
__global__ void __launch_bounds__(kPlanThreads)
plan_n_kernel(const int32_t* counts, int M, int N, int G, int gs, int BM, int BN, int algo,
              int* mode, int* prefix) {
  using Scan = cub::BlockScan<int, kPlanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int ntn = (gs + BN - 1) / BN;
  int carry = 0;
  if (algo != WIDE_ALGO_DENSE) {
    for (int g0 = 0; g0 < G; g0 += kPlanThreads) {
      const int g = g0 + static_cast<int>(threadIdx.x);
      const int tiles = g < G ? ((counts[g] + BM - 1) / BM) * ntn : 0;
      int pos, total;
      Scan(tmp).ExclusiveSum(tiles, pos, total);
      if (g < G) prefix[g] = carry + pos;
      carry += total;
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) {
    prefix[G] = carry;
    const long long dense = static_cast<long long>((M + BM - 1) / BM) * ((N + BN - 1) / BN);
    int m = 0;
    if (algo == WIDE_ALGO_SPARSE) m = 1;
    // AUTO: per-group tiles cost the same as dense ones; take them when they
    // save >= 10% of the tiles (padding of partial tiles eats the rest).
    if (algo == WIDE_ALGO_AUTO) m = (10LL * carry <= 9LL * dense) ? 1 : 0;
    *mode = m;
  }
}

// Sparse mode writes only active (row, group) outputs; this writes the zeros.
__global__ void zero_fill_kernel(const int* mode, const int32_t* mask, int64_t ldmask, int M, int N,
                                 int gs, void* y, int64_t ldy, int esize) {
  if (*mode != 1) return;
  for (int m = blockIdx.x; m < M; m += gridDim.x) {
    const int32_t* mrow = mask + static_cast<int64_t>(m) * ldmask;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
      if (mrow[n / gs] != 0) continue;
      const int64_t off = static_cast<int64_t>(m) * ldy + n;
      if (esize == 2) static_cast<uint16_t*>(y)[off] = 0;
      else static_cast<uint32_t*>(y)[off] = 0;
    }
  }
}

// Split-K epilogue: sum the splits' raw fp32 results, then bias / SiLU-gate /
// mask exactly like the single-pass epilogue. Also writes the skipped zeros.
template <typename T, int OP>
__global__ void finalize_kernel(const float* partial, int splits, KArgs a) {
  constexpr int NB = OP == OP_GATED ? 2 : 1;
  const int64_t total = static_cast<int64_t>(a.M) * a.N;
  const int64_t plane = static_cast<int64_t>(a.M) * NB * a.N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / a.N, n = i % a.N;
    float out = 0.0f;
    const bool on = OP == OP_K || a.mask[m * a.ldmask + n / a.gs] != 0;
    if (on) {  // inactive entries of sparse mode were never written: never read them
      const float* p = partial + m * NB * a.N + n;
      float s0 = 0.0f, s1 = 0.0f;
      for (int s = 0; s < splits; ++s) {
        s0 += p[s * plane];
        if (OP == OP_GATED) s1 += p[s * plane + a.N];
      }
      out = s0;
      if (OP == OP_GATED) out = silu(s0) * s1;
      if (OP == OP_N && a.bias != nullptr) out += to_f32(static_cast<const T*>(a.bias)[n]);
    }
    static_cast<T*>(a.y)[m * a.ldy + n] = from_f32<T>(out);
  }
}

template <typename T>
int finalize(Op op, const float* partial, int splits, const KArgs& a, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(a.M) * a.N;
  const unsigned blocks = static_cast<unsigned>(ceil_div(total, 256) < 8192 ? ceil_div(total, 256) : 8192);
  switch (op) {
    case OP_N: finalize_kernel<T, OP_N><<<blocks, 256, 0, stream>>>(partial, splits, a); break;
    case OP_GATED: finalize_kernel<T, OP_GATED><<<blocks, 256, 0, stream>>>(partial, splits, a); break;
    case OP_K: finalize_kernel<T, OP_K><<<blocks, 256, 0, stream>>>(partial, splits, a); break;
    default: return WIDE_ERR_INVALID_ARGUMENT;
  }
  WIDE_LAUNCHED();
  return WIDE_OK;
}

// gemm_k: per m-tile, the k-tiles that any row of the tile uses (all when dense).
__global__ void __launch_bounds__(kScanThreads)
plan_k_kernel(const int32_t* mask, int64_t ldmask, int M, int G, int gs, int K, int BM, int algo,
              int* kcount, int* klist) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  extern __shared__ unsigned char active[];  // [G]
  const int mt = blockIdx.x;
  const int m0 = mt * BM, m1 = min(M, m0 + BM);
  for (int g = threadIdx.x; g < G; g += kScanThreads) {
    unsigned char on = algo == WIDE_ALGO_DENSE ? 1 : 0;
    for (int m = m0; m < m1 && !on; ++m) on = mask[static_cast<int64_t>(m) * ldmask + g] != 0;
    active[g] = on;
  }
  __syncthreads();
  const int nkt = (K + kTcBK - 1) / kTcBK;
  int* list = klist + static_cast<int64_t>(mt) * nkt;
  int carry = 0;
  for (int k0 = 0; k0 < nkt; k0 += kScanThreads) {
    const int kt = k0 + static_cast<int>(threadIdx.x);
    int flag = 0;
    if (kt < nkt) {
      const int g0 = kt * kTcBK / gs, g1 = (min(K, kt * kTcBK + kTcBK) - 1) / gs;
      for (int gg = g0; gg <= g1 && !flag; ++gg) flag = active[gg];
    }
    int pos, total;
    Scan(tmp).ExclusiveSum(flag, pos, total);
    if (flag) list[carry + pos] = kt;
    carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) kcount[mt] = carry;
}

// Workspace carve-up, 256-byte aligned sections.
struct Carve {
  size_t layout, mode, prefix, kcount, klist, partial, total;
};
size_t align256(size_t v) { return (v + 255) & ~static_cast<size_t>(255); }
// The largest need of the three ops over every row count <= M (monotonic in M,
// see max_splits_times_rows): tc_gemm uses tc_splits(M) * M rows of it.
size_t partial_bytes(int64_t M, int64_t N, int64_t K) {
  size_t most = 0;
  for (Op op : {OP_N, OP_GATED, OP_K}) {
    const int64_t rows =
        max_splits_times_rows(M, 2, kTcMaxSplits, [&](int64_t m) { return int64_t{tc_splits(op, m, N, K)}; });
    const size_t b = sizeof(float) * static_cast<size_t>(rows * N * (op == OP_GATED ? 2 : 1));
    most = b > most ? b : most;
  }
  return most;
}
Carve carve(int64_t M, int64_t N, int64_t K, int64_t G) {
  Carve c{};
  const int64_t mtiles = ceil_div(M, tc_bm(M)), ktiles = ceil_div(K, kTcBK);
  c.layout = 0;
  c.mode = c.layout + align256(sizeof(int32_t) * static_cast<size_t>(G + G * M));
  c.prefix = c.mode + 256;
  c.kcount = c.prefix + align256(sizeof(int) * static_cast<size_t>(G + 1));
  c.klist = c.kcount + align256(sizeof(int) * static_cast<size_t>(mtiles));
  c.partial = c.klist + align256(sizeof(int) * static_cast<size_t>(mtiles * ktiles));
  c.total = c.partial + align256(partial_bytes(M, N, K));
  return c;
}

}  // namespace

int tc_splits(Op op, int64_t M, int64_t N, int64_t K) {
  // Aim for >= 2 blocks per SM on a 132-SM part; each split keeps >= 8 k-tiles,
  // and the fp32 partials (written + read) stay under ~1/4 of the weight bytes.
  constexpr int64_t kTargetBlocks = 264, kMaxSplits = kTcMaxSplits, kMinKTiles = 8;
  const int64_t tiles = ceil_div(M, tc_bm(M)) * ceil_div(N, tc_bn(op));
  if (tiles >= kTargetBlocks || M <= 0) return 1;
  int64_t s = ceil_div(kTargetBlocks, tiles);
  s = s < kMaxSplits ? s : kMaxSplits;
  const int64_t by_k = ceil_div(K, kTcBK) / kMinKTiles;
  s = s < by_k ? s : by_k;
  const int64_t by_bytes = K / (16 * M);
  s = s < by_bytes ? s : by_bytes;
  return static_cast<int>(s > 1 ? s : 1);
}

int mask_layout(const int32_t* mask, int64_t ldmask, int M, int G, int32_t* layout,
                cudaStream_t stream) {
  layout_kernel<<<G, kScanThreads, 0, stream>>>(mask, ldmask, M, G, layout);
  WIDE_LAUNCHED();
  return WIDE_OK;
}

bool tc_supported(Op op, wide_dtype_t dtype, const KArgs& a) {
  if (dtype == WIDE_FLOAT32 || op == OP_LIN) return false;
  bool ok = a.K % 8 == 0 && a.ldx % 8 == 0 && a.ldw % 8 == 0 && aligned16(a.x) && aligned16(a.w);
  if (op == OP_GATED) ok = ok && aligned16(a.w2);
  if (op == OP_K) ok = ok && a.gs % 8 == 0 && a.G <= kTcMaxGroupsK;
  return ok;
}

size_t tc_workspace_size(int64_t M, int64_t N, int64_t K, int64_t G) {
  if (M <= 0) return 0;
  return carve(M, N, K, G).total;
}

int tc_gemm(Op op, wide_dtype_t dtype, const KArgs& a, const int32_t* layout, wide_algo_t algo,
            void* workspace, size_t workspace_size, cudaStream_t stream) {
  const Carve c = carve(a.M, a.N, a.K, a.G);
  if (workspace == nullptr || workspace_size < c.total) return WIDE_ERR_WORKSPACE_TOO_SMALL;
  unsigned char* ws = static_cast<unsigned char*>(workspace);
  TcPlan plan{};
  const int BM = tc_bm(a.M), BN = tc_bn(op);
  const int64_t mtiles = ceil_div(a.M, BM);
  const int64_t dense_tiles = mtiles * ceil_div(a.N, BN);
  const int splits = tc_splits(op, a.M, a.N, a.K);
  if (splits > 1) plan.partial = reinterpret_cast<float*>(ws + c.partial);
  auto finish = [&](int rc) -> int {
    if (rc != WIDE_OK || splits == 1) return rc;
    return dtype == WIDE_FLOAT16 ? finalize<__half>(op, plan.partial, splits, a, stream)
                                 : finalize<__nv_bfloat16>(op, plan.partial, splits, a, stream);
  };

  if (op == OP_K) {
    int* kcount = reinterpret_cast<int*>(ws + c.kcount);
    int* klist = reinterpret_cast<int*>(ws + c.klist);
    plan_k_kernel<<<static_cast<unsigned>(mtiles), kScanThreads, static_cast<size_t>(a.G), stream>>>(
        a.mask, a.ldmask, a.M, a.G, a.gs, a.K, BM, algo, kcount, klist);
    WIDE_LAUNCHED();
    plan.kcount = kcount;
    plan.klist = klist;
    return finish(tc_launch(op, dtype, a, plan, dense_tiles, splits, stream));
  }

  // gemm_n family: layout (unless given or dense forced), plan, zeros, tiles.
  int32_t* own_layout = reinterpret_cast<int32_t*>(ws + c.layout);
  if (layout == nullptr) {
    if (algo != WIDE_ALGO_DENSE) {
      const int rc = mask_layout(a.mask, a.ldmask, a.M, a.G, own_layout, stream);
      if (rc != WIDE_OK) return rc;
    }
    layout = own_layout;
  }
  int* mode = reinterpret_cast<int*>(ws + c.mode);
  int* prefix = reinterpret_cast<int*>(ws + c.prefix);
  plan_n_kernel<<<1, kPlanThreads, 0, stream>>>(layout, a.M, a.N, a.G, a.gs, BM, BN, algo, mode,
                                                 prefix);
  WIDE_LAUNCHED();
  if (splits == 1) {  // with split-K the finalize pass writes the zeros
    zero_fill_kernel<<<static_cast<unsigned>(a.M < 8192 ? a.M : 8192), 256, 0, stream>>>(
        mode, a.mask, a.ldmask, a.M, a.N, a.gs, a.y, a.ldy, static_cast<int>(dtype_size(dtype)));
    WIDE_LAUNCHED();
  }
  plan.mode = mode;
  plan.prefix = prefix;
  plan.counts = layout;
  plan.rows = layout + a.G;
  int64_t grid = dense_tiles;
  if (algo == WIDE_ALGO_SPARSE) {  // upper bound of the per-group tile count
    const int64_t bound = static_cast<int64_t>(a.G) * mtiles * ceil_div(a.gs, BN);
    if (bound > grid) grid = bound;
  }
  return finish(tc_launch(op, dtype, a, plan, grid, splits, stream));
}

}  // namespace wide
