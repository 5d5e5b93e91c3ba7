// The scalar table (isa.h): portable code on a CPU with neither AVX2 nor AVX-512. RMSNorm and RoPE decline float16
// (its scalar conversions are slower than torch's ops), decode attention declines (the caller runs torch's).
#include "isa.h"
#include "scalar.h"

namespace wide_cpu {

template <typename T>
Kernels<T> scalar_kernels() {
  constexpr bool half = std::is_same_v<T, c10::Half>;
  Kernels<T> k{};
  k.dots = dots_scalar<T>;
  k.axpy4 = axpy4_scalar<T>;
  k.axpy4_tokens = nullptr;
  k.axpy_block = axpy_block_scalar<T>;
  k.rows_axpy = rows_axpy_scalar<T>;
  k.rms_norm_row = half ? nullptr : rms_norm_row_scalar<T>;
  k.rope = half ? nullptr : rope_scalar<T>;
  k.attend_kv_head = nullptr;
  k.attention_d_multiple = 1;
  return k;
}

template Kernels<float> scalar_kernels<float>();
template Kernels<uint16_t> scalar_kernels<uint16_t>();
template Kernels<c10::Half> scalar_kernels<c10::Half>();

}  // namespace wide_cpu
