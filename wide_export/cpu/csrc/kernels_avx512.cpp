// The AVX-512 and AVX-512 BF16 tables (isa.h): 16 lanes, bfloat16 and float16 widened on load (simd_avx512.h);
// with BF16, the masked GEMMs' bfloat16 dot products multiply bf16 pairs by vdpbf16ps (each product exact in
// float32, summed into 16 lanes), everything else as AVX-512.
#include "isa.h"
#include "simd_avx512.h"

namespace wide_cpu {
namespace {

// ---------------------------------------------------------------------------------------------------------
// The masked GEMMs' dot products. The products of NRv weight rows and NM activation rows over k in [k0, k0 + len),
// added to vector partial sums p[r][m_at + m] (one __m512 per row and token, NRv * NM <= 16) that stay in memory
// between calls: tile_avx512 takes all of k at once, the many-token path walks k in chunks so that a chunk of every
// token's activations stays in L1 while all the rows of a block pass over it.
template <typename T, int NRv, int NM>
WIDE_AVX512 void part_avx512(const T* const* w, const T* const* x, int64_t k0, int64_t len, __m512 (*p)[MT],
                             int m_at, int64_t ahead) {
  __m512 a[NRv][NM];
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) a[r][m] = p[r][m_at + m];
  const int64_t end = k0 + len;
  int64_t k = k0;
  for (; k + 16 <= end; k += 16) {
    __m512 wv[NRv];
    WIDE_UNROLL for (int r = 0; r < NRv; ++r) wv[r] = load16(w[r] + k, 0xFFFF);
    if (ahead)
      WIDE_UNROLL for (int r = 0; r < NRv; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + ahead + k), _MM_HINT_T1);
    WIDE_UNROLL for (int m = 0; m < NM; ++m) {
      const __m512 xv = load16(x[m] + k, 0xFFFF);
      WIDE_UNROLL for (int r = 0; r < NRv; ++r) a[r][m] = _mm512_fmadd_ps(wv[r], xv, a[r][m]);
    }
  }
  if (k < end) {
    const __mmask16 km = static_cast<__mmask16>((1u << (end - k)) - 1);
    __m512 wv[NRv];
    WIDE_UNROLL for (int r = 0; r < NRv; ++r) wv[r] = load16(w[r] + k, km);
    WIDE_UNROLL for (int m = 0; m < NM; ++m) {
      const __m512 xv = load16(x[m] + k, km);
      WIDE_UNROLL for (int r = 0; r < NRv; ++r) a[r][m] = _mm512_fmadd_ps(wv[r], xv, a[r][m]);
    }
  }
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) p[r][m_at + m] = a[r][m];
}

// BF16: 32 bf16 pairs a step
template <int NRv, int NM>
WIDE_AVX512BF16 void part_bf16(const uint16_t* const* w, const uint16_t* const* x, int64_t k0, int64_t len,
                               __m512 (*p)[MT], int m_at, int64_t ahead) {
  __m512 a[NRv][NM];
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) a[r][m] = p[r][m_at + m];
  const int64_t end = k0 + len;
  for (int64_t k = k0; k < end; k += 32) {
    const __mmask32 km = end - k >= 32 ? ~static_cast<__mmask32>(0)
                                       : static_cast<__mmask32>((1ull << (end - k)) - 1);
    __m512bh wv[NRv];
    WIDE_UNROLL for (int r = 0; r < NRv; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(km, w[r] + k);
    if (ahead)
      WIDE_UNROLL for (int r = 0; r < NRv; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + ahead + k), _MM_HINT_T1);
    WIDE_UNROLL for (int m = 0; m < NM; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(km, x[m] + k);
      WIDE_UNROLL for (int r = 0; r < NRv; ++r) a[r][m] = _mm512_dpbf16_ps(a[r][m], wv[r], xv);
    }
  }
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) p[r][m_at + m] = a[r][m];
}

// The whole dot products of rows x tokens, added to acc[r][m_at + m] (the partial sums stay in registers)
template <typename T, int NRv, int NM>
WIDE_AVX512 void tile_avx512(const T* const* w, const T* const* x, int64_t len, AccRows acc, int m_at,
                             int64_t ahead) {
  __m512 p[NRv][MT];
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) p[r][m] = _mm512_setzero_ps();
  part_avx512<T, NRv, NM>(w, x, 0, len, p, 0, ahead);
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) acc[r][m_at + m] += _mm512_reduce_add_ps(p[r][m]);
}

template <int NRv, int NM>
WIDE_AVX512BF16 void tile_bf16(const uint16_t* const* w, const uint16_t* const* x, int64_t len, AccRows acc,
                               int m_at, int64_t ahead) {
  __m512 p[NRv][MT];
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) p[r][m] = _mm512_setzero_ps();
  part_bf16<NRv, NM>(w, x, 0, len, p, 0, ahead);
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) acc[r][m_at + m] += _mm512_reduce_add_ps(p[r][m]);
}

// K<T, NRv, NM>::go (whole dot products) and P<T, NRv, NM>::go (partial sums over a chunk of k) of AVX-512 and of
// BF16 (T = uint16_t only)
template <typename T, int NRv, int NM>
struct Avx512K {
  static void go(const T* const* w, const T* const* x, int64_t len, AccRows acc, int m_at, int64_t ahead) {
    tile_avx512<T, NRv, NM>(w, x, len, acc, m_at, ahead);
  }
};
template <typename T, int NRv, int NM>
struct Bf16K {
  static void go(const T* const* w, const T* const* x, int64_t len, AccRows acc, int m_at, int64_t ahead) {
    tile_bf16<NRv, NM>(w, x, len, acc, m_at, ahead);
  }
};
template <typename T, int NRv, int NM>
struct Avx512P {
  static void go(const T* const* w, const T* const* x, int64_t k0, int64_t len, __m512 (*p)[MT], int m_at,
                 int64_t ahead) {
    part_avx512<T, NRv, NM>(w, x, k0, len, p, m_at, ahead);
  }
};
template <typename T, int NRv, int NM>
struct Bf16P {
  static void go(const T* const* w, const T* const* x, int64_t k0, int64_t len, __m512 (*p)[MT], int m_at,
                 int64_t ahead) {
    part_bf16<NRv, NM>(w, x, k0, len, p, m_at, ahead);
  }
};

// K<T, NRv, nm>::go for a run-time nm in [LO, HI], on activation rows x[0 .. nm) into acc columns 0 ..
template <typename T, template <typename, int, int> class K, int NRv, int LO, int HI>
inline void go_nm(int nm, const T* const* w, const T* const* x, int64_t len, AccRows acc, int64_t ahead) {
  if constexpr (LO < HI) {
    if (nm != LO) return go_nm<T, K, NRv, LO + 1, HI>(nm, w, x, len, acc, ahead);
  }
  K<T, NRv, LO>::go(w, x, len, acc, 0, ahead);
}

// P<T, NRv, nm>::go for a run-time nm in [LO, HI], on activation rows x[0 .. nm) into partial sums m_at ..
template <typename T, template <typename, int, int> class P, int NRv, int LO, int HI>
inline void part_nm(int nm, const T* const* w, const T* const* x, int64_t k0, int64_t len, __m512 (*p)[MT],
                    int m_at, int64_t ahead) {
  if constexpr (LO < HI) {
    if (nm != LO) return part_nm<T, P, NRv, LO + 1, HI>(nm, w, x, k0, len, p, m_at, ahead);
  }
  P<T, NRv, LO>::go(w, x, k0, len, p, m_at, ahead);
}

WIDE_AVX512 void reduce_parts(const __m512 (*p)[MT], int nr, int nm, Acc& acc) {
  for (int r = 0; r < nr; ++r)
    for (int m = 0; m < nm; ++m) acc[r][m] += _mm512_reduce_add_ps(p[r][m]);
}

// More than 8 tokens: the row pairs of dots_one_pass, but k in chunks of KC, every pass of the block over one chunk
// before the next, so a chunk of the tokens' activations (16 x 2 KB of float32) is read from L2 once per block and
// then from L1; vector partial sums stay in memory between chunks (no horizontal sums but the last).
constexpr int64_t KC = 512;

template <typename T, template <typename, int, int> class P>
void dots_chunked(const T* const* w, int nr, const T* const* x, int nm, int64_t len, Acc& acc, int64_t stride) {
  alignas(64) __m512 part[NR][MT];
  std::memset(part, 0, sizeof part);
  const int first = (nm + 1) / 2;
  for (int64_t k0 = 0; k0 < len; k0 += KC) {
    const int64_t kl = std::min(KC, len - k0);
    int r = 0;
    for (; r + 2 <= nr; r += 2) {
      part_nm<T, P, 2, 1, 8>(first, w + r, x, k0, kl, part + r, 0, 2 * stride);
      part_nm<T, P, 2, 1, 8>(nm - first, w + r, x + first, k0, kl, part + r, first, 0);
    }
    for (; r < nr; ++r) {
      part_nm<T, P, 1, 1, 8>(first, w + r, x, k0, kl, part + r, 0, stride);
      part_nm<T, P, 1, 1, 8>(nm - first, w + r, x + first, k0, kl, part + r, first, 0);
    }
  }
  reduce_parts(part, nr, nm, acc);
}

// The weight rows against nm <= 8 activation rows (32 vector registers, at most 16 accumulators): rows in blocks of
// NR for up to 4 tokens, in pairs for 5..8, each meeting its tokens in one pass over k. Every weight vector loaded
// serves every token, so a row streams from memory once per call, and the activations (a few KB a token) come from
// cache.
template <typename T, template <typename, int, int> class K>
void dots_one_pass(const T* const* w, int nr, const T* const* x, int nm, int64_t len, Acc& acc, int64_t stride) {
  int r = 0;
  if (nm <= 4) {
    for (; r + NR <= nr; r += NR) go_nm<T, K, NR, 1, 4>(nm, w + r, x, len, acc + r, NR * stride);
    for (; r < nr; ++r) go_nm<T, K, 1, 1, 4>(nm, w + r, x, len, acc + r, stride);
    return;
  }
  for (; r + 2 <= nr; r += 2) go_nm<T, K, 2, 5, 8>(nm, w + r, x, len, acc + r, 2 * stride);
  for (; r < nr; ++r) go_nm<T, K, 1, 5, 8>(nm, w + r, x, len, acc + r, stride);
}

// stride: the rows' matrix row length (a kernel prefetches the rows after its own into L2 while it computes, so
// more rows stream from memory at once than its few accumulators allow); 0: no prefetch
template <typename T, template <typename, int, int> class K, template <typename, int, int> class P>
void dots(const T* const* w, int nr, const T* const* x, int nm, int64_t len, Acc& acc, int64_t stride) {
  if (nm > 8) dots_chunked<T, P>(w, nr, x, nm, len, acc, stride);
  else dots_one_pass<T, K>(w, nr, x, nm, len, acc, stride);
}

// ---------------------------------------------------------------------------------------------------------
// pack_k's layout (repack.cpp)
constexpr int PREFETCH_K = 64;  // rows of a block read ahead (4 KB of float32): the next block's start too

template <typename T>
WIDE_AVX512 void axpy_block(const T* blk, int64_t gs, const T* const* xg, int nm, float (*acc)[KB]) {
  __m512 a[MR], b[MR];  // two partial sums a row (even / odd k): FMA latency, not bandwidth, bounds one chain
  for (int m = 0; m < nm; ++m) a[m] = _mm512_loadu_ps(acc[m]), b[m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 2 <= gs; k += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(blk + (k + PREFETCH_K) * KB), _MM_HINT_T0);
    const __m512 w0 = load16(blk + k * KB, 0xFFFF), w1 = load16(blk + (k + 1) * KB, 0xFFFF);
    for (int m = 0; m < nm; ++m) {
      a[m] = _mm512_fmadd_ps(w0, _mm512_set1_ps(load1(xg[m] + k)), a[m]);
      b[m] = _mm512_fmadd_ps(w1, _mm512_set1_ps(load1(xg[m] + k + 1)), b[m]);
    }
  }
  for (; k < gs; ++k) {
    const __m512 w0 = load16(blk + k * KB, 0xFFFF);
    for (int m = 0; m < nm; ++m) a[m] = _mm512_fmadd_ps(w0, _mm512_set1_ps(load1(xg[m] + k)), a[m]);
  }
  for (int m = 0; m < nm; ++m) _mm512_storeu_ps(acc[m], _mm512_add_ps(a[m], b[m]));
}

// One token, four blocks at once (four streams a thread: one stream leaves most of a core's bandwidth unused)
template <typename T>
WIDE_AVX512 void axpy4(const T* const* blk, int64_t gs, const T* xg, float (*acc)[KB]) {
  __m512 a[4];
  WIDE_UNROLL for (int i = 0; i < 4; ++i) a[i] = _mm512_loadu_ps(acc[i]);
  for (int64_t k = 0; k < gs; ++k) {
    const __m512 xv = _mm512_set1_ps(load1(xg + k));
    WIDE_UNROLL for (int i = 0; i < 4; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(blk[i] + (k + PREFETCH_K) * KB), _MM_HINT_T0);
      a[i] = _mm512_fmadd_ps(load16(blk[i] + k * KB, 0xFFFF), xv, a[i]);
    }
  }
  WIDE_UNROLL for (int i = 0; i < 4; ++i) _mm512_storeu_ps(acc[i], a[i]);
}

// Two to four tokens, four blocks at once (the four streams of axpy4, every weight vector serving every token):
// acc[i * NM + m] holds block i's sums for token m, read and written in place
template <typename T, int NM>
WIDE_AVX512 void axpy4_tokens_nm(const T* const* blk, int64_t gs, const T* const* xg, float* const* acc) {
  __m512 a[4][NM];  // 4 * NM <= 16 accumulators, NM broadcast activations, one weight vector
  WIDE_UNROLL for (int i = 0; i < 4; ++i)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) a[i][m] = _mm512_loadu_ps(acc[i * NM + m]);
  for (int64_t k = 0; k < gs; ++k) {
    __m512 xv[NM];
    WIDE_UNROLL for (int m = 0; m < NM; ++m) xv[m] = _mm512_set1_ps(load1(xg[m] + k));
    WIDE_UNROLL for (int i = 0; i < 4; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(blk[i] + (k + PREFETCH_K) * KB), _MM_HINT_T0);
      const __m512 wv = load16(blk[i] + k * KB, 0xFFFF);
      WIDE_UNROLL for (int m = 0; m < NM; ++m) a[i][m] = _mm512_fmadd_ps(wv, xv[m], a[i][m]);
    }
  }
  WIDE_UNROLL for (int i = 0; i < 4; ++i)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) _mm512_storeu_ps(acc[i * NM + m], a[i][m]);
}

template <typename T>
void axpy4_tokens(const T* const* blk, int64_t gs, const T* const* xg, int nm, float* const* acc) {
  if (nm == 2) axpy4_tokens_nm<T, 2>(blk, gs, xg, acc);
  else if (nm == 3) axpy4_tokens_nm<T, 3>(blk, gs, xg, acc);
  else axpy4_tokens_nm<T, 4>(blk, gs, xg, acc);
}

// gemm_kt (gemm.cpp): 32 columns a step where several tokens share each weight vector, else 16
template <typename T>
WIDE_AVX512 void rows_axpy(const T* const* w, int nw, int64_t len, const float (*xs)[KT_ROWS], int nm,
                           float* const* acc, int64_t ahead) {
  int64_t n = 0;
  if (nm > 1) {  // 32 columns a step: each broadcast activation serves two weight vectors
    for (; n + 32 <= len; n += 32) {
      __m512 wv[KT_ROWS][2];
      for (int i = 0; i < nw; ++i) wv[i][0] = load16(w[i] + n, 0xFFFF), wv[i][1] = load16(w[i] + n + 16, 0xFFFF);
      if (ahead)
        for (int i = 0; i < nw; ++i) {
          _mm_prefetch(reinterpret_cast<const char*>(w[i] + ahead + n), _MM_HINT_T1);
          if (sizeof(T) == 4) _mm_prefetch(reinterpret_cast<const char*>(w[i] + ahead + n + 16), _MM_HINT_T1);
        }
      for (int m = 0; m < nm; ++m) {
        __m512 a0 = _mm512_loadu_ps(acc[m] + n), a1 = _mm512_loadu_ps(acc[m] + n + 16);
        for (int i = 0; i < nw; ++i) {
          const __m512 xv = _mm512_set1_ps(xs[m][i]);
          a0 = _mm512_fmadd_ps(wv[i][0], xv, a0);
          a1 = _mm512_fmadd_ps(wv[i][1], xv, a1);
        }
        _mm512_storeu_ps(acc[m] + n, a0);
        _mm512_storeu_ps(acc[m] + n + 16, a1);
      }
    }
  }
  for (; n < len; n += 16) {
    const __mmask16 km = tail16(len - n);
    __m512 wv[KT_ROWS];
    for (int i = 0; i < nw; ++i) wv[i] = load16(w[i] + n, km);
    if (ahead && (n * static_cast<int64_t>(sizeof(T))) % 64 == 0)  // one prefetch a cache line
      for (int i = 0; i < nw; ++i) _mm_prefetch(reinterpret_cast<const char*>(w[i] + ahead + n), _MM_HINT_T1);
    for (int m = 0; m < nm; ++m) {
      __m512 a = _mm512_maskz_loadu_ps(km, acc[m] + n);
      for (int i = 0; i < nw; ++i) a = _mm512_fmadd_ps(wv[i], _mm512_set1_ps(xs[m][i]), a);
      _mm512_mask_storeu_ps(acc[m] + n, km, a);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// The small ops (ops.cpp): RMSNorm, RoPE, decode attention
template <typename T>
WIDE_AVX512 void rms_norm_row(const T* x, const T* w, T* out, int64_t H, float eps) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= H; k += 32) {
    const __m512 a = load16(x + k, 0xFFFF), b = load16(x + k + 16, 0xFFFF);
    s0 = _mm512_fmadd_ps(a, a, s0), s1 = _mm512_fmadd_ps(b, b, s1);
  }
  for (; k < H; k += 16) {
    const __m512 a = load16(x + k, tail16(H - k));
    s0 = _mm512_fmadd_ps(a, a, s0);
  }
  const float r = 1.f / std::sqrt(_mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) / H + eps);
  const __m512 rv = _mm512_set1_ps(r);
  for (k = 0; k < H; k += 16) {
    const __mmask16 t = tail16(H - k);
    const __m512 n = round16(_mm512_mul_ps(load16(x + k, t), rv), x);
    store16(out + k, _mm512_mul_ps(load16(w + k, t), n), t);
  }
}

template <typename T>
WIDE_AVX512 void rope(T* x, int64_t M, int64_t H, int64_t D, const T* cos, const T* sin) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < M * H; ++i) {
    T* row = x + i * D;
    const T* c = cos + (i / H) * D;
    const T* s = sin + (i / H) * D;
    for (int64_t j = 0; j < half; j += 16) {
      const __mmask16 t = tail16(half - j);
      const __m512 a = load16(row + j, t), b = load16(row + half + j, t);
      const __m512 nb = _mm512_sub_ps(_mm512_setzero_ps(), b);
      const __m512 lo = _mm512_add_ps(round16(_mm512_mul_ps(a, load16(c + j, t)), row),
                                      round16(_mm512_mul_ps(nb, load16(s + j, t)), row));
      const __m512 hi = _mm512_add_ps(round16(_mm512_mul_ps(b, load16(c + half + j, t)), row),
                                      round16(_mm512_mul_ps(a, load16(s + half + j, t)), row));
      store16(row + j, lo, t);
      store16(row + half + j, hi, t);
    }
  }
}

// The active query heads of one KV head score every past key, softmax (float32, max subtracted), sum the values
template <typename T>
WIDE_AVX512 void attend_kv_head(const T* q, const T* k, const T* v, T* out, const AttnShape& a, const int* heads,
                                int nh, std::vector<float>& sc) {
  constexpr int DV = 512 / 16;  // head size up to 512 in registers' worth of float32 vectors
  sc.resize(static_cast<size_t>(nh) * a.L);
  const int nd = static_cast<int>((a.D + 15) / 16);
  for (int hi = 0; hi < nh; ++hi) {
    const T* qh = q + heads[hi] * a.D;
    __m512 qv[DV];
    for (int d = 0; d < nd; ++d) qv[d] = _mm512_mul_ps(load16(qh + 16 * d, tail16(a.D - 16 * d)), _mm512_set1_ps(a.scale));
    float* s = sc.data() + static_cast<size_t>(hi) * a.L;
    for (int64_t j = 0; j < a.L; ++j) {
      const T* kj = k + j * a.D;
      __m512 acc = _mm512_setzero_ps();
      for (int d = 0; d < nd; ++d) acc = _mm512_fmadd_ps(qv[d], load16(kj + 16 * d, tail16(a.D - 16 * d)), acc);
      s[j] = _mm512_reduce_add_ps(acc);
    }
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < a.L; j += 16)  // past the end: -inf (a 0 there could exceed every score)
      mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail16(a.L - j), s + j));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < a.L; j += 16) {
      const __mmask16 t = tail16(a.L - j);
      const __m512 e = _mm512_maskz_mov_ps(t, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, s + j), m)));
      _mm512_mask_storeu_ps(s + j, t, e);
      sum = _mm512_add_ps(sum, e);
    }
    const float inv = 1.f / _mm512_reduce_add_ps(sum);
    __m512 o[DV];
    for (int d = 0; d < nd; ++d) o[d] = _mm512_setzero_ps();
    for (int64_t j = 0; j < a.L; ++j) {
      const __m512 pj = _mm512_set1_ps(s[j]);
      const T* vj = v + j * a.D;
      for (int d = 0; d < nd; ++d) o[d] = _mm512_fmadd_ps(pj, load16(vj + 16 * d, tail16(a.D - 16 * d)), o[d]);
    }
    T* oh = out + heads[hi] * a.D;
    for (int d = 0; d < nd; ++d)
      store16(oh + 16 * d, _mm512_mul_ps(o[d], _mm512_set1_ps(inv)), tail16(a.D - 16 * d));
  }
}

}  // namespace

template <typename T>
Kernels<T> avx512_kernels() {
  Kernels<T> k{};
  k.dots = dots<T, Avx512K, Avx512P>;
  k.axpy4 = axpy4<T>;
  k.axpy4_tokens = axpy4_tokens<T>;
  k.axpy_block = axpy_block<T>;
  k.rows_axpy = rows_axpy<T>;
  k.rms_norm_row = rms_norm_row<T>;
  k.rope = rope<T>;
  k.attend_kv_head = attend_kv_head<T>;
  k.attention_d_multiple = 1;
  return k;
}

// AVX-512 with vdpbf16ps for the bfloat16 dot products; the same as AVX-512 for every other kernel and dtype
template <typename T>
Kernels<T> avx512bf16_kernels() {
  Kernels<T> k = avx512_kernels<T>();
  if constexpr (std::is_same_v<T, uint16_t>) k.dots = dots<T, Bf16K, Bf16P>;
  return k;
}

template Kernels<float> avx512_kernels<float>();
template Kernels<uint16_t> avx512_kernels<uint16_t>();
template Kernels<c10::Half> avx512_kernels<c10::Half>();
template Kernels<float> avx512bf16_kernels<float>();
template Kernels<uint16_t> avx512bf16_kernels<uint16_t>();
template Kernels<c10::Half> avx512bf16_kernels<c10::Half>();

}  // namespace wide_cpu
