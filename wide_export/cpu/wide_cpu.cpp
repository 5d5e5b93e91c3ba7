// CPU kernels of the `wide` masked projections: they read only the weights of the groups a token executes.
//
//   wide_cpu::gemm_n(x, w, mask, group_size, bias?, out!)    out = (x W^T + b), skipped output groups 0
//   wide_cpu::gated(x, w_gate, w_up, mask, group_size, out!)  out = silu(x Wg^T) * (x Wu^T), skipped groups 0
//   wide_cpu::gemm_k(x, w, mask, group_size, bias?, out!)    out = x W^T + b over the executed input groups
//   wide_cpu::isa() -> str                                   the instruction set the kernels run with
//
// x [M, K] and w [N, K] (nn.Linear layout) are float32 or bfloat16 (the same dtype; out too), mask [M, G]
// int32, contiguous. Products in float32 (bf16 widened on load). M is any: each output channel block reads
// its weight rows once for every token of the call (a group's rows only when some token executes it).
// Threads: at::parallel_for, torch's intra-op pool (OpenMP), so torch.set_num_threads applies. No heap
// allocation but a per-thread buffer for bf16 activations, grown once. AVX2 + FMA when the CPU has them
// (checked at run time), else portable scalar code; both are always compiled.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int NR = 4;  // output channels per micro-kernel call

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

inline float bf16_to_float(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return bf16_to_float(*p); }

// ---------------------------------------------------------------------------------------------------------
// dot products of `nr` weight rows (w[r] + 0 .. len) with `nm` activation rows (x[m] + 0 .. len, float32),
// added to acc[r][m]. The AVX2 path keeps nr * nm accumulators in registers.
template <typename T>
void dots_scalar(const T* const* w, int nr, const float* const* x, int nm, int64_t len, float (*acc)[2]) {
  for (int r = 0; r < nr; ++r)
    for (int m = 0; m < nm; ++m) {
      float s = 0.f;
      for (int64_t k = 0; k < len; ++k) s += load1(w[r] + k) * x[m][k];
      acc[r][m] += s;
    }
}

__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"))) inline __m256 load8(const uint16_t* p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <typename T, int NRv, int NM>
__attribute__((target("avx2,fma"))) void dots_avx2_fixed(const T* const* w, const float* const* x, int64_t len,
                                                         float (*acc)[2]) {
  __m256 a[NRv][NM];
  for (int r = 0; r < NRv; ++r)
    for (int m = 0; m < NM; ++m) a[r][m] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    __m256 xv[NM];
    for (int m = 0; m < NM; ++m) xv[m] = _mm256_loadu_ps(x[m] + k);
    for (int r = 0; r < NRv; ++r) {
      __m256 wv = load8(w[r] + k);
      for (int m = 0; m < NM; ++m) a[r][m] = _mm256_fmadd_ps(wv, xv[m], a[r][m]);
    }
  }
  for (int r = 0; r < NRv; ++r)
    for (int m = 0; m < NM; ++m) {
      float s = hsum(a[r][m]);
      for (int64_t t = k; t < len; ++t) s += load1(w[r] + t) * x[m][t];
      acc[r][m] += s;
    }
}

template <typename T>
void dots(const T* const* w, int nr, const float* const* x, int nm, int64_t len, float (*acc)[2]) {
  if (!has_avx2()) return dots_scalar(w, nr, x, nm, len, acc);
  if (nr == NR && nm == 2) return dots_avx2_fixed<T, NR, 2>(w, x, len, acc);
  if (nr == NR && nm == 1) return dots_avx2_fixed<T, NR, 1>(w, x, len, acc);
  for (int r = 0; r < nr; ++r) {  // the last channels of a group
    const T* wr[1] = {w[r]};
    float one[1][2] = {{0.f, 0.f}};
    if (nm == 2) dots_avx2_fixed<T, 1, 2>(wr, x, len, one);
    else dots_avx2_fixed<T, 1, 1>(wr, x, len, one);
    for (int m = 0; m < nm; ++m) acc[r][m] += one[0][m];
  }
}

// ---------------------------------------------------------------------------------------------------------
// activations as float32 rows: float32 x is used in place, bf16 x is widened once into a per-thread buffer
template <typename T>
const float* as_float(const T* x, int64_t n);
template <>
const float* as_float<float>(const float* x, int64_t) { return x; }
template <>
const float* as_float<uint16_t>(const uint16_t* x, int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  for (int64_t i = 0; i < n; ++i) buf[i] = bf16_to_float(x[i]);
  return buf.data();
}

inline uint16_t to_bf16(float f) {  // round to nearest even, as torch
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (std::isnan(f)) return 0x7FC0;
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
inline void put(float* p, float v) { *p = v; }
inline void put(uint16_t* p, float v) { *p = to_bf16(v); }

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

// N-pruned: outputs of group g are channels [g*gs, (g+1)*gs); only executed groups' weight rows are read.
template <typename T>
void gemm_n_impl(const T* x, const T* w, const int32_t* mask, const T* bias, T* out, const Geometry& d,
                 const T* w2 = nullptr) {
  const bool gated = w2 != nullptr;
  // zero everything first (skipped groups, and rows that skip an executed group), then fill computed outputs
  at::parallel_for(0, d.M, 1, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m)
      for (int64_t n = 0; n < d.N; ++n) put(out + m * d.N + n, 0.f);
  });
  thread_local Plan tl_plan;  // the calling thread's; a lambda would see each worker's own thread_local
  Plan& plan = tl_plan;
  plan_groups(mask, d.M, d.G, plan);
  const int64_t blocks_per_group = (d.gs + NR - 1) / NR;
  const int64_t items = static_cast<int64_t>(plan.group.size()) * blocks_per_group;
  at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
    const float* xf = as_float<T>(x, d.M * d.K);  // per thread: its own buffer
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
      const int step = gated ? 1 : 2;
      for (int64_t i = 0; i < nrows; i += step) {
        const int nm = static_cast<int>(std::min<int64_t>(step, nrows - i));
        const float* xr[2] = {xf + rows[i] * d.K, nm > 1 ? xf + rows[i + 1] * d.K : nullptr};
        float acc[NR][2] = {};
        dots(wr, nr, xr, nm, d.K, acc);
        if (gated) {
          float up[NR][2] = {};
          dots(ur, nr, xr, nm, d.K, up);
          for (int r = 0; r < nr; ++r) put(out + rows[i] * d.N + n0 + r, silu(acc[r][0]) * up[r][0]);
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
// group g is read only when some token of the call executes g.
template <typename T>
void gemm_k_impl(const T* x, const T* w, const int32_t* mask, const T* bias, T* out, const Geometry& d) {
  thread_local Plan tl_plan;  // the calling thread's (see gemm_n_impl)
  Plan& plan = tl_plan;
  plan_groups(mask, d.M, d.G, plan);
  const int64_t items = (d.N + NR - 1) / NR;
  at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
    const float* xf = as_float<T>(x, d.M * d.K);
    for (int64_t it = b; it < e; ++it) {
      const int64_t n0 = it * NR;
      const int nr = static_cast<int>(std::min<int64_t>(NR, d.N - n0));
      for (int64_t m0 = 0; m0 < d.M; m0 += 2) {
        const int nm = static_cast<int>(std::min<int64_t>(2, d.M - m0));
        float acc[NR][2] = {};
        for (size_t gi = 0; gi < plan.group.size(); ++gi) {
          const int64_t g = plan.group[gi];
          const bool on0 = mask[m0 * d.G + g] != 0, on1 = nm > 1 && mask[(m0 + 1) * d.G + g] != 0;
          if (!on0 && !on1) continue;
          const T* wr[NR];
          for (int r = 0; r < nr; ++r) wr[r] = w + (n0 + r) * d.K + g * d.gs;
          if (on0 && on1) {
            const float* xr[2] = {xf + m0 * d.K + g * d.gs, xf + (m0 + 1) * d.K + g * d.gs};
            dots(wr, nr, xr, 2, d.gs, acc);
          } else {
            const int m = on0 ? 0 : 1;
            const float* xr[1] = {xf + (m0 + m) * d.K + g * d.gs};
            float one[NR][2] = {};
            dots(wr, nr, xr, 1, d.gs, one);
            for (int r = 0; r < nr; ++r) acc[r][m] += one[r][0];
          }
        }
        for (int m = 0; m < nm; ++m)
          for (int r = 0; r < nr; ++r)
            put(out + (m0 + m) * d.N + n0 + r, acc[r][m] + (bias ? load1(bias + n0 + r) : 0.f));
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------------------
Geometry check(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mask, int64_t group_size,
               const at::Tensor& out, bool k_pruned, const char* op) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && mask.dim() == 2 && out.dim() == 2, op, ": x, w, mask, out must be 2-D");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && mask.is_contiguous() && out.is_contiguous(), op,
              ": tensors must be contiguous");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), op, ": CPU tensors only");
  TORCH_CHECK(x.scalar_type() == w.scalar_type() && out.scalar_type() == x.scalar_type(), op,
              ": x, w and out must share a dtype");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, op, ": float32 or bfloat16 only");
  TORCH_CHECK(mask.scalar_type() == at::kInt, op, ": mask must be int32");
  Geometry d{x.size(0), w.size(0), x.size(1), mask.size(1), group_size};
  TORCH_CHECK(w.size(1) == d.K, op, ": w is [N, K] with K = x.size(1)");
  TORCH_CHECK(mask.size(0) == d.M && group_size > 0 && d.G * group_size == (k_pruned ? d.K : d.N), op,
              ": mask must be [M, G] with G * group_size = ", k_pruned ? "K" : "N");
  TORCH_CHECK(out.size(0) == d.M && out.size(1) == d.N, op, ": out must be [M, N]");
  return d;
}

template <typename F>
void by_dtype(const at::Tensor& x, F&& f) {
  if (x.scalar_type() == at::kFloat) f(static_cast<float*>(nullptr));
  else f(static_cast<uint16_t*>(nullptr));
}

template <typename T>
const T* ptr(const at::Tensor& t) { return static_cast<const T*>(t.data_ptr()); }

void gemm_n(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mask, int64_t group_size,
            const std::optional<at::Tensor>& bias, at::Tensor& out) {
  Geometry d = check(x, w, mask, group_size, out, false, "wide_cpu::gemm_n");
  TORCH_CHECK(!bias || (bias->numel() == d.N && bias->scalar_type() == x.scalar_type() && bias->is_contiguous()),
              "wide_cpu::gemm_n: bias must be [N] of x's dtype");
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemm_n_impl<T>(ptr<T>(x), ptr<T>(w), mask.data_ptr<int32_t>(), bias ? ptr<T>(*bias) : nullptr,
                   static_cast<T*>(out.data_ptr()), d);
  });
}

void gated(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up, const at::Tensor& mask,
           int64_t group_size, at::Tensor& out) {
  Geometry d = check(x, w_gate, mask, group_size, out, false, "wide_cpu::gated");
  TORCH_CHECK(w_up.sizes() == w_gate.sizes() && w_up.scalar_type() == w_gate.scalar_type() && w_up.is_contiguous(),
              "wide_cpu::gated: w_up must match w_gate");
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemm_n_impl<T>(ptr<T>(x), ptr<T>(w_gate), mask.data_ptr<int32_t>(), nullptr, static_cast<T*>(out.data_ptr()),
                   d, ptr<T>(w_up));
  });
}

void gemm_k(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mask, int64_t group_size,
            const std::optional<at::Tensor>& bias, at::Tensor& out) {
  Geometry d = check(x, w, mask, group_size, out, true, "wide_cpu::gemm_k");
  TORCH_CHECK(!bias || (bias->numel() == d.N && bias->scalar_type() == x.scalar_type() && bias->is_contiguous()),
              "wide_cpu::gemm_k: bias must be [N] of x's dtype");
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemm_k_impl<T>(ptr<T>(x), ptr<T>(w), mask.data_ptr<int32_t>(), bias ? ptr<T>(*bias) : nullptr,
                   static_cast<T*>(out.data_ptr()), d);
  });
}

std::string isa() {
  std::string s = has_avx2() ? "avx2+fma" : "scalar";
  s += __builtin_cpu_supports("f16c") ? " f16c" : "";
  s += __builtin_cpu_supports("avx512f") ? " avx512f" : "";
  s += __builtin_cpu_supports("avx512bf16") ? " avx512bf16" : "";
  return s;
}

}  // namespace

TORCH_LIBRARY(wide_cpu, m) {
  m.def("gemm_n(Tensor x, Tensor w, Tensor mask, int group_size, Tensor? bias, Tensor(a!) out) -> ()");
  m.def("gated(Tensor x, Tensor w_gate, Tensor w_up, Tensor mask, int group_size, Tensor(a!) out) -> ()");
  m.def("gemm_k(Tensor x, Tensor w, Tensor mask, int group_size, Tensor? bias, Tensor(a!) out) -> ()");
  m.def("isa() -> str", &isa);
}

TORCH_LIBRARY_IMPL(wide_cpu, CPU, m) {
  m.impl("gemm_n", &gemm_n);
  m.impl("gated", &gated);
  m.impl("gemm_k", &gemm_k);
}
