// The AVX2 table (isa.h): AVX2 + FMA + F16C, 8 lanes, bfloat16 and float16 widened on load (simd_avx2.h).
#include "isa.h"
#include "scalar.h"
#include "simd_avx2.h"

namespace wide_cpu {
namespace {

// ---------------------------------------------------------------------------------------------------------
// The masked GEMMs' dot products: NRv weight rows x NM activation rows in one pass over k, added to acc[r][m_at + m]
template <typename T, int NRv, int NM>
WIDE_AVX2 void dots_tile(const T* const* w, const T* const* x, int64_t len, AccRows acc, int m_at) {
  __m256 a[NRv][NM];
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) a[r][m] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    __m256 xv[NM];
    WIDE_UNROLL for (int m = 0; m < NM; ++m) xv[m] = load8(x[m] + k);
    WIDE_UNROLL for (int r = 0; r < NRv; ++r) {
      __m256 wv = load8(w[r] + k);
      WIDE_UNROLL for (int m = 0; m < NM; ++m) a[r][m] = _mm256_fmadd_ps(wv, xv[m], a[r][m]);
    }
  }
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) {
      float s = hsum8(a[r][m]);
      for (int64_t t = k; t < len; ++t) s += load1(w[r] + t) * load1(x[m] + t);
      acc[r][m_at + m] += s;
    }
}

// nr (1..NR) x nm (1..MT): full blocks of NR rows at once, the rows of a group's last partial block one at a time;
// activation rows in chunks of two (the register file holds NR x 2 accumulators and their operands)
template <typename T>
void dots(const T* const* w, int nr, const T* const* x, int nm, int64_t len, Acc& acc, int64_t) {
  constexpr int CHUNK = 2;
  for (int m0 = 0; m0 < nm; m0 += CHUNK) {
    const int c = std::min(CHUNK, nm - m0);
    if (nr == NR) {
      if (c == 2) dots_tile<T, NR, 2>(w, x + m0, len, acc, m0);
      else dots_tile<T, NR, 1>(w, x + m0, len, acc, m0);
      continue;
    }
    for (int r = 0; r < nr; ++r) {  // a group's last channels, one row at a time
      Acc one = {};
      if (c == 2) dots_tile<T, 1, 2>(w + r, x + m0, len, one, 0);
      else dots_tile<T, 1, 1>(w + r, x + m0, len, one, 0);
      for (int m = 0; m < c; ++m) acc[r][m0 + m] += one[0][m];
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// pack_k's layout (repack.cpp): one token, four blocks of KB channels at once (two vectors a block)
template <typename T>
WIDE_AVX2 void axpy4(const T* const* blk, int64_t gs, const T* xg, float (*acc)[KB]) {
  __m256 lo[4], hi[4];
  WIDE_UNROLL for (int i = 0; i < 4; ++i) lo[i] = _mm256_loadu_ps(acc[i]), hi[i] = _mm256_loadu_ps(acc[i] + 8);
  for (int64_t k = 0; k < gs; ++k) {
    const __m256 xv = _mm256_set1_ps(load1(xg + k));
    WIDE_UNROLL for (int i = 0; i < 4; ++i) {
      lo[i] = _mm256_fmadd_ps(load8(blk[i] + k * KB), xv, lo[i]);
      hi[i] = _mm256_fmadd_ps(load8(blk[i] + k * KB + 8), xv, hi[i]);
    }
  }
  WIDE_UNROLL for (int i = 0; i < 4; ++i) _mm256_storeu_ps(acc[i], lo[i]), _mm256_storeu_ps(acc[i] + 8, hi[i]);
}

template <typename T>
WIDE_AVX2 void axpy_block(const T* blk, int64_t gs, const T* const* xg, int nm, float (*acc)[KB]) {
  __m256 lo[MR], hi[MR];
  for (int m = 0; m < nm; ++m) lo[m] = _mm256_loadu_ps(acc[m]), hi[m] = _mm256_loadu_ps(acc[m] + 8);
  for (int64_t k = 0; k < gs; ++k) {
    const __m256 w0 = load8(blk + k * KB), w1 = load8(blk + k * KB + 8);
    for (int m = 0; m < nm; ++m) {
      const __m256 xv = _mm256_set1_ps(load1(xg[m] + k));
      lo[m] = _mm256_fmadd_ps(w0, xv, lo[m]);
      hi[m] = _mm256_fmadd_ps(w1, xv, hi[m]);
    }
  }
  for (int m = 0; m < nm; ++m) _mm256_storeu_ps(acc[m], lo[m]), _mm256_storeu_ps(acc[m] + 8, hi[m]);
}

// gemm_kt (gemm.cpp): 8 columns a step, the last ones scalar
template <typename T>
WIDE_AVX2 void rows_axpy(const T* const* w, int nw, int64_t len, const float (*xs)[KT_ROWS], int nm,
                         float* const* acc, int64_t) {
  int64_t n = 0;
  for (; n + 8 <= len; n += 8) {
    __m256 wv[KT_ROWS];
    for (int i = 0; i < nw; ++i) wv[i] = load8(w[i] + n);
    for (int m = 0; m < nm; ++m) {
      __m256 a = _mm256_loadu_ps(acc[m] + n);
      for (int i = 0; i < nw; ++i) a = _mm256_fmadd_ps(wv[i], _mm256_set1_ps(xs[m][i]), a);
      _mm256_storeu_ps(acc[m] + n, a);
    }
  }
  if (n < len) {
    const T* tail[KT_ROWS];
    float* tacc[KT_TOKENS];
    for (int i = 0; i < nw; ++i) tail[i] = w[i] + n;
    for (int m = 0; m < nm; ++m) tacc[m] = acc[m] + n;
    rows_axpy_scalar(tail, nw, len - n, xs, nm, tacc);
  }
}

// ---------------------------------------------------------------------------------------------------------
// The small ops (ops.cpp): RMSNorm, RoPE, decode attention
template <typename T>
WIDE_AVX2 void rms_norm_row(const T* x, const T* w, T* out, int64_t H, float eps) {
  __m256 s0 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= H; k += 8) {
    const __m256 a = load8(x + k);
    s0 = _mm256_fmadd_ps(a, a, s0);
  }
  float ss = hsum8(s0);
  for (int64_t j = k; j < H; ++j) ss += load1(x + j) * load1(x + j);
  const float r = 1.f / std::sqrt(ss / H + eps);
  const __m256 rv = _mm256_set1_ps(r);
  for (k = 0; k + 8 <= H; k += 8) store8(out + k, _mm256_mul_ps(load8(w + k), round8(_mm256_mul_ps(load8(x + k), rv), x)));
  for (; k < H; ++k) put(out + k, load1(w + k) * rounded<T>(load1(x + k) * r));
}

template <typename T>
WIDE_AVX2 void rope(T* x, int64_t M, int64_t H, int64_t D, const T* cos, const T* sin) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < M * H; ++i) {
    T* row = x + i * D;
    const T* c = cos + (i / H) * D;
    const T* s = sin + (i / H) * D;
    int64_t j = 0;
    for (; j + 8 <= half; j += 8) {
      const __m256 a = load8(row + j), b = load8(row + half + j);
      const __m256 nb = _mm256_sub_ps(_mm256_setzero_ps(), b);
      const __m256 lo = _mm256_add_ps(round8(_mm256_mul_ps(a, load8(c + j)), row), round8(_mm256_mul_ps(nb, load8(s + j)), row));
      const __m256 hi = _mm256_add_ps(round8(_mm256_mul_ps(b, load8(c + half + j)), row),
                                      round8(_mm256_mul_ps(a, load8(s + half + j)), row));
      store8(row + j, lo);
      store8(row + half + j, hi);
    }
    for (; j < half; ++j) {  // the scalar rule of rope_scalar for the last pairs
      const float a = load1(row + j), b = load1(row + half + j);
      put(row + j, rounded<T>(a * load1(c + j)) + rounded<T>(-b * load1(s + j)));
      put(row + half + j, rounded<T>(b * load1(c + half + j)) + rounded<T>(a * load1(s + half + j)));
    }
  }
}

// The active query heads of one KV head score every past key, softmax (float32, max subtracted), sum the values;
// 8 lanes, so head sizes of 8s (attention_d_multiple)
template <typename T>
WIDE_AVX2 void attend_kv_head(const T* q, const T* k, const T* v, T* out, const AttnShape& a, const int* heads,
                              int nh, std::vector<float>& sc) {
  constexpr int DV = 512 / 8;
  sc.resize(static_cast<size_t>(nh) * a.L);
  const int nd = static_cast<int>(a.D / 8);
  for (int hi = 0; hi < nh; ++hi) {
    const T* qh = q + heads[hi] * a.D;
    __m256 qv[DV];
    for (int d = 0; d < nd; ++d) qv[d] = _mm256_mul_ps(load8(qh + 8 * d), _mm256_set1_ps(a.scale));
    float* s = sc.data() + static_cast<size_t>(hi) * a.L;
    float mx = -INFINITY;
    for (int64_t j = 0; j < a.L; ++j) {
      const T* kj = k + j * a.D;
      __m256 acc = _mm256_setzero_ps();
      for (int d = 0; d < nd; ++d) acc = _mm256_fmadd_ps(qv[d], load8(kj + 8 * d), acc);
      s[j] = hsum8(acc);
      mx = std::max(mx, s[j]);
    }
    const __m256 m = _mm256_set1_ps(mx);
    float sum = 0.f;
    int64_t j = 0;
    for (; j + 8 <= a.L; j += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
      _mm256_storeu_ps(s + j, e);
      sum += hsum8(e);
    }
    for (; j < a.L; ++j) sum += (s[j] = std::exp(s[j] - mx));
    const float inv = 1.f / sum;
    __m256 o[DV];
    for (int d = 0; d < nd; ++d) o[d] = _mm256_setzero_ps();
    for (j = 0; j < a.L; ++j) {
      const __m256 pj = _mm256_set1_ps(s[j]);
      const T* vj = v + j * a.D;
      for (int d = 0; d < nd; ++d) o[d] = _mm256_fmadd_ps(pj, load8(vj + 8 * d), o[d]);
    }
    T* oh = out + heads[hi] * a.D;
    for (int d = 0; d < nd; ++d) store8(oh + 8 * d, _mm256_mul_ps(o[d], _mm256_set1_ps(inv)));
  }
}

}  // namespace

template <typename T>
Kernels<T> avx2_kernels() {
  Kernels<T> k{};
  k.dots = dots<T>;
  k.axpy4 = axpy4<T>;
  k.axpy4_tokens = nullptr;  // several tokens of the packed layout: block by block (axpy_block)
  k.axpy_block = axpy_block<T>;
  k.rows_axpy = rows_axpy<T>;
  k.rms_norm_row = rms_norm_row<T>;
  k.rope = rope<T>;
  k.attend_kv_head = attend_kv_head<T>;
  k.attention_d_multiple = 8;
  return k;
}

template Kernels<float> avx2_kernels<float>();
template Kernels<uint16_t> avx2_kernels<uint16_t>();
template Kernels<c10::Half> avx2_kernels<c10::Half>();

}  // namespace wide_cpu
