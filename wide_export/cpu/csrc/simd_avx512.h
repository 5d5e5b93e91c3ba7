// AVX-512 (F, BW, VL) primitives (16 float32 lanes): masked loads that widen bfloat16 and float16 (zeros past a
// tail), masked stores and roundings to each dtype as torch rounds, exp. AVX-512 BF16 (vdpbf16ps) has its own
// attribute. Compiled for these instructions by target attribute whatever the compiler's flags; only run where
// isa.cpp found them.
#pragma once

#include <immintrin.h>

#include "common.h"

#define WIDE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define WIDE_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace wide_cpu {

constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

inline __mmask16 tail16(int64_t left) { return left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1); }

WIDE_AVX512 inline __m512 load16(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
WIDE_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 k) {
  __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
WIDE_AVX512 inline __m512 load16(const c10::Half* p, __mmask16 k) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
}

WIDE_AVX512 inline __m512i bf16_bits(__m512 v) {  // round to nearest even (to_bf16), in each lane's low half
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
}
// v as a tensor of the pointer's dtype holds it (the reference's intermediate roundings)
WIDE_AVX512 inline __m512 round16(__m512 v, const float*) { return v; }
WIDE_AVX512 inline __m512 round16(__m512 v, const c10::Half*) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, kRoundNearest));
}
WIDE_AVX512 inline __m512 round16(__m512 v, const uint16_t*) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(v), 16));
}
WIDE_AVX512 inline void store16(float* p, __m512 v, __mmask16 k) { _mm512_mask_storeu_ps(p, k, v); }
WIDE_AVX512 inline void store16(c10::Half* p, __m512 v, __mmask16 k) {
  _mm256_mask_storeu_epi16(p, k, _mm512_cvtps_ph(v, kRoundNearest));
}
WIDE_AVX512 inline void store16(uint16_t* p, __m512 v, __mmask16 k) {
  _mm256_mask_storeu_epi16(p, k, _mm512_cvtepi32_epi16(bf16_bits(v)));
}

// exp(x) for x <= 0 (common.h: kExpPoly); below -87 (-inf too) the result is 0, and a NaN stays NaN, as
// torch.softmax propagates it: the clamp is a max whose second operand is x, the one a NaN comparison returns.
WIDE_AVX512 inline __m512 exp16(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_NLT_UQ);  // x >= -87, or NaN
  x = _mm512_max_ps(_mm512_set1_ps(-87.f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT);
  const __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExpPoly[i]));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

}  // namespace wide_cpu
