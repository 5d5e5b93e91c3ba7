// The portable kernels (no SIMD): the scalar table's entries (kernels_scalar.cpp), and the tails the AVX2 kernels
// leave to them. Same products, sums and roundings as the vector kernels' definitions.
#pragma once

#include "common.h"

namespace wide_cpu {

// dot products of `nr` weight rows (w[r] + 0 .. len) with `nm` activation rows (x[m] + 0 .. len), added to acc[r][m]
template <typename T>
void dots_scalar(const T* const* w, int nr, const T* const* x, int nm, int64_t len, Acc& acc, int64_t = 0) {
  for (int r = 0; r < nr; ++r)
    for (int m = 0; m < nm; ++m) {
      float s = 0.f;
      for (int64_t k = 0; k < len; ++k) s += load1(w[r] + k) * load1(x[m] + k);
      acc[r][m] += s;
    }
}

template <typename T>
inline void axpy_block_scalar(const T* blk, int64_t gs, const T* const* xg, int nm, float (*acc)[KB]) {
  for (int64_t k = 0; k < gs; ++k)
    for (int m = 0; m < nm; ++m) {
      const float xv = load1(xg[m] + k);
      for (int j = 0; j < KB; ++j) acc[m][j] += load1(blk + k * KB + j) * xv;
    }
}

template <typename T>
void axpy4_scalar(const T* const* blk, int64_t gs, const T* xg, float (*acc)[KB]) {
  WIDE_UNROLL for (int i = 0; i < 4; ++i) {
    const T* one[1] = {xg};
    axpy_block_scalar(blk[i], gs, one, 1, &acc[i]);
  }
}

// acc[m][0 .. len) += sum_i xs[m][i] * w[i][0 .. len), i < nw <= KT_ROWS, m < nm
template <typename T>
void rows_axpy_scalar(const T* const* w, int nw, int64_t len, const float (*xs)[KT_ROWS], int nm, float* const* acc,
                      int64_t = 0) {
  for (int64_t n = 0; n < len; ++n) {
    float wv[KT_ROWS];
    for (int i = 0; i < nw; ++i) wv[i] = load1(w[i] + n);
    for (int m = 0; m < nm; ++m) {
      float a = acc[m][n];
      for (int i = 0; i < nw; ++i) a += wv[i] * xs[m][i];
      acc[m][n] = a;
    }
  }
}

// RMSNorm (model/modeling.py): out = w * T(x * rsqrt(mean(x^2) + eps)), the mean in float32 as the reference's
template <typename T>
void rms_norm_row_scalar(const T* x, const T* w, T* out, int64_t H, float eps) {
  float ss = 0.f;
  for (int64_t k = 0; k < H; ++k) ss += load1(x + k) * load1(x + k);
  const float r = 1.f / std::sqrt(ss / H + eps);
  for (int64_t k = 0; k < H; ++k) put(out + k, load1(w + k) * rounded<T>(load1(x + k) * r));
}

// rotary embedding in place, the reference's x * cos + rotate_half(x) * sin: x [M, H, D] (every head of a token
// shares the token's cos / sin row [D]); rotate_half(x) = cat(-x[D/2:], x[:D/2])
template <typename T>
void rope_scalar(T* x, int64_t M, int64_t H, int64_t D, const T* cos, const T* sin) {
  const int64_t half = D / 2;
  float v[ROPE_MAX_D];
  for (int64_t i = 0; i < M * H; ++i) {
    T* row = x + i * D;
    const T* c = cos + (i / H) * D;
    const T* s = sin + (i / H) * D;
    for (int64_t j = 0; j < D; ++j) v[j] = load1(row + j);
    for (int64_t j = 0; j < D; ++j) {
      const float rot = j < half ? -v[j + half] : v[j - half];
      put(row + j, rounded<T>(v[j] * load1(c + j)) + rounded<T>(rot * load1(s + j)));
    }
  }
}

}  // namespace wide_cpu
