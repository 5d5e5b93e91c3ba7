// The masked projections: they read only the weights of the groups a token executes. M is any: each block of
// output channels reads its weight rows once for every 16 tokens of the call that execute its group (a group's rows
// only when some token executes it). The dot products and row updates are the instruction set's (isa.h: kernels<T>(),
// taken once a call). Threads: at::parallel_for, torch's intra-op pool (OpenMP), so torch.set_num_threads applies.
// No heap allocation on the decode path but the group plan's vectors and partial sums, kept per thread and grown once.
#include "gemm.h"

#include <ATen/Parallel.h>

#include "isa.h"

namespace wide_cpu {

namespace {

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

// The calling thread's buffer of every worker's partial sums (grown once), zeroed, taken before at::parallel_for
// (as call_plan)
std::vector<float>& call_partials(int64_t n) {
  thread_local std::vector<float> part;
  if (static_cast<int64_t>(part.size()) < n) part.resize(n);
  std::fill(part.begin(), part.begin() + n, 0.f);
  return part;
}

}  // namespace

Plan& call_plan(const int32_t* mask, int64_t M, int64_t G) {
  thread_local Plan plan;
  plan_groups(mask, M, G, plan);
  return plan;
}

// N-pruned: outputs of group g are channels [g*gs, (g+1)*gs); only executed groups' weight rows are read, once
// per call: each block of NR rows meets every token that executes its group, MT tokens at a time.
template <typename T>
void gemm_n_impl(const T* x, const T* w, const int32_t* mask, const T* bias, T* out, const Geometry& d,
                 const T* w2) {
  const auto dots = kernels<T>().dots;
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
  const auto dots = kernels<T>().dots;
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
          dots(wr, nr, xr, n_on, d.gs, part, 0);
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

// K-pruned over the transposed weight wt = W^T [K, N] (row-major): group g's weights are rows
// [g*gs, (g+1)*gs), one contiguous block, and the dense GEMM reads the same tensor (F.linear(x, wt.t())), so
// a caller keeps this one copy for decode and prefill alike. Threads split the executed groups (not the
// outputs): each streams its groups' blocks front to back, eight rows at a time, into its own [M, N] float32
// partial sums (an N-tile at a time when many tokens share a group, so they stay in cache); the partials are
// summed at the end.
constexpr int64_t KT_ACC_BYTES = 16 << 10;  // a pass's accumulators: about an L1 data cache
constexpr int64_t KT_ITEMS_PER_THREAD = 8;  // work items a thread takes on average (gemm_kt splits groups so)

template <typename T>
void gemm_kt_impl(const T* x, const T* wt, const int32_t* mask, const T* bias, T* out, const Geometry& d) {
  const auto rows_axpy = kernels<T>().rows_axpy;
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

#define WIDE_GEMMS(T)                                                                                      \
  template void gemm_n_impl<T>(const T*, const T*, const int32_t*, const T*, T*, const Geometry&, const T*); \
  template void gemm_k_impl<T>(const T*, const T*, const int32_t*, const T*, T*, const Geometry&);           \
  template void gemm_kt_impl<T>(const T*, const T*, const int32_t*, const T*, T*, const Geometry&);
WIDE_GEMMS(float)
WIDE_GEMMS(uint16_t)
WIDE_GEMMS(c10::Half)
#undef WIDE_GEMMS

}  // namespace wide_cpu
