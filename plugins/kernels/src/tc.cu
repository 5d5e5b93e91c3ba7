// tc.cu: tensor-core tiled GEMM (WMMA 16x16x16, fp16/bf16 in, fp32 accumulate)
// with a 3-stage cp.async pipeline, 128 x BN x 32 tiles, 8 warps. One kernel
// serves the three masked ops:
//  - gemm_n / gated, dense mode: tile (m-tile, n-tile), mask applied in the
//    epilogue (skipped outputs written as 0);
//  - gemm_n / gated, sparse mode: tile (group g, tile of g's active rows from
//    the reordered layout, n-tile inside g): rows are gathered on load and
//    scattered on store, inactive (row, group) pairs are never computed;
//  - gemm_k: tile (m-tile, n-tile) iterating only over the k-tiles that some
//    row of the m-tile uses; inputs of skipped groups are zero-filled by
//    cp.async (src-size 0) so they are never read.
// WMMA is portable over sm_80..sm_90; a wgmma (sm_90a) variant is future work.
#include <mma.h>

#include "common.cuh"
#include "tc.h"

namespace wide {
namespace {

using namespace nvcuda;

constexpr int kThreads = 256;
constexpr int kStages = 3;
constexpr int kLds = kTcBK + 8;  // padded smem row (elements): 80 bytes, keeps 32-byte fragment alignment

template <int BM, int BN, bool GATED>
__host__ __device__ constexpr size_t smem_bytes() {
  return static_cast<size_t>(kStages) * (BM + (GATED ? 2 : 1) * BN) * kLds * 2;
}

template <typename T, int BM, int BN, bool GATED, bool KPRUNE>
__global__ void __launch_bounds__(kThreads) tc_kernel(KArgs a, TcPlan plan) {
  constexpr int BK = kTcBK, NB = GATED ? 2 : 1;
  // 8 warps: 2 x 4 for 128 x 128 and all 64-row tiles, 4 x 2 for 128 x 64
  constexpr int WARPS_M = (BM == 128 && BN == 64) ? 4 : 2, WARPS_N = 8 / WARPS_M;
  constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, FM = WTM / 16, FN = WTN / 16;
  constexpr int A_CH = BM * BK / 8 / kThreads;  // 16-byte chunks per thread and stage
  constexpr int B_CH = BN * BK / 8 / kThreads;
  static_assert(A_CH >= 1 && B_CH >= 1, "tile too small for the thread block");
  static_assert(FM >= 1 && FN >= 1 && WTM % 16 == 0 && WTN % 16 == 0, "bad warp tiling");

  extern __shared__ __align__(128) unsigned char smem[];
  T* As = reinterpret_cast<T*>(smem);         // [kStages][BM][kLds]
  T* Bs = As + kStages * BM * kLds;           // [kStages][NB][BN][kLds]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int t = blockIdx.x;
  const int ntn_all = (a.N + BN - 1) / BN;

  // ---- which tile ----------------------------------------------------------
  bool sparse = false;
  int g = 0, mt, n0, n1;
  if (!KPRUNE && *plan.mode == 1) {
    sparse = true;
    if (t >= plan.prefix[a.G]) return;
    int lo = 0, hi = a.G - 1;  // last group whose first tile is <= t
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (plan.prefix[mid] <= t) lo = mid; else hi = mid - 1;
    }
    g = lo;
    const int ntn_g = (a.gs + BN - 1) / BN;
    const int local = t - plan.prefix[g];
    mt = local / ntn_g;
    n0 = g * a.gs + (local % ntn_g) * BN;
    n1 = min(g * a.gs + a.gs, n0 + BN);
  } else {
    // Grouped rasterisation: consecutive blocks cover kGroupM m-tiles x all
    // n-tiles column by column, so a wave reuses its weight tiles from L2.
    constexpr int kGroupM = 8;
    const int mtiles = (a.M + BM - 1) / BM;
    const int first_m = (t / (kGroupM * ntn_all)) * kGroupM;
    if (first_m >= mtiles) return;
    const int gsize = min(mtiles - first_m, kGroupM);
    const int r = t % (kGroupM * ntn_all);
    mt = first_m + r % gsize;
    n0 = (r / gsize) * BN;
    n1 = min(a.N, n0 + BN);
  }
  const int32_t* grows = sparse ? plan.rows + static_cast<int64_t>(g) * a.M : nullptr;
  const int gcount = sparse ? plan.counts[g] : 0;
  auto row_of = [&](int r) -> int {  // output/input row of tile row r, or -1
    const int idx = mt * BM + r;
    if (sparse) return idx < gcount ? grows[idx] : -1;
    return idx < a.M ? idx : -1;
  };

  // ---- per-thread copy assignments (fixed over k) --------------------------
  const T* x = static_cast<const T*>(a.x);
  const T* arow[A_CH];
  int am[A_CH];
#pragma unroll
  for (int j = 0; j < A_CH; ++j) {
    am[j] = row_of(tid / 4 + j * (kThreads / 4));
    arow[j] = am[j] >= 0 ? x + static_cast<int64_t>(am[j]) * a.ldx : nullptr;
  }
  const T* brow[NB][B_CH];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int j = 0; j < B_CH; ++j) {
      const int n = n0 + tid / 4 + j * (kThreads / 4);
      const T* w = static_cast<const T*>(b == 0 ? a.w : a.w2);
      brow[b][j] = n < n1 ? w + static_cast<int64_t>(n) * a.ldw : nullptr;
    }
  const int kcol = (tid % 4) * 8;

  const int nkt_all = (a.K + BK - 1) / BK;
  const int nk_total = KPRUNE ? plan.kcount[mt] : nkt_all;
  const int* klist = KPRUNE ? plan.klist + static_cast<int64_t>(mt) * nkt_all : nullptr;
  // split-K: this block reduces k-tiles [i0, i0 + nk) of the tile's list
  const int splits = gridDim.y, split = blockIdx.y;
  const int i0 = static_cast<int>(static_cast<int64_t>(nk_total) * split / splits);
  const int nk = static_cast<int>(static_cast<int64_t>(nk_total) * (split + 1) / splits) - i0;

  auto load_stage = [&](int stage, int i) {
    const int k = (KPRUNE ? klist[i0 + i] : i0 + i) * BK + kcol;
#pragma unroll
    for (int j = 0; j < A_CH; ++j) {
      const int r = tid / 4 + j * (kThreads / 4);
      bool v = arow[j] != nullptr && k < a.K;
      if (KPRUNE && v) v = a.mask[static_cast<int64_t>(am[j]) * a.ldmask + k / a.gs] != 0;
      cp_async16(As + (stage * BM + r) * kLds + kcol, v ? arow[j] + k : x, v ? 16 : 0);
    }
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int j = 0; j < B_CH; ++j) {
        const int r = tid / 4 + j * (kThreads / 4);
        const bool v = brow[b][j] != nullptr && k < a.K;
        cp_async16(Bs + ((stage * NB + b) * BN + r) * kLds + kcol, v ? brow[b][j] + k : x,
                   v ? 16 : 0);
      }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NB][FM][FN];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[b][i][j], 0.0f);

  // ---- main loop: kStages-deep cp.async pipeline ---------------------------
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load_stage(s, s);
    cp_async_commit();
  }
  for (int i = 0; i < nk; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile i visible to all; stage (i-1) % kStages free again
    if (i + kStages - 1 < nk) load_stage((i + kStages - 1) % kStages, i + kStages - 1);
    cp_async_commit();
    const int stage = i % kStages;
    const T* as = As + stage * BM * kLds;
    const T* bs = Bs + stage * NB * BN * kLds;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af[FM];
#pragma unroll
      for (int fi = 0; fi < FM; ++fi)
        wmma::load_matrix_sync(af[fi], as + (wm * WTM + fi * 16) * kLds + kk, kLds);
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int fj = 0; fj < FN; ++fj) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bf;
          wmma::load_matrix_sync(bf, bs + (b * BN + wn * WTN + fj * 16) * kLds + kk, kLds);
#pragma unroll
          for (int fi = 0; fi < FM; ++fi) wmma::mma_sync(acc[b][fi][fj], af[fi], bf, acc[b][fi][fj]);
        }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // pipeline smem is reused as per-warp epilogue scratch below

  // ---- epilogue: fragment -> per-warp scratch -> masked, vectorised stores --
  static_assert(8 * 256 * NB * sizeof(float) <= smem_bytes<BM, BN, GATED>(), "epilogue scratch");
  float* scratch = reinterpret_cast<float*>(smem) + warp * 256 * NB;
  T* y = static_cast<T*>(a.y);
  const T* bias = static_cast<const T*>(a.bias);
  const int er = lane / 2, ec = (lane % 2) * 8;
#pragma unroll
  for (int fi = 0; fi < FM; ++fi)
#pragma unroll
    for (int fj = 0; fj < FN; ++fj) {
#pragma unroll
      for (int b = 0; b < NB; ++b)
        wmma::store_matrix_sync(scratch + b * 256, acc[b][fi][fj], 16, wmma::mem_row_major);
      __syncwarp();
      const int m = row_of(wm * WTM + fi * 16 + er);
      const int nb = n0 + wn * WTN + fj * 16 + ec;
      if (m >= 0 && nb < n1 && plan.partial != nullptr) {  // split-K: raw sums, finished later
        float* dst = plan.partial + (static_cast<int64_t>(split) * a.M + m) * NB * a.N + nb;
#pragma unroll
        for (int b = 0; b < NB; ++b)
          for (int e = 0; e < 8 && nb + e < n1; ++e) dst[b * a.N + e] = scratch[b * 256 + er * 16 + ec + e];
      } else if (m >= 0 && nb < n1) {
        alignas(16) T out[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int n = nb + e;
          float v = scratch[er * 16 + ec + e];
          if (KPRUNE) {
            // nothing: skipped inputs were zero-filled
          } else if (GATED) {
            v = silu(v) * scratch[256 + er * 16 + ec + e];
          } else if (bias != nullptr && n < n1) {
            v += to_f32(bias[n]);
          }
          if (!KPRUNE && !sparse && n < n1 &&
              a.mask[static_cast<int64_t>(m) * a.ldmask + n / a.gs] == 0)
            v = 0.0f;
          out[e] = from_f32<T>(v);
        }
        T* dst = y + static_cast<int64_t>(m) * a.ldy + nb;
        if (nb + 8 <= n1 && (reinterpret_cast<uintptr_t>(dst) & 15u) == 0) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out);
        } else {
          for (int e = 0; e < 8 && nb + e < n1; ++e) dst[e] = out[e];
        }
      }
      __syncwarp();
    }
}

template <typename T, int BM, int BN, bool GATED, bool KPRUNE>
int launch(const KArgs& a, const TcPlan& plan, int64_t grid, int splits, cudaStream_t stream) {
  if (grid <= 0) return WIDE_OK;
  if (grid > 0x7fffffff || splits < 1 || splits > 65535) return WIDE_ERR_INVALID_ARGUMENT;
  constexpr size_t smem = smem_bytes<BM, BN, GATED>();
  auto kernel = tc_kernel<T, BM, BN, GATED, KPRUNE>;
  WIDE_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem)));
  kernel<<<dim3(static_cast<unsigned>(grid), static_cast<unsigned>(splits)), kThreads, smem, stream>>>(a, plan);
  WIDE_LAUNCHED();
  return WIDE_OK;
}

}  // namespace

int tc_launch(Op op, wide_dtype_t dtype, const KArgs& a, const TcPlan& plan, int64_t grid,
              int splits, cudaStream_t stream) {
  const bool small = tc_bm(a.M) == 64;
  auto run = [&](auto t) -> int {
    using T = decltype(t);
    switch (op) {
      case OP_N:
        return small ? launch<T, 64, 128, false, false>(a, plan, grid, splits, stream)
                     : launch<T, 128, 128, false, false>(a, plan, grid, splits, stream);
      case OP_GATED:
        return small ? launch<T, 64, 64, true, false>(a, plan, grid, splits, stream)
                     : launch<T, 128, 64, true, false>(a, plan, grid, splits, stream);
      case OP_K:
        return small ? launch<T, 64, 128, false, true>(a, plan, grid, splits, stream)
                     : launch<T, 128, 128, false, true>(a, plan, grid, splits, stream);
      default: return WIDE_ERR_INVALID_ARGUMENT;
    }
  };
  if (dtype == WIDE_FLOAT16) return run(__half{});
  if (dtype == WIDE_BFLOAT16) return run(__nv_bfloat16{});
  return WIDE_ERR_UNSUPPORTED_DTYPE;
}

}  // namespace wide
