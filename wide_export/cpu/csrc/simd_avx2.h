// AVX2 + FMA + F16C primitives (8 float32 lanes): loads that widen bfloat16 (a shift into the high half of each
// float32) and float16 (vcvtph2ps), stores and roundings to each dtype as torch rounds, a horizontal sum, exp.
// Compiled for these instructions by target attribute whatever the compiler's flags; only run where isa.cpp found
// them.
#pragma once

#include <immintrin.h>

#include "common.h"

#define WIDE_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace wide_cpu {

constexpr int kHalfRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

WIDE_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
WIDE_AVX2 inline __m256 load8(const uint16_t* p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
WIDE_AVX2 inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
WIDE_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

WIDE_AVX2 inline __m256i bf16_bits8(__m256 v) {  // round to nearest even (to_bf16), in each lane's low half
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
// v as a tensor of the pointer's dtype holds it (the reference's intermediate roundings)
WIDE_AVX2 inline __m256 round8(__m256 v, const float*) { return v; }
WIDE_AVX2 inline __m256 round8(__m256 v, const c10::Half*) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, kHalfRound)); }
WIDE_AVX2 inline __m256 round8(__m256 v, const uint16_t*) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits8(v), 16));
}
WIDE_AVX2 inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
WIDE_AVX2 inline void store8(c10::Half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, kHalfRound));
}
WIDE_AVX2 inline void store8(uint16_t* p, __m256 v) {
  const __m256i b = bf16_bits8(v);  // 32-bit lanes < 2^16: packing saturates nothing
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0b1000);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// exp(x) for x <= 0 (common.h: kExpPoly); below -87 (-inf too) the result is 0, and a NaN stays NaN, as
// torch.softmax propagates it: the clamp is a max whose second operand is x, the one a NaN comparison returns.
// 2^n through the exponent bits (n >= -126 here).
WIDE_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_NLT_UQ);  // x >= -87, or NaN
  x = _mm256_max_ps(_mm256_set1_ps(-87.f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), kHalfRound);
  const __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExpPoly[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

}  // namespace wide_cpu
