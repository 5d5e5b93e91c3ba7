// common.cuh: internal helpers shared by the kernel sources (not installed).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "wide_kernels.h"

namespace wide {

// ---- status plumbing -------------------------------------------------------
// Every CUDA call in a launch function goes through WIDE_CUDA; kernel launches
// are followed by WIDE_LAUNCHED() (cudaGetLastError, which does not sync).
#define WIDE_CUDA(call)                                   \
  do {                                                    \
    cudaError_t wide_err_ = (call);                       \
    if (wide_err_ != cudaSuccess) {                       \
      ::wide::set_last_cuda_error(wide_err_);             \
      return WIDE_ERR_CUDA;                               \
    }                                                     \
  } while (0)
#define WIDE_LAUNCHED() WIDE_CUDA(cudaGetLastError())
#define WIDE_REQUIRE(cond)                                \
  do {                                                    \
    if (!(cond)) return WIDE_ERR_INVALID_ARGUMENT;        \
  } while (0)

void set_last_cuda_error(cudaError_t err);

// ---- element conversion ------------------------------------------------------
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// 16-byte vector of T: 4 floats or 8 halves / bfloat16s.
template <typename T> struct Vec16 {
  static constexpr int N = 16 / sizeof(T);
  uint4 raw;
  __device__ __forceinline__ float get(int i) const {
    return to_f32(reinterpret_cast<const T*>(&raw)[i]);
  }
};

template <typename T>
__device__ __forceinline__ Vec16<T> load16(const T* p) {
  Vec16<T> v;
  v.raw = __ldg(reinterpret_cast<const uint4*>(p));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

// ---- cp.async (sm_80+) ------------------------------------------------------
// src_bytes == 0 zero-fills the 16 destination bytes (used for padding rows,
// the K tail and inputs of skipped groups) without reading global memory.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, int src_bytes) {
  unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// max of f(m) * m over 1 <= m <= M with f(m) >= vmin (0 if none), for a split
// count f that is non-increasing in m with values <= vmax. Workspace queries
// use it so the size for M also covers every smaller M: TensorRT allocates the
// size at the profile's maximum shape and runs smaller shapes in it, and split
// counts shrink as M grows, so splits(M) * M alone is not monotonic in M.
template <typename F>
int64_t max_splits_times_rows(int64_t M, int64_t vmin, int64_t vmax, F f) {
  int64_t best = 0;
  for (int64_t v = vmin; v <= vmax && M >= 1 && f(1) >= v; ++v) {
    int64_t lo = 1, hi = M;  // largest m <= M with f(m) >= v (f(1) >= v)
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (f(mid) >= v) lo = mid; else hi = mid - 1;
    }
    const int64_t c = f(lo) * lo;
    best = c > best ? c : best;
  }
  return best;
}

template <typename T> struct DtypeOf;
template <> struct DtypeOf<float> { static constexpr wide_dtype_t value = WIDE_FLOAT32; };
template <> struct DtypeOf<__half> { static constexpr wide_dtype_t value = WIDE_FLOAT16; };
template <> struct DtypeOf<__nv_bfloat16> { static constexpr wide_dtype_t value = WIDE_BFLOAT16; };

inline size_t dtype_size(wide_dtype_t d) { return d == WIDE_FLOAT32 ? 4 : 2; }

// Calls f(T{}) with the C++ type of `dtype`; returns WIDE_ERR_UNSUPPORTED_DTYPE otherwise.
template <typename F> int dispatch_dtype(wide_dtype_t dtype, F&& f) {
  switch (dtype) {
    case WIDE_FLOAT32: return f(float{});
    case WIDE_FLOAT16: return f(__half{});
    case WIDE_BFLOAT16: return f(__nv_bfloat16{});
  }
  return WIDE_ERR_UNSUPPORTED_DTYPE;
}

}  // namespace wide
