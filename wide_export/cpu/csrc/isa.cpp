// The CPU's instruction sets, detected once when the library loads, and the table of kernels of each (isa.h).
#include "isa.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>

namespace wide_cpu {
namespace {

Isa detect() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    return __builtin_cpu_supports("avx512bf16") ? kAvx512Bf16 : kAvx512;
  }
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") ? kAvx2
                                                                                                   : kScalar;
}

const Isa kBest = detect();   // the best this CPU has, once
std::atomic<int> g_isa{kBest};  // the one in use (set_isa)

template <typename T>
std::array<Kernels<T>, kIsas> table() {
  return {scalar_kernels<T>(), avx2_kernels<T>(), avx512_kernels<T>(), avx512bf16_kernels<T>()};
}
const std::array<Kernels<float>, kIsas> kFloat = table<float>();
const std::array<Kernels<uint16_t>, kIsas> kBf16 = table<uint16_t>();
const std::array<Kernels<c10::Half>, kIsas> kHalf = table<c10::Half>();

}  // namespace

template <>
const Kernels<float>& kernels<float>() { return kFloat[g_isa.load(std::memory_order_relaxed)]; }
template <>
const Kernels<uint16_t>& kernels<uint16_t>() { return kBf16[g_isa.load(std::memory_order_relaxed)]; }
template <>
const Kernels<c10::Half>& kernels<c10::Half>() { return kHalf[g_isa.load(std::memory_order_relaxed)]; }

bool attention_runs(int64_t D) {
  const Kernels<float>& k = kernels<float>();  // every dtype's attention runs on the same instruction sets
  return k.attend_kv_head != nullptr && D % k.attention_d_multiple == 0;
}

std::string isa() {
  std::string s = kIsaNames[g_isa.load()];
  if (g_isa.load() != kBest) s += std::string(" (of ") + kIsaNames[kBest] + ")";
  return s;
}

std::string set_isa(const std::string& name) {
  const std::string before = kIsaNames[g_isa.load()];
  for (int i = 0; i < kIsas; ++i) {
    if (name == kIsaNames[i]) {
      TORCH_CHECK(i <= kBest, "wide_cpu::set_isa: this CPU has no ", name, " (best: ", kIsaNames[kBest], ")");
      g_isa.store(i);
      return before;
    }
  }
  TORCH_CHECK(false, "wide_cpu::set_isa: unknown instruction set ", name);
  return before;
}

}  // namespace wide_cpu
