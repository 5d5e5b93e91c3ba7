// The small ops around the projections, one call each where the model's reference spends several torch ops
// (a decode step runs each once a layer; their time was dispatch, not arithmetic), and decode attention. Same
// rounding as the reference: every intermediate the reference stores in the input dtype is rounded to it here.
// The row kernels are the instruction set's (isa.h: AVX-512, or AVX2 with 8 lanes and attention for head sizes
// of 8s; with neither, RMSNorm and RoPE run scalar code and decline float16, and attention declines).
#include "ops.h"

#include <ATen/Parallel.h>

#include "gemm.h"

namespace wide_cpu {

template <typename T>
void rms_norm_impl(const T* x, const T* w, T* out, int64_t M, int64_t H, float eps) {
  const auto row = kernels<T>().rms_norm_row;
  at::parallel_for(0, M, 8, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) row(x + m * H, w, out + m * H, H, eps);
  });
}

template <typename T>
void rope_impl(T* x, int64_t M, int64_t H, int64_t D, const T* cos, const T* sin) {
  const auto rope = kernels<T>().rope;
  at::parallel_for(0, M, 64, [&](int64_t b, int64_t e) {  // a decode step's few rows run in the calling thread
    rope(x + b * H * D, e - b, H, D, cos + b * D, sin + b * D);
  });
}

// Decode attention of one query per sequence over its past, the query heads of skipped groups left out: for each
// sequence and KV head, the active query heads of that KV head (GQA: Hq / Hk consecutive heads) score every past
// key, softmax (float32, max subtracted), and sum the values; a KV head none of whose query heads is active is
// not read, and skipped heads' outputs are 0 (o_proj ignores them). k / v [B, Hk, >= L, D] with any batch and head
// strides (a preallocated cache).
template <typename T>
void decode_attention_impl(const T* q, const T* k, const T* v, T* out, const AttnShape& a, const int32_t* mask,
                           int64_t group_heads) {
  const int64_t rep = a.Hq / a.Hk;
  const auto attend = kernels<T>().attend_kv_head;
  at::parallel_for(0, a.B * a.Hk, 1, [&](int64_t b0, int64_t e0) {
    thread_local std::vector<float> sc;  // scores of the active heads, grown once
    thread_local std::vector<int> heads;
    for (int64_t it = b0; it < e0; ++it) {
      const int64_t b = it / a.Hk, kh = it % a.Hk;
      heads.clear();
      for (int64_t h = kh * rep; h < (kh + 1) * rep; ++h) {
        if (!mask || mask[b * (a.Hq / group_heads) + h / group_heads]) heads.push_back(static_cast<int>(h));
        else for (int64_t d = 0; d < a.D; ++d) put(out + (b * a.Hq + h) * a.D + d, 0.f);
      }
      if (!heads.empty())
        attend(q + b * a.Hq * a.D, k + b * a.kb + kh * a.kh, v + b * a.vb + kh * a.vh, out + b * a.Hq * a.D, a,
               heads.data(), static_cast<int>(heads.size()), sc);
    }
  });
}

// The router (ops/reference.py wide_router) for a few tokens: z = h Wc^T + bc, logits = z Wr^T + br in float32
// through the masked GEMM with its one group executed
void router_impl(const float* h, int64_t M, int64_t H, const float* wc, const float* bc, int64_t R, const float* wr,
                 const float* br, int64_t G, int32_t* mask) {
  thread_local std::vector<float> z, logits;  // grown once
  thread_local std::vector<int32_t> ones;
  z.resize(M * R), logits.resize(M * 2 * G), ones.assign(M, 1);
  gemm_n_impl<float>(h, wc, ones.data(), bc, z.data(), Geometry{M, R, H, 1, R});
  gemm_n_impl<float>(z.data(), wr, ones.data(), br, logits.data(), Geometry{M, 2 * G, R, 1, 2 * G});
  for (int64_t i = 0; i < M * G; ++i) mask[i] = logits[2 * i] >= logits[2 * i + 1];
}

#define WIDE_OPS(T)                                                                                       \
  template void rms_norm_impl<T>(const T*, const T*, T*, int64_t, int64_t, float);                        \
  template void rope_impl<T>(T*, int64_t, int64_t, int64_t, const T*, const T*);                          \
  template void decode_attention_impl<T>(const T*, const T*, const T*, T*, const AttnShape&, const int32_t*, \
                                         int64_t);
WIDE_OPS(float)
WIDE_OPS(uint16_t)
WIDE_OPS(c10::Half)
#undef WIDE_OPS

}  // namespace wide_cpu
