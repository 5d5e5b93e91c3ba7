// The instruction set the kernels run with, chosen in one place: isa.cpp detects the CPU's best once, at load, and
// holds one table of kernels per instruction set and dtype (Kernels<T>), filled by the instruction set's own
// source (kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp). The drivers (gemm.cpp, repack.cpp, ops.cpp,
// decode_step.cpp) take kernels<T>() once per call and never name an instruction set. set_isa picks a lower one
// (tests run every path the CPU can).
//
//   avx512bf16: bf16 pairs multiplied by vdpbf16ps (exact products, float32 sums), else as avx512
//   avx512:     16 lanes, bf16 and float16 widened on load
//   avx2:       AVX2 + FMA + F16C, 8 lanes, the same
//   scalar:     portable code (RMSNorm and RoPE decline float16, attention declines: null entries)
#pragma once

#include <string>

#include "common.h"

namespace wide_cpu {

enum Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };
constexpr int kIsas = 4;
constexpr const char* kIsaNames[kIsas] = {"scalar", "avx2", "avx512", "avx512bf16"};

// Decode attention's shape: one query per sequence, q [B, Hq, D], k / v [B, Hk, >= L, D] (ops.cpp)
struct AttnShape {
  int64_t B, Hq, Hk, L, D, kb, kh, vb, vh;  // k / v strides of the batch and head dims (rows are D apart)
  float scale;
};

// One instruction set's kernels for elements of type T (float, uint16_t for bfloat16, c10::Half)
template <typename T>
struct Kernels {
  // acc[r][m] += dot(w[r][0 .. len), x[m][0 .. len)) for nr <= NR weight rows and nm <= MT activation rows;
  // stride: where the rows are consecutive rows of one matrix, its row length (a kernel then prefetches the rows
  // after its own), else 0
  void (*dots)(const T* const* w, int nr, const T* const* x, int nm, int64_t len, Acc& acc, int64_t stride);
  // pack_k's layout (repack.cpp): acc[i][0 .. KB) += sum_k blk[i][k][0 .. KB) * xg[k] for four blocks i
  void (*axpy4)(const T* const* blk, int64_t gs, const T* xg, float (*acc)[KB]);
  // the same for nm in 2..4 tokens, acc[i * nm + m] block i's sums for token m; null: none (block by block)
  void (*axpy4_tokens)(const T* const* blk, int64_t gs, const T* const* xg, int nm, float* const* acc);
  // one block for nm <= MR tokens: acc[m][0 .. KB) += sum_k blk[k][0 .. KB) * xg[m][k]
  void (*axpy_block)(const T* blk, int64_t gs, const T* const* xg, int nm, float (*acc)[KB]);
  // gemm_kt: acc[m][0 .. len) += sum_i xs[m][i] * w[i][0 .. len), i < nw <= KT_ROWS, m < nm; ahead: prefetch distance
  void (*rows_axpy)(const T* const* w, int nw, int64_t len, const float (*xs)[KT_ROWS], int nm, float* const* acc,
                    int64_t ahead);
  // one row's RMSNorm (ops.cpp); null: the op declines
  void (*rms_norm_row)(const T* x, const T* w, T* out, int64_t H, float eps);
  // rotary embedding in place of M tokens' H heads of size D, cos / sin one row [D] a token; null: declines
  void (*rope)(T* x, int64_t M, int64_t H, int64_t D, const T* cos, const T* sin);
  // decode attention of one sequence's active query heads `heads` sharing one KV head; null: declines
  void (*attend_kv_head)(const T* q, const T* k, const T* v, T* out, const AttnShape& a, const int* heads, int nh,
                         std::vector<float>& sc);
  int attention_d_multiple;  // the head sizes attend_kv_head takes: multiples of this
};

// Each instruction set's table, defined in its own source
template <typename T> Kernels<T> scalar_kernels();
template <typename T> Kernels<T> avx2_kernels();
template <typename T> Kernels<T> avx512_kernels();
template <typename T> Kernels<T> avx512bf16_kernels();

// The kernels of the instruction set in use (the one place it is chosen)
template <typename T>
const Kernels<T>& kernels();

// Whether decode attention (and so the fused decode step) runs for head size D with the instruction set in use
bool attention_runs(int64_t D);

// Whether RMSNorm and RoPE run for this dtype with the instruction set in use (the scalar code declines float16,
// whose scalar conversions are slower than torch's ops)
template <typename T>
bool small_ops_run() {
  return kernels<T>().rms_norm_row != nullptr && kernels<T>().rope != nullptr;
}

std::string isa();                             // the instruction set in use; a lower one: "avx2 (of avx512)"
std::string set_isa(const std::string& name);  // use `name` (at most the CPU's best); the one in use before

}  // namespace wide_cpu
