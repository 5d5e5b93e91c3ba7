// What every source of the CPU kernels shares: the element types and their scalar conversions (float32, bfloat16
// as uint16_t, float16 as c10::Half; products and sums in float32), the register-tile sizes of the masked GEMMs,
// the geometry of a GEMM call. No torch tensor here: the kernels see pointers (bindings.cpp checks the tensors).
#pragma once

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

// Full unrolling of the register-tile loops (rows x tokens), early enough for the compiler to keep each
// accumulator in a register: without it GCC also stores every accumulator to the stack on every step.
#define WIDE_UNROLL _Pragma("GCC unroll 16")

namespace wide_cpu {

constexpr int NR = 4;   // output channels per micro-kernel call
constexpr int MR = 4;   // activation rows a gemm_k block sums at once
constexpr int MT = 16;  // activation rows per dots() call (at most): AVX-512 takes them all in one pass
using Acc = float[NR][MT];
using AccRows = float (*)[MT];  // a kernel's rows of an Acc

constexpr int KB = 16;        // output channels per block of pack_k's layout (cpu/ops.py: PACK_KB)
constexpr int KT_ROWS = 8;    // gemm_kt: weight rows per pass (eight streams, one accumulator load / store)
constexpr int KT_TOKENS = 16;  // gemm_kt: tokens per pass over a group
constexpr int64_t ROPE_MAX_D = 1024;  // rope: the head sizes it takes (the scalar kernel's row buffer)

struct Geometry {
  int64_t M, N, K, G, gs;
};

inline float bf16_to_float(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return bf16_to_float(*p); }
inline float load1(const c10::Half* p) { return static_cast<float>(*p); }

inline uint16_t to_bf16(float f) {  // round to nearest even, as torch
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (std::isnan(f)) return 0x7FC0;
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
inline void put(float* p, float v) { *p = v; }
inline void put(uint16_t* p, float v) { *p = to_bf16(v); }
inline void put(c10::Half* p, float v) { *p = c10::Half(v); }  // round to nearest even

template <typename T>
inline float rounded(float v) {  // v as the reference's tensor of dtype T holds it
  T t;
  put(&t, v);
  return load1(&t);
}

inline float silu(float v) { return v / (1.f + std::exp(-v)); }

// exp(x) for x <= 0 (softmax after the max is taken), simd_avx2.h / simd_avx512.h: 2^n * p(f), n = round(x log2 e),
// f = x - n ln 2 in two steps, p degree 6 (relative error ~2e-7, Horner from kExpPoly[0])
constexpr float kExpPoly[] = {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};
constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;

}  // namespace wide_cpu
