// A decode step (model/modeling.py WideForCausalLM.forward for one new token a row: DecoderLayer.forward of each
// layer in turn, the final RMSNorm, the LM head) in one call. Op by op, a float16 decode step spent about a
// quarter of its time in Python and dispatch between the ops (Python run between kernels that stream the weights
// runs with cold caches). The same kernels in the same order with the same roundings, per layer:
//   mask_a = router_attention(h); x = rms_norm(h); q = gemm_n(x, wq, mask_a) + bq; k, v = x W^T + b (dense);
//   q, k = q_norm(q), k_norm(k) (Qwen3); rope(q, k); the cache's row `length` = k, v;
//   o = decode attention over length + 1 positions (skipped heads 0); h1 = h + o W_o (gemm_kt over mask_a);
//   mask_f = router_ffn(h1); y = gated(rms_norm(h1), mask_f); out = h1 + y W_d (gemm_kt over mask_f).
// A layer without a router runs that sublayer dense, through the same kernels with one group every token
// executes (an unrouted FFN's silu(gate) * up rounded once, as the kernels do; the reference's torch ops round
// each).
#include "decode_step.h"

#include "gemm.h"
#include "isa.h"
#include "ops.h"

namespace wide_cpu {
namespace {

// A layer's scratch of dtype T, the calling thread's (grown once): carve(n) hands out n elements in turn
struct Arena {
  std::vector<float> buf;
  size_t used = 0;
  template <typename U>
  U* carve(int64_t n) {
    const size_t words = (static_cast<size_t>(n) * sizeof(U) + 63) / 64 * 16;  // 64-byte steps
    U* p = reinterpret_cast<U*>(buf.data() + used);
    used += words;
    return p;
  }
};

template <typename T>
void routed_mask(const T* h, const LayerShape& s, const RouterWeights& r, int64_t G, float* hf, int32_t* mask) {
  if (s.force) {
    std::fill(mask, mask + s.B * G, 1);
    return;
  }
  const float* hp = reinterpret_cast<const float*>(h);
  if (!std::is_same_v<T, float>) {
    for (int64_t i = 0; i < s.B * s.H; ++i) hf[i] = load1(h + i);
    hp = hf;
  }
  router_impl(hp, s.B, s.H, r.wc, r.bc, r.R, r.wr, r.br, G, mask);
}

template <typename T>
void add_rows(const T* a, const T* b, T* out, int64_t n) {  // as torch adds in T: float sum, rounded once
  for (int64_t i = 0; i < n; ++i) put(out + i, load1(a + i) + load1(b + i));
}

template <typename T>
void decode_layer(const T* h, T* out, const StepLayer& layer, int64_t length, const T* cos, const T* sin, float eps) {
  const LayerShape& s = layer.s;
  const LayerWeights& lw = layer.w;
  const auto W = [](const void* p) { return static_cast<const T*>(p); };
  const int64_t B = s.B, H = s.H, NQ = s.Hq * s.D, NK = s.Hk * s.D;
  const int64_t ga = s.gh ? s.Hq / s.gh : 1, gf = s.gs ? s.F / s.gs : 1;
  thread_local Arena arena;  // every buffer below (at most 4 bytes an element), each rounded up to 16 words
  const size_t need = static_cast<size_t>(4 * B * H + 2 * B * NQ + 2 * B * NK + B * s.F + B * (1 + ga + gf)) + 12 * 16;
  if (arena.buf.size() < need) arena.buf.resize(need);
  arena.used = 0;
  T* x = arena.carve<T>(B * H);
  T* q = arena.carve<T>(B * NQ);
  T* k = arena.carve<T>(B * NK);
  T* v = arena.carve<T>(B * NK);
  T* o = arena.carve<T>(B * NQ);
  T* h1 = arena.carve<T>(B * H);
  T* y = arena.carve<T>(B * s.F);
  T* part = arena.carve<T>(B * H);
  float* hf = arena.carve<float>(B * H);
  int32_t* ones = arena.carve<int32_t>(B);
  int32_t* ma = arena.carve<int32_t>(B * ga);
  int32_t* mf = arena.carve<int32_t>(B * gf);
  std::fill(ones, ones + B, 1);

  const Kernels<T>& kern = kernels<T>();
  const auto norm_rows = [&](const T* in, const T* wt, T* dst, int64_t rows, int64_t n) {
    for (int64_t m = 0; m < rows; ++m) kern.rms_norm_row(in + m * n, wt, dst + m * n, n, eps);
  };
  const auto dense = [&](const T* in, const T* wt, const T* bias, T* dst, int64_t N, int64_t K) {
    gemm_n_impl<T>(in, wt, ones, bias, dst, Geometry{B, N, K, 1, N});
  };
  T* ck = static_cast<T*>(layer.cache_k);
  T* cv = static_cast<T*>(layer.cache_v);

  // attention
  if (s.gh) routed_mask<T>(h, s, lw.attention_router, ga, hf, ma);
  norm_rows(h, W(lw.input_norm), x, B, H);
  if (s.gh) gemm_n_impl<T>(x, W(lw.wq), ma, W(lw.bq), q, Geometry{B, NQ, H, ga, s.gh * s.D});
  else dense(x, W(lw.wq), W(lw.bq), q, NQ, H);
  dense(x, W(lw.wk), W(lw.bk), k, NK, H);
  dense(x, W(lw.wv), W(lw.bv), v, NK, H);
  if (lw.q_norm) {
    norm_rows(q, W(lw.q_norm), q, B * s.Hq, s.D);
    norm_rows(k, W(lw.k_norm), k, B * s.Hk, s.D);
  }
  for (int64_t r = 0; r < B; ++r) {
    kern.rope(q + r * NQ, 1, s.Hq, s.D, cos + r * s.D, sin + r * s.D);
    kern.rope(k + r * NK, 1, s.Hk, s.D, cos + r * s.D, sin + r * s.D);
    for (int64_t kh = 0; kh < s.Hk; ++kh) {
      std::memcpy(ck + r * layer.cache_b + kh * layer.cache_h + length * s.D, k + (r * s.Hk + kh) * s.D,
                  s.D * sizeof(T));
      std::memcpy(cv + r * layer.cache_b + kh * layer.cache_h + length * s.D, v + (r * s.Hk + kh) * s.D,
                  s.D * sizeof(T));
    }
  }
  const AttnShape a{B, s.Hq, s.Hk, length + 1, s.D, layer.cache_b, layer.cache_h, layer.cache_b, layer.cache_h,
                    static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.D)))};
  decode_attention_impl<T>(q, ck, cv, o, a, s.gh ? ma : nullptr, s.gh ? s.gh : 1);
  if (s.gh) gemm_kt_impl<T>(o, W(lw.wo), ma, W(lw.bo), part, Geometry{B, H, NQ, ga, s.gh * s.D});
  else dense(o, W(lw.wo), W(lw.bo), part, H, NQ);
  add_rows<T>(h, part, h1, B * H);

  // FFN
  if (s.gs) routed_mask<T>(h1, s, lw.ffn_router, gf, hf, mf);
  norm_rows(h1, W(lw.post_norm), x, B, H);
  gemm_n_impl<T>(x, W(lw.wg), s.gs ? mf : ones, nullptr, y, Geometry{B, s.F, H, gf, s.gs ? s.gs : s.F}, W(lw.wu));
  if (s.gs) gemm_kt_impl<T>(y, W(lw.wd), mf, nullptr, part, Geometry{B, H, s.F, gf, s.gs});
  else dense(y, W(lw.wd), nullptr, part, H, s.F);
  add_rows<T>(h1, part, out, B * H);
}

}  // namespace

template <typename T>
void decode_step_impl(const T* h, const std::vector<StepLayer>& layers, int64_t length, const T* cos, const T* sin,
                      float eps, const T* norm_w, const T* head_w, int64_t V, T* out) {
  const int64_t B = layers[0].s.B, H = layers[0].s.H;
  thread_local std::vector<T> stream;  // the residual stream between layers, two buffers (grown once)
  stream.resize(static_cast<size_t>(3 * B * H));
  const T* src = h;
  for (size_t l = 0; l < layers.size(); ++l) {
    T* to = stream.data() + (l % 2) * B * H;
    decode_layer<T>(src, to, layers[l], length, cos, sin, eps);
    src = to;
  }
  const auto norm_row = kernels<T>().rms_norm_row;
  T* normed = stream.data() + 2 * B * H;  // the final RMSNorm, then the LM head (one group every token executes)
  for (int64_t m = 0; m < B; ++m) norm_row(src + m * H, norm_w, normed + m * H, H, eps);
  thread_local std::vector<int32_t> ones;
  ones.assign(B, 1);
  gemm_n_impl<T>(normed, head_w, ones.data(), nullptr, out, Geometry{B, V, H, 1, V});
}

#define WIDE_STEP(T)                                                                                                \
  template void decode_step_impl<T>(const T*, const std::vector<StepLayer>&, int64_t, const T*, const T*, float,   \
                                    const T*, const T*, int64_t, T*);
WIDE_STEP(float)
WIDE_STEP(uint16_t)
WIDE_STEP(c10::Half)
#undef WIDE_STEP

}  // namespace wide_cpu
