// CPU kernels of the `wide` masked projections: they read only the weights of the groups a token executes.
//
//   wide_cpu::gemm_n(x, w, mask, group_size, bias?, out!)    out = (x W^T + b), skipped output groups 0
//   wide_cpu::gated(x, w_gate, w_up, mask, group_size, out!)  out = silu(x Wg^T) * (x Wu^T), skipped groups 0
//   wide_cpu::gemm_k(x, w, mask, group_size, bias?, out!)    out = x W^T + b over the executed input groups
//                                                            (w [N, K], or packed by pack_k: [G, N/16, gs, 16])
//   wide_cpu::gemm_kt(x, wt, mask, group_size, bias?, out!)  the same from wt = W^T [K, N] (row-major)
//   wide_cpu::rms_norm(x, w, eps, out!) -> bool           RMSNorm; rope(x!, cos, sin) -> bool rotary in place;
//   wide_cpu::router(h, wc, bc, wr, br, mask!)            the router: the small ops of a decode step, fused
//   wide_cpu::decode_attention(q, k, v, length, head_mask?, group_heads, out!) -> bool
//                                                         one query per sequence; skipped heads not computed
//   wide_cpu::decode_step(h, weights, cache_k!, cache_v!, length, cos, sin, eps, geo, norm_w, head_w, out!)
//                                                         -> bool: a decode step's layers and LM head, one call
//   wide_cpu::isa() -> str                                   the instruction set the kernels run with
//   wide_cpu::set_isa(name) -> str                           use a lower one (tests run every path)
//
// x [M, K] and w [N, K] (nn.Linear layout) are float32, bfloat16 or float16 (the same dtype; out too), mask
// [M, G] int32, contiguous. Products and sums in float32. M is any: each block of output channels reads its
// weight rows once for every 16 tokens of the call that execute its group (a group's rows only when some token
// executes it). Several tokens: register tiles of rows x tokens (dots_one_pass), k in chunks beyond 8 tokens
// (dots_chunked); gemm_kt and the packed gemm_k update output vectors for up to 16 / 4 tokens a pass.
// Threads: at::parallel_for, torch's intra-op pool (OpenMP), so torch.set_num_threads applies. No heap
// allocation on the decode path but the group plan's vectors, kept per thread and grown once.
// Instruction sets, checked at run time, all compiled: AVX-512 BF16 (bf16 x bf16 pairs through vdpbf16ps),
// AVX-512 (16 lanes, bf16 and float16 widened on load), AVX2 + FMA + F16C (8 lanes, the same), else portable
// scalar code.
#include <ATen/Parallel.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

// Full unrolling of the register-tile loops (rows x tokens), early enough for the compiler to keep each
// accumulator in a register: without it GCC also stores every accumulator to the stack on every step.
#define WIDE_UNROLL _Pragma("GCC unroll 16")

namespace {

// ---------------------------------------------------------------------------------------------------------
// Argument checks, shared by every op and run before any of its data is read or written, so before the choice of
// instruction set: every path (AVX-512, AVX2, scalar) sits behind them. A refused argument is one TORCH_CHECK line
// (a RuntimeError in Python) that names the op and the argument; cpu/ops.py turns it into a WideError.
constexpr at::ScalarType kAnyFloat = at::ScalarType::Undefined;  // check_tensor: float32, bfloat16 or float16

// a * b of sizes, refused where either is negative or the product does not fit in 64 bits (a group count times a
// group size of 2**62 wraps to a real width otherwise)
int64_t mul_sizes(int64_t a, int64_t b, const char* op, const char* what) {
  int64_t r = 0;
  TORCH_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &r), op, ": ", what, " (", a, " x ", b,
              ") is negative or does not fit in 64 bits");
  return r;
}

// The product of t's sizes but its last `keep` (the rows of a [.., H] tensor), overflow-checked: a zero-sized
// dim elsewhere makes numel() 0, so numel() / H is no row count (and a division by zero where H is 0)
int64_t lead_rows(const at::Tensor& t, int64_t keep, const char* op) {
  int64_t r = 1;
  for (int64_t i = 0; i + keep < t.dim(); ++i) r = mul_sizes(r, t.size(i), op, "the rows of a tensor");
  return r;
}

// t present, a dense strided CPU tensor of dtype `dt` (kAnyFloat: one the kernels compute in), contiguous unless
// `rows_only` (then only its last dim is checked, by the caller)
void check_tensor(const at::Tensor& t, const char* op, const char* name, at::ScalarType dt, bool rows_only = false) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is missing");
  TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided, op, ": ", name, " must be a dense CPU tensor, got ",
              t.device(), " ", t.layout());
  TORCH_CHECK(!t.is_neg() && !t.is_conj(), op, ": ", name, " must not be a lazily negated / conjugated view");
  TORCH_CHECK(rows_only || t.is_contiguous(), op, ": ", name, " must be contiguous");
  if (dt == kAnyFloat) {
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf,
                op, ": ", name, " must be float32, bfloat16 or float16, got ", t.scalar_type());
  } else {
    TORCH_CHECK(t.scalar_type() == dt, op, ": ", name, " must be ", dt, ", got ", t.scalar_type());
  }
}

void check_shape(const at::Tensor& t, at::IntArrayRef shape, const char* op, const char* name) {
  TORCH_CHECK(t.sizes().equals(shape), op, ": ", name, " must be ", shape, ", got ", t.sizes());
}

// The tensors of a call: every one it writes must share no byte with any other it reads or writes (an `out` that
// is an input would be overwritten while still read). By the bytes each spans (torch's strides are >= 0): written
// spans sorted, each read one looked up among them. An empty tensor spans nothing.
class Apart {
 public:
  explicit Apart(const char* op) : op_(op) {}
  void add(const at::Tensor& t, bool written, const char* name, int64_t index = -1) {
    if (!t.defined() || t.numel() == 0) return;
    int64_t last = 0;
    for (int64_t i = 0; i < t.dim(); ++i) last += (t.size(i) - 1) * t.stride(i);
    const uintptr_t b = reinterpret_cast<uintptr_t>(t.data_ptr());
    (written ? out_ : in_).push_back({b, b + static_cast<uintptr_t>(last + 1) * t.element_size(), name, index});
  }
  void read(const at::Tensor& t, const char* name, int64_t index = -1) { add(t, false, name, index); }
  void write(const at::Tensor& t, const char* name, int64_t index = -1) { add(t, true, name, index); }
  void check() {
    std::sort(out_.begin(), out_.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < out_.size(); ++i)
      if (out_[i].begin < out_[i - 1].end) fail(out_[i - 1], out_[i]);
    for (const Span& r : in_) {  // the first written span that ends after r begins (written ends ascend too)
      auto it = std::upper_bound(out_.begin(), out_.end(), r.begin,
                                 [](uintptr_t v, const Span& s) { return v < s.end; });
      if (it != out_.end() && it->begin < r.end) fail(*it, r);
    }
  }

 private:
  struct Span {
    uintptr_t begin, end;
    const char* name;
    int64_t index;
  };
  static std::string label(const Span& s) {
    return s.index < 0 ? std::string(s.name) : std::string(s.name) + "[" + std::to_string(s.index) + "]";
  }
  [[noreturn]] void fail(const Span& a, const Span& b) const {
    TORCH_CHECK(false, op_, ": ", label(a), " and ", label(b),
                " overlap in memory (an output must not share memory with another argument)");
    __builtin_unreachable();
  }
  const char* op_;
  std::vector<Span> out_, in_;
};

constexpr int NR = 4;   // output channels per micro-kernel call
constexpr int MR = 4;   // activation rows a gemm_k block sums at once
constexpr int MT = 16;  // activation rows per dots() call (at most): AVX-512 takes them all in one pass
using Acc = float[NR][MT];
using AccRows = float (*)[MT];  // a kernel's rows of an Acc

// The instruction set the dot products use: the best this CPU has, or a lower one chosen with set_isa (tests
// run every path the CPU can). avx512bf16: bf16 pairs multiplied by vdpbf16ps (exact products, float32 sums).
enum Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };
const char* const kIsaNames[] = {"scalar", "avx2", "avx512", "avx512bf16"};

Isa detect() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    return __builtin_cpu_supports("avx512bf16") ? kAvx512Bf16 : kAvx512;
  }
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") ? kAvx2
                                                                                                   : kScalar;
}
std::atomic<int> g_isa{detect()};

inline float bf16_to_float(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return bf16_to_float(*p); }
inline float load1(const c10::Half* p) { return static_cast<float>(*p); }

// ---------------------------------------------------------------------------------------------------------
// dot products of `nr` weight rows (w[r] + 0 .. len) with `nm` activation rows (x[m] + 0 .. len), added to
// acc[r][m]; x and w of one dtype (float32, or bf16 as uint16_t), float32 products and sums.
template <typename T>
void dots_scalar(const T* const* w, int nr, const T* const* x, int nm, int64_t len, Acc& acc) {
  for (int r = 0; r < nr; ++r)
    for (int m = 0; m < nm; ++m) {
      float s = 0.f;
      for (int64_t k = 0; k < len; ++k) s += load1(w[r] + k) * load1(x[m] + k);
      acc[r][m] += s;
    }
}

// AVX2 + FMA (+ F16C): 8 lanes, bf16 widened on load (a shift into the high half of each float32), float16
// through vcvtph2ps
#define WIDE_AVX2 __attribute__((target("avx2,fma,f16c")))
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

template <typename T, int NRv, int NM>
WIDE_AVX2 void dots_avx2(const T* const* w, const T* const* x, int64_t len, AccRows acc, int m_at) {
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

// AVX-512: 16 lanes; the tail through masked loads (zeros past the end)
#define WIDE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
WIDE_AVX512 inline __m512 load16(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
WIDE_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 k) {
  __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
WIDE_AVX512 inline __m512 load16(const c10::Half* p, __mmask16 k) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
}

// The products of NRv weight rows and NM activation rows over k in [k0, k0 + len), added to vector partial sums
// p[r][m_at + m] (one __m512 per row and token, NRv * NM <= 16) that stay in memory between calls: dots_avx512
// takes all of k at once, the many-token path walks k in chunks so that a chunk of every token's activations
// stays in L1 while all the rows of a block pass over it.
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

// The whole dot products of rows x tokens, added to acc[r][m_at + m] (the partial sums stay in registers)
template <typename T, int NRv, int NM>
WIDE_AVX512 void dots_avx512(const T* const* w, const T* const* x, int64_t len, AccRows acc, int m_at,
                             int64_t ahead) {
  __m512 p[NRv][MT];
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) p[r][m] = _mm512_setzero_ps();
  part_avx512<T, NRv, NM>(w, x, 0, len, p, 0, ahead);
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) acc[r][m_at + m] += _mm512_reduce_add_ps(p[r][m]);
}

// AVX-512 BF16: 32 bf16 pairs a step, vdpbf16ps (each product exact in float32, summed into 16 lanes)
#define WIDE_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
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

template <int NRv, int NM>
WIDE_AVX512BF16 void dots_bf16(const uint16_t* const* w, const uint16_t* const* x, int64_t len, AccRows acc,
                               int m_at, int64_t ahead) {
  __m512 p[NRv][MT];
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) p[r][m] = _mm512_setzero_ps();
  part_bf16<NRv, NM>(w, x, 0, len, p, 0, ahead);
  WIDE_UNROLL for (int r = 0; r < NRv; ++r)
    WIDE_UNROLL for (int m = 0; m < NM; ++m) acc[r][m_at + m] += _mm512_reduce_add_ps(p[r][m]);
}

WIDE_AVX512 void reduce_parts(const __m512 (*p)[MT], int nr, int nm, Acc& acc) {
  for (int r = 0; r < nr; ++r)
    for (int m = 0; m < nm; ++m) acc[r][m] += _mm512_reduce_add_ps(p[r][m]);
}

// One instruction set's kernel over nr (1..NR) x nm (1..MR): full blocks of NR rows at once, the rows of
// a group's last partial block one at a time; activation rows in chunks the register file holds.
template <typename T, int NRv, int NM>
struct Avx2K {
  static void go(const T* const* w, const T* const* x, int64_t len, AccRows acc, int m_at, int64_t = 0) {
    dots_avx2<T, NRv, NM>(w, x, len, acc, m_at);
  }
};
template <typename T, int NRv, int NM>
struct Avx512K {
  static void go(const T* const* w, const T* const* x, int64_t len, AccRows acc, int m_at, int64_t ahead) {
    dots_avx512<T, NRv, NM>(w, x, len, acc, m_at, ahead);
  }
};
template <typename T, int NRv, int NM>
struct Bf16K {
  static void go(const T* const* w, const T* const* x, int64_t len, AccRows acc, int m_at, int64_t ahead) {
    dots_bf16<NRv, NM>(w, x, len, acc, m_at, ahead);
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

template <typename T, template <typename, int, int> class K, int CHUNK>
void dots_blocked(const T* const* w, int nr, const T* const* x, int nm, int64_t len, Acc& acc) {
  for (int m0 = 0; m0 < nm; m0 += CHUNK) {
    const int c = std::min(CHUNK, nm - m0);
    if (nr == NR) {
      if (c == 4) K<T, NR, 4>::go(w, x + m0, len, acc, m0);
      else if (c == 3) K<T, NR, 3>::go(w, x + m0, len, acc, m0);
      else if (c == 2) K<T, NR, 2>::go(w, x + m0, len, acc, m0);
      else K<T, NR, 1>::go(w, x + m0, len, acc, m0);
      continue;
    }
    for (int r = 0; r < nr; ++r) {  // a group's last channels, one row at a time
      Acc one = {};
      if (c == 4) K<T, 1, 4>::go(w + r, x + m0, len, one, 0);
      else if (c == 3) K<T, 1, 3>::go(w + r, x + m0, len, one, 0);
      else if (c == 2) K<T, 1, 2>::go(w + r, x + m0, len, one, 0);
      else K<T, 1, 1>::go(w + r, x + m0, len, one, 0);
      for (int m = 0; m < c; ++m) acc[r][m0 + m] += one[0][m];
    }
  }
}

// K<T, NRv, nm> for a run-time nm in [LO, HI], on activation rows x[0 .. nm) into acc columns m_at ..
template <typename T, template <typename, int, int> class K, int NRv, int LO, int HI>
inline void go_nm(int nm, const T* const* w, const T* const* x, int64_t len, AccRows acc, int m_at,
                  int64_t ahead) {
  if constexpr (LO < HI) {
    if (nm != LO) return go_nm<T, K, NRv, LO + 1, HI>(nm, w, x, len, acc, m_at, ahead);
  }
  K<T, NRv, LO>::go(w, x, len, acc, m_at, ahead);
}

template <typename T, template <typename, int, int> class P, int NRv, int LO, int HI>
inline void part_nm(int nm, const T* const* w, const T* const* x, int64_t k0, int64_t len, __m512 (*p)[MT],
                    int m_at, int64_t ahead) {
  if constexpr (LO < HI) {
    if (nm != LO) return part_nm<T, P, NRv, LO + 1, HI>(nm, w, x, k0, len, p, m_at, ahead);
  }
  P<T, NRv, LO>::go(w, x, k0, len, p, m_at, ahead);
}

// More than 8 tokens (AVX-512): the row pairs of dots_one_pass, but k in chunks of KC, every pass of the
// block over one chunk before the next, so a chunk of the tokens' activations (16 x 2 KB of float32) is read
// from L2 once per block and then from L1; vector partial sums stay in memory between chunks (no horizontal
// sums but the last).
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

// The weight rows against nm <= 8 activation rows (32 vector registers, at most 16 accumulators): rows in
// blocks of NR for up to 4 tokens, in pairs for 5..8, each meeting its tokens in one pass over k. Every weight
// vector loaded serves every token, so a row streams from memory once per call, and the activations (a few KB
// a token) come from cache. More tokens: dots_chunked.
template <typename T, template <typename, int, int> class K>
void dots_one_pass(const T* const* w, int nr, const T* const* x, int nm, int64_t len, Acc& acc, int64_t stride) {
  int r = 0;
  if (nm <= 4) {
    for (; r + NR <= nr; r += NR) go_nm<T, K, NR, 1, 4>(nm, w + r, x, len, acc + r, 0, NR * stride);
    for (; r < nr; ++r) go_nm<T, K, 1, 1, 4>(nm, w + r, x, len, acc + r, 0, stride);
    return;
  }
  for (; r + 2 <= nr; r += 2) go_nm<T, K, 2, 5, 8>(nm, w + r, x, len, acc + r, 0, 2 * stride);
  for (; r < nr; ++r) go_nm<T, K, 1, 5, 8>(nm, w + r, x, len, acc + r, 0, stride);
}

// stride: where the weight rows are consecutive rows of one matrix, its row length: a kernel then prefetches
// the rows after its own (into L2) while it computes, so more rows stream from memory at once than its few
// accumulators allow (0: no prefetch)
template <typename T>
void dots(const T* const* w, int nr, const T* const* x, int nm, int64_t len, Acc& acc, int64_t stride = 0) {
  const int isa = g_isa.load(std::memory_order_relaxed);
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (isa == kAvx512Bf16)
      return nm > 8 ? dots_chunked<T, Bf16P>(w, nr, x, nm, len, acc, stride)
                    : dots_one_pass<T, Bf16K>(w, nr, x, nm, len, acc, stride);
  }
  if (isa >= kAvx512)
    return nm > 8 ? dots_chunked<T, Avx512P>(w, nr, x, nm, len, acc, stride)
                  : dots_one_pass<T, Avx512K>(w, nr, x, nm, len, acc, stride);
  if (isa == kAvx2) return dots_blocked<T, Avx2K, 2>(w, nr, x, nm, len, acc);
  dots_scalar(w, nr, x, nm, len, acc);
}

// ---------------------------------------------------------------------------------------------------------
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

inline float silu(float v) { return v / (1.f + std::exp(-v)); }

struct Geometry {
  int64_t M, N, K, G, gs;
};

// For every group: the rows (tokens) that execute it, in order; groups no row executes are not listed.
struct Plan {
  std::vector<int32_t> rows;   // concatenated row lists
  std::vector<int64_t> start;  // per listed group: offset into rows; start[i + 1] - start[i] rows
  std::vector<int64_t> group;  // the listed groups
};

void plan_groups(const int32_t* mask, int64_t M, int64_t G, Plan& p) {
  p.rows.clear(), p.start.clear(), p.group.clear();
  for (int64_t g = 0; g < G; ++g) {
    int64_t before = p.rows.size();
    for (int64_t m = 0; m < M; ++m)
      if (mask[m * G + g]) p.rows.push_back(static_cast<int32_t>(m));
    if (static_cast<int64_t>(p.rows.size()) > before) {
      p.group.push_back(g);
      p.start.push_back(before);
    }
  }
  p.start.push_back(p.rows.size());
}

// The plan of this call, in the calling thread's own Plan (grown once). Kernels take it by reference before
// at::parallel_for: a lambda naming a thread_local would see each worker's own, empty one.
Plan& call_plan(const int32_t* mask, int64_t M, int64_t G) {
  thread_local Plan plan;
  plan_groups(mask, M, G, plan);
  return plan;
}

// N-pruned: outputs of group g are channels [g*gs, (g+1)*gs); only executed groups' weight rows are read, once
// per call: each block of NR rows meets every token that executes its group, MR tokens at a time.
template <typename T>
void gemm_n_impl(const T* x, const T* w, const int32_t* mask, const T* bias, T* out, const Geometry& d,
                 const T* w2 = nullptr) {
  const bool gated = w2 != nullptr;
  // zero everything first (skipped groups, and rows that skip an executed group), then fill computed outputs
  at::parallel_for(0, d.M, 1, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m)
      for (int64_t n = 0; n < d.N; ++n) put(out + m * d.N + n, 0.f);
  });
  Plan& plan = call_plan(mask, d.M, d.G);
  const int64_t blocks_per_group = (d.gs + NR - 1) / NR;
  const int64_t items = static_cast<int64_t>(plan.group.size()) * blocks_per_group;
  at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const int64_t gi = it / blocks_per_group, blk = it % blocks_per_group;
      const int64_t g = plan.group[gi];
      const int64_t n0 = g * d.gs + blk * NR;
      const int nr = static_cast<int>(std::min<int64_t>(NR, (g + 1) * d.gs - n0));
      const T* wr[NR];
      const T* ur[NR];
      for (int r = 0; r < nr; ++r) {
        wr[r] = w + (n0 + r) * d.K;
        if (gated) ur[r] = w2 + (n0 + r) * d.K;
      }
      const int32_t* rows = plan.rows.data() + plan.start[gi];
      const int64_t nrows = plan.start[gi + 1] - plan.start[gi];
      for (int64_t i = 0; i < nrows; i += MT) {
        const int nm = static_cast<int>(std::min<int64_t>(MT, nrows - i));
        const T* xr[MT];
        for (int m = 0; m < nm; ++m) xr[m] = x + rows[i + m] * d.K;
        Acc acc = {};
        dots(wr, nr, xr, nm, d.K, acc, d.K);
        if (gated) {
          Acc up = {};
          dots(ur, nr, xr, nm, d.K, up, d.K);
          for (int m = 0; m < nm; ++m)
            for (int r = 0; r < nr; ++r) put(out + rows[i + m] * d.N + n0 + r, silu(acc[r][m]) * up[r][m]);
        } else {
          for (int m = 0; m < nm; ++m)
            for (int r = 0; r < nr; ++r)
              put(out + rows[i + m] * d.N + n0 + r, acc[r][m] + (bias ? load1(bias + n0 + r) : 0.f));
        }
      }
    }
  });
}

// K-pruned: every output channel sums over the input groups its token executes; a weight row's segment of
// group g is read only when some token of the call executes g (once per MR tokens).
template <typename T>
void gemm_k_impl(const T* x, const T* w, const int32_t* mask, const T* bias, T* out, const Geometry& d) {
  Plan& plan = call_plan(mask, d.M, d.G);
  const int64_t items = (d.N + NR - 1) / NR;
  at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const int64_t n0 = it * NR;
      const int nr = static_cast<int>(std::min<int64_t>(NR, d.N - n0));
      for (int64_t m0 = 0; m0 < d.M; m0 += MR) {
        const int nm = static_cast<int>(std::min<int64_t>(MR, d.M - m0));
        Acc acc = {};
        for (size_t gi = 0; gi < plan.group.size(); ++gi) {
          const int64_t g = plan.group[gi];
          int on[MR], n_on = 0;  // the block's tokens that execute g
          for (int m = 0; m < nm; ++m)
            if (mask[(m0 + m) * d.G + g]) on[n_on++] = m;
          if (n_on == 0) continue;
          const T* wr[NR];
          for (int r = 0; r < nr; ++r) wr[r] = w + (n0 + r) * d.K + g * d.gs;
          const T* xr[MR];
          for (int j = 0; j < n_on; ++j) xr[j] = x + (m0 + on[j]) * d.K + g * d.gs;
          Acc part = {};
          dots(wr, nr, xr, n_on, d.gs, part);
          for (int j = 0; j < n_on; ++j)
            for (int r = 0; r < nr; ++r) acc[r][on[j]] += part[r][j];
        }
        for (int m = 0; m < nm; ++m)
          for (int r = 0; r < nr; ++r)
            put(out + (m0 + m) * d.N + n0 + r, acc[r][m] + (bias ? load1(bias + n0 + r) : 0.f));
      }
    }
  });
}

// K-pruned over the packed layout of pack_k: w is [G, C, group_size, KB] with C = N / KB, channel
// n = c * KB + j of group g's input k at [g][c][k][j]. A thread owns a range of chunks c and walks
// the executed groups one after the other: group g's part for its range is one contiguous stream, multiplied
// by broadcast activations into KB-wide vector sums (no horizontal reductions), kept per thread between groups.
constexpr int KB = 16;
constexpr int PREFETCH_K = 64;  // rows of a block read ahead (4 KB of float32): the next block's start too

template <typename T>
inline void axpy_block_scalar(const T* blk, int64_t gs, const T* const* xg, int nm, float (*acc)[KB]) {
  for (int64_t k = 0; k < gs; ++k)
    for (int m = 0; m < nm; ++m) {
      const float xv = load1(xg[m] + k);
      for (int j = 0; j < KB; ++j) acc[m][j] += load1(blk + k * KB + j) * xv;
    }
}

template <typename T>
WIDE_AVX512 void axpy_block_avx512(const T* blk, int64_t gs, const T* const* xg, int nm, float (*acc)[KB]) {
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
WIDE_AVX512 void axpy4_avx512(const T* const* blk, int64_t gs, const T* xg, float (*acc)[KB]) {
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
WIDE_AVX512 void axpy4_tokens_avx512(const T* const* blk, int64_t gs, const T* const* xg, float* const* acc) {
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

// axpy4_tokens_avx512 for nm in 2..4 (AVX-512 only: the caller checks)
template <typename T>
void axpy4_tokens(const T* const* blk, int64_t gs, const T* const* xg, int nm, float* const* acc) {
  if (nm == 2) axpy4_tokens_avx512<T, 2>(blk, gs, xg, acc);
  else if (nm == 3) axpy4_tokens_avx512<T, 3>(blk, gs, xg, acc);
  else axpy4_tokens_avx512<T, 4>(blk, gs, xg, acc);
}

template <typename T>
WIDE_AVX2 void axpy4_avx2(const T* const* blk, int64_t gs, const T* xg, float (*acc)[KB]) {
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
void axpy4(const T* const* blk, int64_t gs, const T* xg, float (*acc)[KB]) {
  const int isa = g_isa.load(std::memory_order_relaxed);
  if (isa >= kAvx512) return axpy4_avx512(blk, gs, xg, acc);
  if (isa == kAvx2) return axpy4_avx2(blk, gs, xg, acc);
  WIDE_UNROLL for (int i = 0; i < 4; ++i) {
    const T* one[1] = {xg};
    axpy_block_scalar(blk[i], gs, one, 1, &acc[i]);
  }
}

template <typename T>
WIDE_AVX2 void axpy_block_avx2(const T* blk, int64_t gs, const T* const* xg, int nm, float (*acc)[KB]) {
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

template <typename T>
void axpy_block(const T* blk, int64_t gs, const T* const* xg, int nm, float (*acc)[KB]) {
  const int isa = g_isa.load(std::memory_order_relaxed);
  if (isa >= kAvx512) return axpy_block_avx512(blk, gs, xg, nm, acc);
  if (isa == kAvx2) return axpy_block_avx2(blk, gs, xg, nm, acc);
  axpy_block_scalar(blk, gs, xg, nm, acc);
}

template <typename T>
void gemm_k_packed_impl(const T* x, const T* w, const int32_t* mask, const T* bias, T* out, const Geometry& d) {
  Plan& plan = call_plan(mask, d.M, d.G);
  const int64_t C = (d.N + KB - 1) / KB;
  at::parallel_for(0, C, 1, [&](int64_t cb, int64_t ce) {
    thread_local std::vector<float> buf;  // [chunk][row][KB] sums of this thread's range, grown once
    const int64_t need = (ce - cb) * d.M * KB;
    if (static_cast<int64_t>(buf.size()) < need) buf.resize(need);
    std::fill(buf.begin(), buf.begin() + need, 0.f);
    for (size_t gi = 0; gi < plan.group.size(); ++gi) {
      const int64_t g = plan.group[gi];
      const int32_t* rows = plan.rows.data() + plan.start[gi];
      const int64_t nrows = plan.start[gi + 1] - plan.start[gi];
      int64_t c_done = cb;  // one token: four quarters of the range at once, as four streams
      if (nrows == 1 && ce - cb >= 4) {
        const int64_t q = (ce - cb) / 4;
        const T* xg = x + rows[0] * d.K + g * d.gs;
        for (int64_t i = 0; i < q; ++i) {
          const T* blk[4];
          float acc[4][KB];
          for (int j = 0; j < 4; ++j) {
            const int64_t c = cb + j * q + i;
            blk[j] = w + ((g * C + c) * d.gs) * KB;
            std::memcpy(acc[j], &buf[((c - cb) * d.M + rows[0]) * KB], sizeof acc[j]);
          }
          axpy4(blk, d.gs, xg, acc);
          for (int j = 0; j < 4; ++j)
            std::memcpy(&buf[((cb + j * q + i - cb) * d.M + rows[0]) * KB], acc[j], sizeof acc[j]);
        }
        c_done = cb + 4 * q;
      } else if (nrows > 1 && ce - cb >= 4 && g_isa.load(std::memory_order_relaxed) >= kAvx512) {
        // several tokens: the same four streams, up to four tokens a pass (later passes reread from cache)
        const int64_t q = (ce - cb) / 4;
        for (int64_t i = 0; i < q; ++i) {
          const T* blk[4];
          for (int j = 0; j < 4; ++j) blk[j] = w + ((g * C + cb + j * q + i) * d.gs) * KB;
          for (int64_t t = 0; t < nrows; t += 4) {
            const int nm = static_cast<int>(std::min<int64_t>(4, nrows - t));
            const T* xg[4];
            float* acc[16];
            for (int m = 0; m < nm; ++m) {
              xg[m] = x + rows[t + m] * d.K + g * d.gs;
              for (int j = 0; j < 4; ++j) acc[j * nm + m] = &buf[((j * q + i) * d.M + rows[t + m]) * KB];
            }
            if (nm == 1) {
              float one[4][KB];
              for (int j = 0; j < 4; ++j) std::memcpy(one[j], acc[j], sizeof one[j]);
              axpy4(blk, d.gs, xg[0], one);
              for (int j = 0; j < 4; ++j) std::memcpy(acc[j], one[j], sizeof one[j]);
            } else {
              axpy4_tokens(blk, d.gs, xg, nm, acc);
            }
          }
        }
        c_done = cb + 4 * q;
      }
      for (int64_t c = c_done; c < ce; ++c) {
        const T* blk = w + ((g * C + c) * d.gs) * KB;
        for (int64_t i = 0; i < nrows; i += MR) {
          const int nm = static_cast<int>(std::min<int64_t>(MR, nrows - i));
          const T* xg[MR];
          float acc[MR][KB];
          for (int m = 0; m < nm; ++m) {
            xg[m] = x + rows[i + m] * d.K + g * d.gs;
            std::memcpy(acc[m], &buf[((c - cb) * d.M + rows[i + m]) * KB], sizeof acc[m]);
          }
          axpy_block(blk, d.gs, xg, nm, acc);
          for (int m = 0; m < nm; ++m)
            std::memcpy(&buf[((c - cb) * d.M + rows[i + m]) * KB], acc[m], sizeof acc[m]);
        }
      }
    }
    for (int64_t m = 0; m < d.M; ++m)
      for (int64_t c = cb; c < ce; ++c)
        for (int j = 0; j < KB; ++j) {
          const int64_t n = c * KB + j;
          put(out + m * d.N + n, buf[((c - cb) * d.M + m) * KB + j] + (bias ? load1(bias + n) : 0.f));
        }
  });
}

// K-pruned over the transposed weight wt = W^T [K, N] (row-major): group g's weights are rows
// [g*gs, (g+1)*gs), one contiguous block, and the dense GEMM reads the same tensor (F.linear(x, wt.t())), so
// a caller keeps this one copy for decode and prefill alike. Threads split the executed groups (not the
// outputs): each streams its groups' blocks front to back, eight rows at a time, into its own [M, N] float32
// partial sums (an N-tile at a time when many tokens share a group, so they stay in cache); the partials are
// summed at the end.
constexpr int KT_ROWS = 8;                  // weight rows per pass: eight streams, one accumulator load / store
constexpr int KT_TOKENS = 16;               // tokens per pass over a group
constexpr int64_t KT_ACC_BYTES = 16 << 10;  // a pass's accumulators: about an L1 data cache
constexpr int64_t KT_ITEMS_PER_THREAD = 8;  // work items a thread takes on average (gemm_kt splits groups so)

// acc[m][0 .. len) += sum_i xs[m][i] * w[i][0 .. len), i < nw <= KT_ROWS, m < nm
template <typename T>
void rows_axpy_scalar(const T* const* w, int nw, int64_t len, const float (*xs)[KT_ROWS], int nm,
                      float* const* acc) {
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

template <typename T>
WIDE_AVX512 void rows_axpy_avx512(const T* const* w, int nw, int64_t len, const float (*xs)[KT_ROWS], int nm,
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
    const __mmask16 km = len - n >= 16 ? static_cast<__mmask16>(0xFFFF)
                                       : static_cast<__mmask16>((1u << (len - n)) - 1);
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

template <typename T>
WIDE_AVX2 void rows_axpy_avx2(const T* const* w, int nw, int64_t len, const float (*xs)[KT_ROWS], int nm,
                         float* const* acc) {
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

template <typename T>
void rows_axpy(const T* const* w, int nw, int64_t len, const float (*xs)[KT_ROWS], int nm, float* const* acc,
               int64_t ahead) {
  const int isa = g_isa.load(std::memory_order_relaxed);
  if (isa >= kAvx512) return rows_axpy_avx512(w, nw, len, xs, nm, acc, ahead);
  if (isa == kAvx2) return rows_axpy_avx2(w, nw, len, xs, nm, acc);
  rows_axpy_scalar(w, nw, len, xs, nm, acc);
}

// The calling thread's buffer of every worker's partial sums (grown once), zeroed, taken before
// at::parallel_for (as call_plan)
std::vector<float>& call_partials(int64_t n) {
  thread_local std::vector<float> part;
  if (static_cast<int64_t>(part.size()) < n) part.resize(n);
  std::fill(part.begin(), part.begin() + n, 0.f);
  return part;
}

template <typename T>
void gemm_kt_impl(const T* x, const T* wt, const int32_t* mask, const T* bias, T* out, const Geometry& d) {
  Plan& plan = call_plan(mask, d.M, d.G);
  const int64_t MN = d.M * d.N;
  const int nt = std::max(1, at::get_num_threads());
  std::vector<float>& part = call_partials(nt * MN);
  // work items: a group's input rows in `splits` runs, enough items for the threads to share evenly (a decode
  // step of o_proj has a few executed groups: one whole group an item left a thread idle a third of the time)
  const int64_t ng = static_cast<int64_t>(plan.group.size());
  const int64_t splits = ng == 0 ? 1 : std::clamp<int64_t>((KT_ITEMS_PER_THREAD * nt + ng - 1) / ng, 1,
                                                           (d.gs + KT_ROWS - 1) / KT_ROWS);
  const int64_t run = ((d.gs + splits - 1) / splits + KT_ROWS - 1) / KT_ROWS * KT_ROWS;
  at::parallel_for(0, ng * splits, 1, [&](int64_t b, int64_t e) {
    float* mine = part.data() + std::min(at::get_thread_num(), nt - 1) * MN;
    for (int64_t item = b; item < e; ++item) {
      const int64_t gi = item / splits, k_begin = item % splits * run, k_end = std::min(d.gs, k_begin + run);
      const int64_t g = plan.group[gi];
      const int32_t* rows = plan.rows.data() + plan.start[gi];
      const int64_t nrows = plan.start[gi + 1] - plan.start[gi];
      for (int64_t i = 0; i < nrows; i += KT_TOKENS) {
        const int nm = static_cast<int>(std::min<int64_t>(KT_TOKENS, nrows - i));
        const int64_t tile = std::min<int64_t>(d.N, std::max<int64_t>(256, KT_ACC_BYTES / 4 / nm / 16 * 16));
        for (int64_t n0 = 0; n0 < d.N; n0 += tile) {
          const int64_t len = std::min(tile, d.N - n0);
          float* acc[KT_TOKENS];
          for (int m = 0; m < nm; ++m) acc[m] = mine + rows[i + m] * d.N + n0;
          for (int64_t k = k_begin; k < k_end; k += KT_ROWS) {
            const int nw = static_cast<int>(std::min<int64_t>(KT_ROWS, k_end - k));
            const T* w[KT_ROWS];
            float xs[KT_TOKENS][KT_ROWS];
            for (int j = 0; j < nw; ++j) w[j] = wt + (g * d.gs + k + j) * d.N + n0;
            for (int m = 0; m < nm; ++m)
              for (int j = 0; j < nw; ++j) xs[m][j] = load1(x + rows[i + m] * d.K + g * d.gs + k + j);
            rows_axpy(w, nw, len, xs, nm, acc, KT_ROWS * d.N);  // prefetch the next rows' same columns
          }
        }
      }
    }
  });
  at::parallel_for(0, MN, 4096, [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      float s = bias ? load1(bias + idx % d.N) : 0.f;
      for (int t = 0; t < nt; ++t) s += part[t * MN + idx];
      put(out + idx, s);
    }
  });
}

// ---------------------------------------------------------------------------------------------------------
// wN x wK: the weight's [N, K] (a packed w's too: its layout is checked by gemm_k). The tensors are listed in `io`
// (out written, the others read); the caller adds its own and checks them apart.
Geometry check(const at::Tensor& x, const at::Tensor& w, int64_t wN, int64_t wK, const at::Tensor& mask,
               int64_t group_size, const at::Tensor& out, bool k_pruned, const char* op, Apart& io) {
  check_tensor(x, op, "x", kAnyFloat);
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && out.scalar_type() == x.scalar_type(), op,
              ": x, w and out must share a dtype, got ", x.scalar_type(), ", ", w.scalar_type(), ", ",
              out.scalar_type());
  check_tensor(w, op, "w", x.scalar_type());
  check_tensor(mask, op, "mask", at::kInt);
  check_tensor(out, op, "out", x.scalar_type());
  TORCH_CHECK(x.dim() == 2 && mask.dim() == 2 && out.dim() == 2, op, ": x, mask and out must be 2-D");
  Geometry d{x.size(0), wN, x.size(1), mask.size(1), group_size};
  TORCH_CHECK(d.M <= INT32_MAX, op, ": at most ", INT32_MAX, " rows, got ", d.M);
  TORCH_CHECK(wK == d.K, op, ": w is [N, K] with K = x.size(1) = ", d.K, ", got K = ", wK);
  TORCH_CHECK(group_size > 0, op, ": group_size must be positive, got ", group_size);
  TORCH_CHECK(mask.size(0) == d.M &&
                  mul_sizes(d.G, group_size, op, "the mask's groups x group_size") == (k_pruned ? d.K : d.N),
              op, ": mask must be [M, G] with G * group_size = ", k_pruned ? "K = " : "N = ", k_pruned ? d.K : d.N,
              ", got mask ", mask.sizes(), " and group_size ", group_size);
  check_shape(out, {d.M, d.N}, op, "out");
  io.read(x, "x"), io.read(w, "w"), io.read(mask, "mask"), io.write(out, "out");
  return d;
}

Geometry check(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mask, int64_t group_size,
               const at::Tensor& out, bool k_pruned, const char* op, Apart& io) {
  TORCH_CHECK(w.dim() == 2, op, ": w must be 2-D, got ", w.sizes());
  return check(x, w, w.size(0), w.size(1), mask, group_size, out, k_pruned, op, io);
}

void check_bias(const std::optional<at::Tensor>& bias, const at::Tensor& x, int64_t N, const char* op, Apart& io) {
  if (!bias || !bias->defined()) return;
  check_tensor(*bias, op, "bias", x.scalar_type());
  TORCH_CHECK(bias->numel() == N, op, ": bias must be [N] = [", N, "], got ", bias->sizes());
  io.read(*bias, "bias");
}

template <typename F>
void by_dtype(const at::Tensor& x, F&& f) {
  if (x.scalar_type() == at::kFloat) f(static_cast<float*>(nullptr));
  else if (x.scalar_type() == at::kHalf) f(static_cast<c10::Half*>(nullptr));
  else f(static_cast<uint16_t*>(nullptr));
}

template <typename T>
const T* ptr(const at::Tensor& t) { return static_cast<const T*>(t.data_ptr()); }

template <typename T>
const T* ptr(const std::optional<at::Tensor>& t) { return t && t->defined() ? ptr<T>(*t) : nullptr; }

void gemm_n(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mask, int64_t group_size,
            const std::optional<at::Tensor>& bias, at::Tensor& out) {
  const char* op = "wide_cpu::gemm_n";
  Apart io(op);
  Geometry d = check(x, w, mask, group_size, out, false, op, io);
  check_bias(bias, x, d.N, op, io);
  io.check();
  if (out.numel() == 0) return;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemm_n_impl<T>(ptr<T>(x), ptr<T>(w), mask.data_ptr<int32_t>(), ptr<T>(bias), static_cast<T*>(out.data_ptr()), d);
  });
}

void gated(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up, const at::Tensor& mask,
           int64_t group_size, at::Tensor& out) {
  const char* op = "wide_cpu::gated";
  Apart io(op);
  Geometry d = check(x, w_gate, mask, group_size, out, false, op, io);
  check_tensor(w_up, op, "w_up", x.scalar_type());
  check_shape(w_up, w_gate.sizes(), op, "w_up (w_gate's shape)");
  io.read(w_up, "w_up");
  io.check();
  if (out.numel() == 0) return;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemm_n_impl<T>(ptr<T>(x), ptr<T>(w_gate), mask.data_ptr<int32_t>(), nullptr, static_cast<T*>(out.data_ptr()),
                   d, ptr<T>(w_up));
  });
}

void gemm_k(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mask, int64_t group_size,
            const std::optional<at::Tensor>& bias, at::Tensor& out) {
  const char* op = "wide_cpu::gemm_k";
  const bool packed = w.dim() == 4;  // [G, N / KB, group_size, KB] from pack_k
  TORCH_CHECK(packed || w.dim() == 2, op, ": w must be [N, K] or packed [G, N / ", KB, ", group_size, ", KB,
              "], got ", w.sizes());
  Apart io(op);
  Geometry d = packed ? check(x, w, mul_sizes(w.size(1), KB, op, "a packed w's N"),
                              mul_sizes(w.size(0), w.size(2), op, "a packed w's K"), mask, group_size, out, true, op, io)
                      : check(x, w, mask, group_size, out, true, op, io);
  TORCH_CHECK(!packed || (w.size(0) == d.G && w.size(2) == group_size && w.size(3) == KB),
              op, ": a packed w is [G, N / ", KB, ", group_size, ", KB, "] (pack_k), got ", w.sizes());
  check_bias(bias, x, d.N, op, io);
  io.check();
  if (out.numel() == 0) return;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* b = ptr<T>(bias);
    if (packed)
      gemm_k_packed_impl<T>(ptr<T>(x), ptr<T>(w), mask.data_ptr<int32_t>(), b, static_cast<T*>(out.data_ptr()), d);
    else
      gemm_k_impl<T>(ptr<T>(x), ptr<T>(w), mask.data_ptr<int32_t>(), b, static_cast<T*>(out.data_ptr()), d);
  });
}

void gemm_kt(const at::Tensor& x, const at::Tensor& wt, const at::Tensor& mask, int64_t group_size,
             const std::optional<at::Tensor>& bias, at::Tensor& out) {
  const char* op = "wide_cpu::gemm_kt";
  TORCH_CHECK(wt.dim() == 2, op, ": wt must be [K, N], got ", wt.sizes());
  Apart io(op);
  Geometry d = check(x, wt, wt.size(1), wt.size(0), mask, group_size, out, true, op, io);
  check_bias(bias, x, d.N, op, io);
  io.check();
  if (out.numel() == 0) return;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemm_kt_impl<T>(ptr<T>(x), ptr<T>(wt), mask.data_ptr<int32_t>(), ptr<T>(bias), static_cast<T*>(out.data_ptr()),
                    d);
  });
}

// ---------------------------------------------------------------------------------------------------------
// The small ops around the projections, one call each where the model's reference spends several torch ops
// (a decode step runs each once a layer; their time was dispatch, not arithmetic), and decode attention. Same
// rounding as the reference: every intermediate the reference stores in the input dtype is rounded to it here.
// AVX-512 or AVX2 (8 lanes; attention for head sizes of 8s) where the CPU has them; with neither, RMSNorm and RoPE
// run scalar code and decline float16 (whose scalar conversions are slower than torch's ops), and attention
// declines: each op returns whether it ran.
template <typename T>
inline float rounded(float v) {  // v as the reference's tensor of dtype T holds it
  T t;
  put(&t, v);
  return load1(&t);
}

WIDE_AVX512 inline __m512i bf16_bits(__m512 v) {  // round to nearest even (to_bf16), in each lane's low half
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
}
constexpr int kHalfRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
WIDE_AVX512 inline __m512 round16(__m512 v, const float*) { return v; }
WIDE_AVX512 inline __m512 round16(__m512 v, const c10::Half*) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, kHalfRound));
}
WIDE_AVX512 inline __m512 round16(__m512 v, const uint16_t*) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(v), 16));
}
WIDE_AVX512 inline void store16(float* p, __m512 v, __mmask16 k) { _mm512_mask_storeu_ps(p, k, v); }
WIDE_AVX512 inline void store16(c10::Half* p, __m512 v, __mmask16 k) {
  _mm256_mask_storeu_epi16(p, k, _mm512_cvtps_ph(v, kHalfRound));
}
WIDE_AVX512 inline void store16(uint16_t* p, __m512 v, __mmask16 k) {
  _mm256_mask_storeu_epi16(p, k, _mm512_cvtepi32_epi16(bf16_bits(v)));
}
// The same for AVX2's 8 lanes (RMSNorm, RoPE and decode attention on a CPU without AVX-512)
WIDE_AVX2 inline __m256i bf16_bits8(__m256 v) {  // round to nearest even (to_bf16), in each lane's low half
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
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
inline __mmask16 tail16(int64_t left) { return left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1); }

// exp(x) for x <= 0 (softmax after the max is taken): 2^n * p(f), n = round(x log2 e), f = x - n ln 2 in two
// steps, p degree 6 (relative error ~2e-7, Horner from kExpPoly[0]); below -87 (-inf too) the result is 0, and a NaN
// stays NaN, as torch.softmax propagates it (a NaN score, or inf - inf where a score is +inf): the clamp is a max
// whose second operand is x, the one a NaN comparison returns. 16 and 8 lanes.
constexpr float kExpPoly[] = {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};
constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
WIDE_AVX512 inline __m512 exp16(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_NLT_UQ);  // x >= -87, or NaN
  x = _mm512_max_ps(_mm512_set1_ps(-87.f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT);
  const __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExpPoly[i]));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}
WIDE_AVX2 inline __m256 exp8(__m256 x) {  // 2^n through the exponent bits (n >= -126 here)
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_NLT_UQ);  // x >= -87, or NaN
  x = _mm256_max_ps(_mm256_set1_ps(-87.f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), kHalfRound);
  const __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExpPoly[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// RMSNorm (model/modeling.py): out = w * T(x * rsqrt(mean(x^2) + eps)), the mean in float32 as the reference's
template <typename T>
void rms_norm_row(const T* x, const T* w, T* out, int64_t H, float eps) {
  float ss = 0.f;
  for (int64_t k = 0; k < H; ++k) ss += load1(x + k) * load1(x + k);
  const float r = 1.f / std::sqrt(ss / H + eps);
  for (int64_t k = 0; k < H; ++k) put(out + k, load1(w + k) * rounded<T>(load1(x + k) * r));
}

template <typename T>
WIDE_AVX512 void rms_norm_row_avx512(const T* x, const T* w, T* out, int64_t H, float eps) {
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
WIDE_AVX2 void rms_norm_row_avx2(const T* x, const T* w, T* out, int64_t H, float eps) {
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

// The row function of the instruction set in use (the scalar one declines float16 in the ops below)
template <typename T>
auto rms_norm_row_for(int isa) {
  return isa >= kAvx512 ? rms_norm_row_avx512<T> : isa == kAvx2 ? rms_norm_row_avx2<T> : rms_norm_row<T>;
}

// rotary embedding in place, the reference's x * cos + rotate_half(x) * sin: x [M, H, D] (every head of a token
// shares the token's cos / sin row [D]); rotate_half(x) = cat(-x[D/2:], x[:D/2])
constexpr int64_t ROPE_MAX_D = 1024;
template <typename T>
void rope_impl(T* x, int64_t M, int64_t H, int64_t D, const T* cos, const T* sin) {
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

template <typename T>
WIDE_AVX512 void rope_avx512(T* x, int64_t M, int64_t H, int64_t D, const T* cos, const T* sin) {
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

template <typename T>
WIDE_AVX2 void rope_avx2(T* x, int64_t M, int64_t H, int64_t D, const T* cos, const T* sin) {
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
    for (; j < half; ++j) {  // the scalar rule of rope_impl for the last pairs
      const float a = load1(row + j), b = load1(row + half + j);
      put(row + j, rounded<T>(a * load1(c + j)) + rounded<T>(-b * load1(s + j)));
      put(row + half + j, rounded<T>(b * load1(c + half + j)) + rounded<T>(a * load1(s + half + j)));
    }
  }
}

template <typename T>
void rope_for(int isa, T* x, int64_t M, int64_t H, int64_t D, const T* cos, const T* sin) {
  if (isa >= kAvx512) rope_avx512<T>(x, M, H, D, cos, sin);
  else if (isa == kAvx2) rope_avx2<T>(x, M, H, D, cos, sin);
  else rope_impl<T>(x, M, H, D, cos, sin);
}

// Decode attention of one query per sequence over its past, the query heads of skipped groups left out: for each
// sequence and KV head, the active query heads of that KV head (GQA: Hq / Hk consecutive heads) score every past
// key, softmax (float32, max subtracted), and sum the values; a KV head none of whose query heads is active is
// not read, and skipped heads' outputs are 0 (o_proj ignores them). q [B, Hq, D], k / v [B, Hk, >= L, D] with any
// batch and head strides (a preallocated cache), out [B, Hq, D]; head_mask [B, Hq / group_heads] int32 or none.
struct AttnShape {
  int64_t B, Hq, Hk, L, D, kb, kh, vb, vh;  // k / v strides of the batch and head dims (rows are D apart)
  float scale;
};

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

template <typename T>
WIDE_AVX2 void attend_kv_head_avx2(const T* q, const T* k, const T* v, T* out, const AttnShape& a, const int* heads,
                                   int nh, std::vector<float>& sc) {  // attend_kv_head in 8 lanes: D % 8 == 0
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

// Whether decode attention runs with the instruction set in use: AVX-512, or AVX2 for a head size of 8s
inline bool attention_runs(int64_t D) { return g_isa.load() >= kAvx512 || (g_isa.load() == kAvx2 && D % 8 == 0); }

template <typename T>
void decode_attention_impl(const T* q, const T* k, const T* v, T* out, const AttnShape& a, const int32_t* mask,
                           int64_t group_heads) {
  const int64_t rep = a.Hq / a.Hk;
  const bool avx512 = g_isa.load() >= kAvx512;  // else AVX2 (attention_runs)
  at::parallel_for(0, a.B * a.Hk, 1, [&](int64_t b0, int64_t e0) {
    thread_local std::vector<float> sc;  // scores of the active heads, grown once
    thread_local std::vector<int> heads;
    for (int64_t it = b0; it < e0; ++it) {
      const int64_t b = it / a.Hk, kh = it % a.Hk;
      heads.clear();
      for (int64_t h = kh * rep; h < (kh + 1) * rep; ++h) {
        if (!mask || mask[b * (a.Hq / group_heads) + h / group_heads]) heads.push_back(static_cast<int>(h));
        else for (int64_t d = 0; d < a.D; ++d) put(out + (b * a.Hq + h) * a.D + d, 0.f);
      }
      if (!heads.empty())
        (avx512 ? attend_kv_head<T> : attend_kv_head_avx2<T>)(q + b * a.Hq * a.D, k + b * a.kb + kh * a.kh, v + b * a.vb + kh * a.vh, out + b * a.Hq * a.D,
                          a, heads.data(), static_cast<int>(heads.size()), sc);
    }
  });
}

// The router (ops/reference.py wide_router) for a few tokens: z = h Wc^T + bc, logits = z Wr^T + br in float32
// through the masked GEMM with its one group executed; mask[m, g] = logits[m, 2g] >= logits[m, 2g + 1].
void router_impl(const float* h, int64_t M, int64_t H, const float* wc, const float* bc, int64_t R, const float* wr,
                 const float* br, int64_t G, int32_t* mask) {
  thread_local std::vector<float> z, logits;  // grown once
  thread_local std::vector<int32_t> ones;
  z.resize(M * R), logits.resize(M * 2 * G), ones.assign(M, 1);
  gemm_n_impl<float>(h, wc, ones.data(), bc, z.data(), Geometry{M, R, H, 1, R});
  gemm_n_impl<float>(z.data(), wr, ones.data(), br, logits.data(), Geometry{M, 2 * G, R, 1, 2 * G});
  for (int64_t i = 0; i < M * G; ++i) mask[i] = logits[2 * i] >= logits[2 * i + 1];
}

// An activation [.., H]: a contiguous float CPU tensor of at least one dim
void check_act(const at::Tensor& x, const char* op, const char* name) {
  check_tensor(x, op, name, kAnyFloat);
  TORCH_CHECK(x.dim() >= 1, op, ": ", name, " must have at least one dim");
}

bool rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& out) {
  const char* op = "wide_cpu::rms_norm";
  check_act(x, op, "x");
  const int64_t H = x.size(-1), M = lead_rows(x, 1, op);
  check_tensor(w, op, "w", x.scalar_type());
  TORCH_CHECK(w.numel() == H, op, ": w must be [H] = [", H, "], got ", w.sizes());
  check_tensor(out, op, "out", x.scalar_type());
  check_shape(out, x.sizes(), op, "out (x's shape)");
  Apart io(op);
  io.read(x, "x"), io.read(w, "w"), io.write(out, "out");
  io.check();
  const int isa = g_isa.load();
  if (isa == kScalar && x.scalar_type() == at::kHalf) return false;
  if (out.numel() == 0) return true;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *xp = ptr<T>(x), *wp = ptr<T>(w);
    T* dst = static_cast<T*>(out.data_ptr());
    const auto row = rms_norm_row_for<T>(isa);
    at::parallel_for(0, M, 8, [&](int64_t b, int64_t e) {
      for (int64_t m = b; m < e; ++m) row(xp + m * H, wp, dst + m * H, H, static_cast<float>(eps));
    });
  });
  return true;
}

bool rope(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const char* op = "wide_cpu::rope";
  check_act(x, op, "x");
  TORCH_CHECK(x.dim() >= 2, op, ": x must be [.., H, D], got ", x.sizes());
  const int64_t D = x.size(-1), H = x.size(-2), M = lead_rows(x, 2, op);
  TORCH_CHECK(D % 2 == 0 && D <= ROPE_MAX_D, op, ": head size must be even and <= ", ROPE_MAX_D, ", got ", D);
  Apart io(op);
  io.write(x, "x");
  const char* names[] = {"cos", "sin"};
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& t = i ? sin : cos;
    check_tensor(t, op, names[i], x.scalar_type());
    TORCH_CHECK(t.dim() >= 1 && t.size(-1) == D && t.numel() == mul_sizes(M, D, op, "the rows x D"), op,
                ": cos and sin must be [M, D] = [", M, ", ", D, "] of x's dtype, got ", names[i], " ", t.sizes());
    io.read(t, names[i]);
  }
  io.check();
  const int isa = g_isa.load();
  if (isa == kScalar && x.scalar_type() == at::kHalf) return false;
  if (x.numel() == 0) return true;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* xp = static_cast<T*>(x.data_ptr());
    at::parallel_for(0, M, 64, [&](int64_t b, int64_t e) {  // a decode step's few rows run in the calling thread
      rope_for<T>(isa, xp + b * H * D, e - b, H, D, ptr<T>(cos) + b * D, ptr<T>(sin) + b * D);
    });
  });
  return true;
}

bool decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t length,
                      const std::optional<at::Tensor>& head_mask, int64_t group_heads, at::Tensor& out) {
  const char* op = "wide_cpu::decode_attention";
  check_act(q, op, "q");
  check_tensor(out, op, "out", q.scalar_type());
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.dim() == 4, op, ": q and out [B, Hq, D], k and v [B, Hk, L, D]");
  check_shape(out, q.sizes(), op, "out (q's shape)");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hk = k.size(1);
  TORCH_CHECK(Hk > 0 && Hq % Hk == 0 && length > 0 && D <= 512, op, ": bad heads, length or head size (Hq ", Hq,
              ", Hk ", Hk, ", length ", length, ", D ", D, ")");
  Apart io(op);
  io.read(q, "q"), io.write(out, "out");
  const char* names[] = {"k", "v"};
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& t = i ? v : k;
    check_tensor(t, op, names[i], q.scalar_type(), true);
    TORCH_CHECK(t.size(0) == B && t.size(1) == Hk && t.size(3) == D && t.size(2) >= length &&
                    (t.stride(3) == 1 || D <= 1) && (t.stride(2) == D || t.size(2) <= 1 || D == 0),
                op, ": k / v must be [B, Hk, >= length, D] of q's dtype, rows contiguous, got ", names[i], " ",
                t.sizes(), " strides ", t.strides());
    io.read(t, names[i]);
  }
  if (head_mask && head_mask->defined()) {
    check_tensor(*head_mask, op, "head_mask", at::kInt);
    TORCH_CHECK(group_heads > 0 && Hq % group_heads == 0 &&
                    head_mask->numel() == mul_sizes(B, Hq / group_heads, op, "the rows x head groups"), op,
                ": head_mask must be int32 [B, Hq / group_heads], got ", head_mask->sizes(), " and group_heads ",
                group_heads);
    io.read(*head_mask, "head_mask");
  }
  io.check();
  if (!attention_runs(D)) return false;
  if (out.numel() == 0) return true;
  const AttnShape a{B, Hq, Hk, length, D, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                    static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)))};
  by_dtype(q, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    decode_attention_impl<T>(ptr<T>(q), ptr<T>(k), ptr<T>(v), static_cast<T*>(out.data_ptr()), a,
                             head_mask && head_mask->defined() ? head_mask->data_ptr<int32_t>() : nullptr,
                             group_heads);
  });
  return true;
}

void router(const at::Tensor& h, const at::Tensor& wc, const at::Tensor& bc, const at::Tensor& wr,
            const at::Tensor& br, at::Tensor& mask) {
  const char* op = "wide_cpu::router";
  check_act(h, op, "h");
  const int64_t H = h.size(-1), M = lead_rows(h, 1, op);
  Apart io(op);
  io.read(h, "h");
  const char* names[] = {"wc", "bc", "wr", "br"};
  const at::Tensor* ts[] = {&wc, &bc, &wr, &br};
  for (int i = 0; i < 4; ++i) check_tensor(*ts[i], op, names[i], at::kFloat), io.read(*ts[i], names[i]);
  TORCH_CHECK(wc.dim() == 2 && wr.dim() == 2, op, ": wc [R, H], bc [R], wr [2G, R], br [2G]");
  const int64_t R = wc.size(0), G = wr.size(0) / 2;
  TORCH_CHECK(wc.size(1) == H && bc.numel() == R && wr.size(1) == R && wr.size(0) == 2 * G && br.numel() == 2 * G,
              op, ": wc [R, H], bc [R], wr [2G, R], br [2G] with H = ", H, ", got ", wc.sizes(), ", ", bc.sizes(), ", ",
              wr.sizes(), ", ", br.sizes());
  check_tensor(mask, op, "mask", at::kInt);
  TORCH_CHECK(mask.numel() == mul_sizes(M, G, op, "the rows x groups"), op, ": mask must be int32 [M, G] = [", M,
              ", ", G, "], got ", mask.sizes());
  io.write(mask, "mask");
  io.check();
  if (mask.numel() == 0) return;
  const at::Tensor hf = h.scalar_type() == at::kFloat ? h : h.to(at::kFloat);
  router_impl(ptr<float>(hf), M, H, ptr<float>(wc), ptr<float>(bc), R, ptr<float>(wr), ptr<float>(br), G,
              mask.data_ptr<int32_t>());
}

// ---------------------------------------------------------------------------------------------------------
// A decode step (model/modeling.py WideForCausalLM.forward for one new token a row: DecoderLayer.forward of each
// layer in turn, the final RMSNorm, the LM head) in one call. Op by op, a float16 decode step spent about a
// quarter of its time in Python and dispatch between the ops above (Python run between kernels that stream the
// weights runs with cold caches). The same kernels in the same order with the same roundings, per layer:
//   mask_a = router_attention(h); x = rms_norm(h); q = gemm_n(x, wq, mask_a) + bq; k, v = x W^T + b (dense);
//   q, k = q_norm(q), k_norm(k) (Qwen3); rope(q, k); the cache's row `length` = k, v;
//   o = decode attention over length + 1 positions (skipped heads 0); h1 = h + o W_o (gemm_kt over mask_a);
//   mask_f = router_ffn(h1); y = gated(rms_norm(h1), mask_f); out = h1 + y W_d (gemm_kt over mask_f).
// A layer without a router runs that sublayer dense, through the same kernels with one group every token
// executes (an unrouted FFN's silu(gate) * up rounded once, as the kernels do; the reference's torch ops round
// each). Weights, per layer (DecoderLayer's order, cpu/step.py): ln1, wq, bq?, wk, bk?, wv, bv?, q_norm?, k_norm?,
// wo, bo?, ln2, wg, wu, wd, then the attention router's wc, bc, wr, br and the FFN router's (absent where the
// layer has none); a routed wo / wd is W^T [K, N] (cpu/model.py: prepare), an unrouted one [N, K]. geo, per
// layer: Hq, Hk, D, attention group heads (0: no router), FFN group size (0: no router), force (every group
// executes). Needs the decode attention (AVX-512, or AVX2 for a head size of 8s): false (nothing written) else.
constexpr int LAYER_WEIGHTS = 23, LAYER_GEO = 6;
struct LayerShape {
  int64_t B, H, Hq, Hk, D, F, gh, gs;
};

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
void routed_mask(const T* h, const LayerShape& s, const at::Tensor* r /* wc, bc, wr, br in a row */, int64_t G, bool force, float* hf,
                 int32_t* mask) {
  if (force) {
    std::fill(mask, mask + s.B * G, 1);
    return;
  }
  const float* hp = reinterpret_cast<const float*>(h);
  if (!std::is_same_v<T, float>) {
    for (int64_t i = 0; i < s.B * s.H; ++i) hf[i] = load1(h + i);
    hp = hf;
  }
  router_impl(hp, s.B, s.H, ptr<float>(r[0]), ptr<float>(r[1]), r[0].size(0), ptr<float>(r[2]), ptr<float>(r[3]), G,
              mask);
}

template <typename T>
void add_rows(const T* a, const T* b, T* out, int64_t n) {  // as torch adds in T: float sum, rounded once
  for (int64_t i = 0; i < n; ++i) put(out + i, load1(a + i) + load1(b + i));
}

template <typename T>
void decode_layer_impl(const T* h, T* out, const std::vector<const at::Tensor*>& w, T* ck, T* cv, int64_t ckb,
                       int64_t ckh, int64_t length, const T* cos, const T* sin, float eps, const LayerShape& s,
                       bool force) {
  enum { LN1, WQ, BQ, WK, BK, WV, BV, QN, KN, WO, BO, LN2, WG, WU, WD, RA, RF = RA + 4 };
  auto b = [&](int i) { return w[i] ? ptr<T>(*w[i]) : nullptr; };
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

  const int isa = g_isa.load();
  const auto norm_row = rms_norm_row_for<T>(isa);
  auto norm_rows = [&](const T* in, const T* wt, T* dst, int64_t rows, int64_t n) {
    for (int64_t m = 0; m < rows; ++m) norm_row(in + m * n, wt, dst + m * n, n, eps);
  };
  auto dense = [&](const T* in, const T* wt, const T* bias, T* dst, int64_t N, int64_t K) {
    gemm_n_impl<T>(in, wt, ones, bias, dst, Geometry{B, N, K, 1, N});
  };

  // attention
  if (s.gh) routed_mask<T>(h, s, w[RA], ga, force, hf, ma);
  norm_rows(h, b(LN1), x, B, H);
  if (s.gh) gemm_n_impl<T>(x, b(WQ), ma, b(BQ), q, Geometry{B, NQ, H, ga, s.gh * s.D});
  else dense(x, b(WQ), b(BQ), q, NQ, H);
  dense(x, b(WK), b(BK), k, NK, H);
  dense(x, b(WV), b(BV), v, NK, H);
  if (w[QN]) {
    norm_rows(q, b(QN), q, B * s.Hq, s.D);
    norm_rows(k, b(KN), k, B * s.Hk, s.D);
  }
  for (int64_t r = 0; r < B; ++r) {
    rope_for<T>(isa, q + r * NQ, 1, s.Hq, s.D, cos + r * s.D, sin + r * s.D);
    rope_for<T>(isa, k + r * NK, 1, s.Hk, s.D, cos + r * s.D, sin + r * s.D);
    for (int64_t kh = 0; kh < s.Hk; ++kh) {
      std::memcpy(ck + r * ckb + kh * ckh + length * s.D, k + (r * s.Hk + kh) * s.D, s.D * sizeof(T));
      std::memcpy(cv + r * ckb + kh * ckh + length * s.D, v + (r * s.Hk + kh) * s.D, s.D * sizeof(T));
    }
  }
  const AttnShape a{B, s.Hq, s.Hk, length + 1, s.D, ckb, ckh, ckb, ckh,
                    static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.D)))};
  decode_attention_impl<T>(q, ck, cv, o, a, s.gh ? ma : nullptr, s.gh ? s.gh : 1);
  if (s.gh) gemm_kt_impl<T>(o, b(WO), ma, b(BO), part, Geometry{B, H, NQ, ga, s.gh * s.D});
  else dense(o, b(WO), b(BO), part, H, NQ);
  add_rows<T>(h, part, h1, B * H);

  // FFN
  if (s.gs) routed_mask<T>(h1, s, w[RF], gf, force, hf, mf);
  norm_rows(h1, b(LN2), x, B, H);
  gemm_n_impl<T>(x, b(WG), s.gs ? mf : ones, nullptr, y, Geometry{B, s.F, H, gf, s.gs ? s.gs : s.F}, b(WU));
  if (s.gs) gemm_kt_impl<T>(y, b(WD), mf, nullptr, part, Geometry{B, H, s.F, gf, s.gs});
  else dense(y, b(WD), nullptr, part, H, s.F);
  add_rows<T>(h1, part, out, B * H);
}

// One layer's weights (23 from `weights`' entry `base` on, some absent) and caches checked against h and geo; its
// shape. held / w: the tensors and pointers to them (absent: null), w[RA .. RA + 3] adjacent in held. Every tensor
// is listed in io (the caches written).
LayerShape check_layer(const at::Tensor& h, const c10::List<std::optional<at::Tensor>>& weights, int64_t base,
                       const at::Tensor& ck, const at::Tensor& cv, int64_t length, const int64_t* geo,
                       std::vector<at::Tensor>& held, std::vector<const at::Tensor*>& w, Apart& io, int64_t layer) {
  const char* op = "wide_cpu::decode_step";
  const int64_t H = h.size(-1), B = h.numel() / H;  // H > 0: decode_step
  const int64_t Hq = geo[0], Hk = geo[1], D = geo[2], gh = geo[3], gs = geo[4];
  held.assign(LAYER_WEIGHTS, at::Tensor());
  w.assign(LAYER_WEIGHTS, nullptr);
  for (int i = 0; i < LAYER_WEIGHTS; ++i) {
    const std::optional<at::Tensor> t = weights.get(base + i);
    if (t && t->defined()) held[i] = *t, w[i] = &held[i];
  }
  const auto want = [&](int i, std::initializer_list<int64_t> shape, bool router = false) {
    TORCH_CHECK(w[i], op, ": weight ", i, " of a layer is required");
    const at::Tensor& t = *w[i];
    check_tensor(t, op, "a layer's weight", router ? at::kFloat : h.scalar_type());
    TORCH_CHECK(t.sizes().equals(shape), op, ": weight ", i, " of a layer must be contiguous ",
                router ? "float32" : "of h's dtype", " ", at::IntArrayRef(shape), ", got ", t.sizes());
  };
  TORCH_CHECK(Hq > 0 && Hk > 0 && Hq % Hk == 0 && D > 0 && D % 2 == 0 && D <= 512 && gh >= 0 && gs >= 0, op,
              ": bad heads, head size or group sizes (geo ", at::IntArrayRef(geo, LAYER_GEO), ")");
  TORCH_CHECK(w[12] && w[12]->dim() == 2, op, ": a layer's gate weight is missing");
  const int64_t NQ = mul_sizes(Hq, D, op, "heads x head size"), NK = mul_sizes(Hk, D, op, "KV heads x head size");
  const int64_t F = w[12]->size(0);
  TORCH_CHECK(!gh || Hq % gh == 0, op, ": the attention group heads must divide the heads");
  TORCH_CHECK(!gs || F % gs == 0, op, ": the FFN group size must divide the FFN size");
  want(0, {H}), want(1, {NQ, H}), want(3, {NK, H}), want(5, {NK, H}), want(11, {H}), want(12, {F, H}), want(13, {F, H});
  for (int i : {2, 4, 6})
    if (w[i]) want(i, {i == 2 ? NQ : NK});
  TORCH_CHECK(!w[7] == !w[8], op, ": q_norm and k_norm come together");
  if (w[7]) want(7, {D}), want(8, {D});
  if (gh) want(9, {NQ, H}); else want(9, {H, NQ});  // routed: W^T [K, N]
  if (w[10]) want(10, {H});
  if (gs) want(14, {F, H}); else want(14, {H, F});
  for (int r : {15, 19}) {
    const int64_t G = r == 15 ? (gh ? Hq / gh : 0) : (gs ? F / gs : 0);
    if (!G) continue;
    TORCH_CHECK(w[r] && w[r]->dim() == 2, op, ": a layer's router is missing");
    const int64_t R = w[r]->size(0);
    want(r, {R, H}, true), want(r + 1, {R}, true), want(r + 2, {2 * G, R}, true), want(r + 3, {2 * G}, true);
  }
  // the layer's scratch (decode_layer_impl: Arena), in 64 bits
  const int64_t ga = gh ? Hq / gh : 1, gf = gs ? F / gs : 1;
  mul_sizes(B, 4 * H + 2 * NQ + 2 * NK + F + 1 + ga + gf, op, "the rows x a layer's scratch");
  for (const at::Tensor* t : {&ck, &cv}) {
    const char* name = t == &ck ? "cache_k" : "cache_v";
    check_tensor(*t, op, name, h.scalar_type(), true);
    TORCH_CHECK(t->dim() == 4 && t->size(0) == B && t->size(1) == Hk && t->size(3) == D && t->stride(3) == 1 &&
                    t->stride(2) == D && t->strides().equals(ck.strides()),
                op, ": caches must be [B, Hk, capacity, D] of h's dtype, rows contiguous, k and v alike, got ", name,
                " ", t->sizes(), " strides ", t->strides());
    TORCH_CHECK(length >= 0 && length < t->size(2), op, ": ", name, " is full (", length, " positions of ",
                t->size(2), ")");
    TORCH_CHECK(at::has_internal_overlap(*t) != at::MemOverlap::Yes, op, ": ", name,
                " has positions that share memory (an expanded tensor)");
    io.write(*t, name, layer);
  }
  for (int i = 0; i < LAYER_WEIGHTS; ++i)
    if (w[i]) io.read(*w[i], "weights", base + i);
  return LayerShape{B, H, Hq, Hk, D, F, gh, gs};
}

bool decode_step(const at::Tensor& h, const c10::List<std::optional<at::Tensor>>& weights,
                 at::TensorList cache_k, at::TensorList cache_v, int64_t length, const at::Tensor& cos,
                 const at::Tensor& sin, double eps, at::IntArrayRef geo, const at::Tensor& norm_w,
                 const at::Tensor& head_w, at::Tensor& out) {
  const char* op = "wide_cpu::decode_step";
  check_act(h, op, "h");
  const int64_t H = h.size(-1), B = lead_rows(h, 1, op);
  TORCH_CHECK(H > 0 && B > 0 && B <= INT32_MAX, op, ": h must be [B, 1, H] with B, H > 0, got ", h.sizes());
  const int64_t L = static_cast<int64_t>(cache_k.size());
  TORCH_CHECK(L > 0 && static_cast<int64_t>(cache_v.size()) == L && static_cast<int64_t>(weights.size()) ==
                  LAYER_WEIGHTS * L && static_cast<int64_t>(geo.size()) == LAYER_GEO * L,
              op, ": per layer ", LAYER_WEIGHTS, " weights (some absent), ", LAYER_GEO, " geometry ints, two caches");
  for (int l = 0; l < L; ++l) TORCH_CHECK(geo[LAYER_GEO * l + 2] == geo[2], op, ": one head size for all layers");
  Apart io(op);
  io.read(h, "h");
  const char* names[] = {"cos", "sin"};
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& t = i ? sin : cos;
    check_tensor(t, op, names[i], h.scalar_type());
    TORCH_CHECK(geo[2] > 0 && t.numel() == mul_sizes(B, geo[2], op, "the rows x head size"), op, ": ", names[i],
                " must be [B, D] of h's dtype, got ", t.sizes());
    io.read(t, names[i]);
  }
  check_tensor(norm_w, op, "norm_w", h.scalar_type());
  check_tensor(head_w, op, "head_w", h.scalar_type());
  TORCH_CHECK(norm_w.numel() == H && head_w.dim() == 2 && head_w.size(1) == H, op,
              ": the final norm [H] and the LM head [V, H] must be contiguous, of h's dtype, got ", norm_w.sizes(),
              " and ", head_w.sizes());
  const int64_t V = head_w.size(0);
  check_tensor(out, op, "out", h.scalar_type());
  TORCH_CHECK(out.numel() == mul_sizes(B, V, op, "the rows x vocabulary"), op, ": out must be [B, V] = [", B, ", ",
              V, "] of h's dtype, got ", out.sizes());
  io.read(norm_w, "norm_w"), io.read(head_w, "head_w"), io.write(out, "out");
  std::vector<std::vector<at::Tensor>> held(L);
  std::vector<std::vector<const at::Tensor*>> w(L);
  std::vector<LayerShape> shape(L);
  for (int64_t l = 0; l < L; ++l)
    shape[l] = check_layer(h, weights, LAYER_WEIGHTS * l, cache_k[l], cache_v[l], length, geo.data() + LAYER_GEO * l,
                           held[l], w[l], io, l);
  io.check();
  if (!attention_runs(geo[2])) return false;
  by_dtype(h, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto norm_row = rms_norm_row_for<T>(g_isa.load());
    thread_local std::vector<T> stream;  // the residual stream between layers, two buffers (grown once)
    stream.resize(static_cast<size_t>(3 * B * H));
    const T* src = ptr<T>(h);
    for (int64_t l = 0; l < L; ++l) {
      T* to = stream.data() + (l % 2) * B * H;
      decode_layer_impl<T>(src, to, w[l], static_cast<T*>(cache_k[l].data_ptr()), static_cast<T*>(cache_v[l].data_ptr()),
                           cache_k[l].stride(0), cache_k[l].stride(1), length, ptr<T>(cos), ptr<T>(sin),
                           static_cast<float>(eps), shape[l], geo[LAYER_GEO * l + 5] != 0);
      src = to;
    }
    T* normed = stream.data() + 2 * B * H;  // the final RMSNorm, then the LM head (one group every token executes)
    for (int64_t m = 0; m < B; ++m)
      norm_row(src + m * H, ptr<T>(norm_w), normed + m * H, H, static_cast<float>(eps));
    thread_local std::vector<int32_t> ones;
    ones.assign(B, 1);
    gemm_n_impl<T>(normed, ptr<T>(head_w), ones.data(), nullptr, static_cast<T*>(out.data_ptr()), Geometry{B, V, H, 1, V});
  });
  return true;
}

std::string isa() {
  std::string s = kIsaNames[g_isa.load()];
  if (g_isa.load() != detect()) s += std::string(" (of ") + kIsaNames[detect()] + ")";
  return s;
}

// Use a lower instruction set than the best this CPU has ("scalar", "avx2", "avx512", "avx512bf16"); returns
// the one in use before. Tests run every path the CPU can this way.
std::string set_isa(const std::string& name) {
  const std::string before = kIsaNames[g_isa.load()];
  for (int i = 0; i <= kAvx512Bf16; ++i) {
    if (name == kIsaNames[i]) {
      TORCH_CHECK(i <= detect(), "wide_cpu::set_isa: this CPU has no ", name, " (best: ", kIsaNames[detect()], ")");
      g_isa.store(i);
      return before;
    }
  }
  TORCH_CHECK(false, "wide_cpu::set_isa: unknown instruction set ", name);
  return before;
}

}  // namespace

TORCH_LIBRARY(wide_cpu, m) {
  m.def("gemm_n(Tensor x, Tensor w, Tensor mask, int group_size, Tensor? bias, Tensor(a!) out) -> ()");
  m.def("gated(Tensor x, Tensor w_gate, Tensor w_up, Tensor mask, int group_size, Tensor(a!) out) -> ()");
  m.def("gemm_k(Tensor x, Tensor w, Tensor mask, int group_size, Tensor? bias, Tensor(a!) out) -> ()");
  m.def("gemm_kt(Tensor x, Tensor wt, Tensor mask, int group_size, Tensor? bias, Tensor(a!) out) -> ()");
  m.def("rms_norm(Tensor x, Tensor w, float eps, Tensor(a!) out) -> bool");
  m.def("rope(Tensor(a!) x, Tensor cos, Tensor sin) -> bool");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, int length, Tensor? head_mask, int group_heads, "
        "Tensor(a!) out) -> bool");
  m.def("router(Tensor h, Tensor wc, Tensor bc, Tensor wr, Tensor br, Tensor(a!) mask) -> ()");
  m.def("decode_step(Tensor h, Tensor?[] weights, Tensor(a!)[] cache_k, Tensor(b!)[] cache_v, int length, "
        "Tensor cos, Tensor sin, float eps, int[] geo, Tensor norm_w, Tensor head_w, Tensor(c!) out) -> bool");
  m.def("isa() -> str", &isa);
  m.def("set_isa(str name) -> str", &set_isa);
}

TORCH_LIBRARY_IMPL(wide_cpu, CPU, m) {
  m.impl("gemm_n", &gemm_n);
  m.impl("gated", &gated);
  m.impl("gemm_k", &gemm_k);
  m.impl("gemm_kt", &gemm_kt);
  m.impl("rms_norm", &rms_norm);
  m.impl("rope", &rope);
  m.impl("router", &router);
  m.impl("decode_attention", &decode_attention);
  m.impl("decode_step", &decode_step);
}
