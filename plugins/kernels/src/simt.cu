// simt.cu: a plain shared-memory tiled GEMM with fp32 FMA (64x64 tile, 4x4 per
// thread). It serves the float32 dtype, shapes the tensor-core path cannot
// take (unaligned rows, K % 8 != 0, odd group sizes) and the router's two
// float32 stages. Simple on purpose: it is the "correct first" path.
#include "common.cuh"
#include "internal.h"

namespace wide {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 16, kThreads = 256;

template <typename TX, typename TW, typename TY, int OP>
__global__ void __launch_bounds__(kThreads) simt_kernel(KArgs a) {
  constexpr int NB = (OP == OP_GATED) ? 2 : 1;
  __shared__ float As[kBK][kBM + 1];
  __shared__ float Bs[NB][kBK][kBN + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int m0 = blockIdx.x * kBM, n0 = blockIdx.y * kBN;  // rows on x: grid.x has no 65535 cap
  const TX* x = static_cast<const TX*>(a.x);
  const TW* wmat[2] = {static_cast<const TW*>(a.w), static_cast<const TW*>(a.w2)};

  float acc[NB][4][4];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[b][i][j] = 0.0f;

  for (int k0 = 0; k0 < a.K; k0 += kBK) {
#pragma unroll
    for (int i = 0; i < (kBM * kBK) / kThreads; ++i) {
      const int e = tid + i * kThreads, r = e / kBK, kk = e % kBK;
      const int m = m0 + r, k = k0 + kk;
      float v = 0.0f;
      if (m < a.M && k < a.K) {
        bool on = true;
        if constexpr (OP == OP_K) on = a.mask[m * a.ldmask + k / a.gs] != 0;
        if (on) v = to_f32(x[m * a.ldx + k]);
      }
      As[kk][r] = v;
    }
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < (kBN * kBK) / kThreads; ++i) {
        const int e = tid + i * kThreads, r = e / kBK, kk = e % kBK;
        const int n = n0 + r, k = k0 + kk;
        Bs[b][kk][r] = (n < a.N && k < a.K) ? to_f32(wmat[b][n * a.ldw + k]) : 0.0f;
      }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float av[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float bv = Bs[b][kk][tx + 16 * j];
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[b][i][j] = fmaf(av[i], bv, acc[b][i][j]);
        }
    }
    __syncthreads();
  }

  TY* y = static_cast<TY*>(a.y);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + ty + 16 * i;
    if (m >= a.M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx + 16 * j;
      if (n >= a.N) continue;
      float out = acc[0][i][j];
      if constexpr (OP == OP_N || OP == OP_GATED) {
        const bool on = a.mask[m * a.ldmask + n / a.gs] != 0;
        if constexpr (OP == OP_N) {
          if (a.bias) out += to_f32(static_cast<const TW*>(a.bias)[n]);
        } else {
          out = silu(out) * acc[NB - 1][i][j];
        }
        out = on ? out : 0.0f;
      } else if constexpr (OP == OP_LIN) {
        out += to_f32(static_cast<const TW*>(a.bias)[n]);
      }
      y[m * a.ldy + n] = from_f32<TY>(out);
    }
  }
}

template <typename TX, typename TW, typename TY, int OP>
int launch(const KArgs& a, cudaStream_t stream) {
  const int64_t gy = ceil_div(a.N, kBN);
  if (gy > 65535) return WIDE_ERR_INVALID_ARGUMENT;
  dim3 grid(static_cast<unsigned>(ceil_div(a.M, kBM)), static_cast<unsigned>(gy));
  simt_kernel<TX, TW, TY, OP><<<grid, kThreads, 0, stream>>>(a);
  WIDE_LAUNCHED();
  return WIDE_OK;
}

}  // namespace

int simt_gemm(Op op, wide_dtype_t dtype, const KArgs& a, cudaStream_t stream) {
  return dispatch_dtype(dtype, [&](auto t) -> int {
    using T = decltype(t);
    switch (op) {
      case OP_N: return launch<T, T, T, OP_N>(a, stream);
      case OP_GATED: return launch<T, T, T, OP_GATED>(a, stream);
      case OP_K: return launch<T, T, T, OP_K>(a, stream);
      case OP_LIN: return launch<T, float, float, OP_LIN>(a, stream);
    }
    return WIDE_ERR_INVALID_ARGUMENT;
  });
}

}  // namespace wide
