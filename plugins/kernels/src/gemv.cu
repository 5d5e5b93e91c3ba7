// gemv.cu: decode path (few rows). One warp per output channel n; the weight
// row (or, for K-pruning, the active column segments of it) is streamed once
// with 16-byte loads and reused for all M <= kGemvMaxRows rows (the union of
// the rows' masks decides which weight bytes are read). fp32 accumulation.
#include <cub/block/block_scan.cuh>

#include "common.cuh"
#include "internal.h"

namespace wide {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Loads V consecutive elements as floats (one 16- or 8-byte load when V > 1).
template <typename T, int V>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[V]) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * V;
  if constexpr (kBytes == 16) {
    uint4 r = __ldg(reinterpret_cast<const uint4*>(p));
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_f32(e[i]);
  } else if constexpr (kBytes == 8) {
    uint2 r = __ldg(reinterpret_cast<const uint2*>(p));
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_f32(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_f32(__ldg(p + i));
  }
}

// acc[m] += x[m, k .. k+V) . w[k .. k+V) for the rows m whose bit is set in `rows`.
template <typename TX, int V, bool kTwo>
__device__ __forceinline__ void fma_rows(const TX* x, int64_t ldx, int M, unsigned rows, int64_t k,
                                         const float (&wv)[V], const float (&w2v)[V],
                                         float (&acc)[kGemvMaxRows], float (&acc2)[kGemvMaxRows]) {
#pragma unroll
  for (int m = 0; m < kGemvMaxRows; ++m) {
    if (m < M && ((rows >> m) & 1u)) {
      float xv[V];
      load_f32<TX, V>(x + m * ldx + k, xv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        acc[m] = fmaf(xv[i], wv[i], acc[m]);
        if constexpr (kTwo) acc2[m] = fmaf(xv[i], w2v[i], acc2[m]);
      }
    }
  }
}

// Dot products of one weight row (and w2 row) with all M rows of x over [0, K).
template <typename TX, typename TW, int V, bool kTwo>
__device__ __forceinline__ void dense_row(const KArgs& a, const TW* wr, const TW* w2r, int lane,
                                          float (&acc)[kGemvMaxRows], float (&acc2)[kGemvMaxRows]) {
  const TX* x = static_cast<const TX*>(a.x);
#pragma unroll 4
  for (int64_t k = static_cast<int64_t>(lane) * V; k < a.K; k += 32 * V) {
    float wv[V], w2v[V];
    load_f32<TW, V>(wr + k, wv);
    if constexpr (kTwo) load_f32<TW, V>(w2r + k, w2v);
    fma_rows<TX, V, kTwo>(x, a.ldx, a.M, 0xffu, k, wv, w2v, acc, acc2);
  }
}

// K-pruned: only the column segments of the groups in `list` (with per-group row bits).
template <typename T, int V>
__device__ __forceinline__ void sparse_k_row(const KArgs& a, const T* wr, const int* list,
                                             const unsigned* bits, int nact, int lane,
                                             float (&acc)[kGemvMaxRows]) {
  const T* x = static_cast<const T*>(a.x);
  const int vpg = a.gs / V;  // vectors per group segment
  const int total = nact * vpg;  // <= K / V, fits in int (32-bit division below)
  float unused[kGemvMaxRows];
#pragma unroll 2
  for (int j = lane; j < total; j += 32) {
    const int gi = j / vpg;
    const int g = list[gi];
    const int64_t k = static_cast<int64_t>(g) * a.gs + static_cast<int64_t>(j - gi * vpg) * V;
    float wv[V];
    load_f32<T, V>(wr + k, wv);
    fma_rows<T, V, false>(x, a.ldx, a.M, bits[g], k, wv, wv, acc, unused);
  }
}

template <typename TX, typename TW, typename TY, int OP, int V>
__global__ void __launch_bounds__(kThreads) gemv_kernel(KArgs a, bool skip) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int M = a.M;

  // OP_K: the groups to read (active in some row, or all when !skip) and, per
  // group, the bitmask of rows that use it. Built in ascending group order.
  int nact = 0;
  int* list = reinterpret_cast<int*>(smem);
  unsigned* bits = reinterpret_cast<unsigned*>(smem) + a.G;
  if constexpr (OP == OP_K) {
    using Scan = cub::BlockScan<int, kThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    for (int g0 = 0; g0 < a.G; g0 += kThreads) {
      const int g = g0 + static_cast<int>(threadIdx.x);
      unsigned b = 0;
      if (g < a.G) {
        for (int m = 0; m < M; ++m) b |= (a.mask[m * a.ldmask + g] != 0 ? 1u : 0u) << m;
        bits[g] = b;
      }
      const int flag = (g < a.G && (b != 0 || !skip)) ? 1 : 0;
      int pos, total;
      Scan(scan_tmp).ExclusiveSum(flag, pos, total);
      if (flag) list[nact + pos] = g;
      nact += total;
      __syncthreads();
    }
  }

  const TW* w = static_cast<const TW*>(a.w);
  const TW* w2 = static_cast<const TW*>(a.w2);
  TY* y = static_cast<TY*>(a.y);
  for (int n = blockIdx.x * kWarps + warp; n < a.N; n += gridDim.x * kWarps) {
    unsigned rows = 0xffu;
    if constexpr (OP == OP_N || OP == OP_GATED) {
      const int g = n / a.gs;
      rows = __ballot_sync(0xffffffffu, lane < M && a.mask[lane * a.ldmask + g] != 0);
      if (skip && rows == 0) {
        if (lane < M) y[lane * a.ldy + n] = from_f32<TY>(0.0f);
        continue;
      }
    }
    float acc[kGemvMaxRows], acc2[kGemvMaxRows];
#pragma unroll
    for (int m = 0; m < kGemvMaxRows; ++m) acc[m] = acc2[m] = 0.0f;
    const TW* wr = w + static_cast<int64_t>(n) * a.ldw;
    if constexpr (OP == OP_K) {
      sparse_k_row<TW, V>(a, wr, list, bits, nact, lane, acc);
    } else {
      const TW* w2r = (OP == OP_GATED) ? w2 + static_cast<int64_t>(n) * a.ldw : nullptr;
      dense_row<TX, TW, V, OP == OP_GATED>(a, wr, w2r, lane, acc, acc2);
    }
    float r = 0.0f, r2 = 0.0f;
#pragma unroll
    for (int m = 0; m < kGemvMaxRows; ++m) {
      if (m < M) {
        const float s = warp_sum(acc[m]);
        float s2 = 0.0f;
        if constexpr (OP == OP_GATED) s2 = warp_sum(acc2[m]);
        if (lane == m) { r = s; r2 = s2; }
      }
    }
    if (lane < M) {
      float out = r;
      const bool on = (rows >> lane) & 1u;
      if constexpr (OP == OP_N) {
        if (a.bias) r += to_f32(static_cast<const TW*>(a.bias)[n]);
        out = on ? r : 0.0f;
      } else if constexpr (OP == OP_GATED) {
        out = on ? silu(r) * r2 : 0.0f;
      } else if constexpr (OP == OP_LIN) {
        out = r + to_f32(static_cast<const TW*>(a.bias)[n]);
      }
      y[lane * a.ldy + n] = from_f32<TY>(out);
    }
  }
}

template <typename TX, typename TW, typename TY, int OP>
int launch(const KArgs& a, bool skip, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(TW);
  const int xbytes = static_cast<int>(sizeof(TX)) * V;
  bool vec = a.K % V == 0 && a.ldw % V == 0 && a.ldx % V == 0 && aligned16(a.w) &&
             (reinterpret_cast<uintptr_t>(a.x) % xbytes) == 0;
  if (OP == OP_GATED) vec = vec && aligned16(a.w2);
  if (OP == OP_K) vec = vec && a.gs % V == 0;
  size_t smem = 0;
  if (OP == OP_K) {
    if (a.G > kGemvMaxGroupsK) return WIDE_ERR_INVALID_ARGUMENT;
    smem = static_cast<size_t>(a.G) * (sizeof(int) + sizeof(unsigned));
  }
  const int64_t blocks64 = ceil_div(a.N, kWarps);
  const int blocks = static_cast<int>(blocks64 < 65535 * 16 ? blocks64 : 65535 * 16);
  if (vec) {
    gemv_kernel<TX, TW, TY, OP, V><<<blocks, kThreads, smem, stream>>>(a, skip);
  } else {
    gemv_kernel<TX, TW, TY, OP, 1><<<blocks, kThreads, smem, stream>>>(a, skip);
  }
  WIDE_LAUNCHED();
  return WIDE_OK;
}

}  // namespace

int gemv(Op op, wide_dtype_t dtype, const KArgs& a, bool skip, cudaStream_t stream) {
  if (a.M > kGemvMaxRows) return WIDE_ERR_INVALID_ARGUMENT;
  return dispatch_dtype(dtype, [&](auto t) -> int {
    using T = decltype(t);
    switch (op) {
      case OP_N: return launch<T, T, T, OP_N>(a, skip, stream);
      case OP_GATED: return launch<T, T, T, OP_GATED>(a, skip, stream);
      case OP_K: return launch<T, T, T, OP_K>(a, skip, stream);
      case OP_LIN: return launch<T, float, float, OP_LIN>(a, skip, stream);
    }
    return WIDE_ERR_INVALID_ARGUMENT;
  });
}

}  // namespace wide
