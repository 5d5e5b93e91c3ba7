// The K-pruned GEMM over the packed layout of pack_k (cpu/ops.py, which makes it): w is [G, C, group_size, KB] with
// C = N / KB, channel n = c * KB + j of group g's input k at [g][c][k][j]. A thread owns a range of chunks c and
// walks the executed groups one after the other: group g's part for its range is one contiguous stream, multiplied
// by broadcast activations into KB-wide vector sums (no horizontal reductions), kept per thread between groups.
// The block updates are the instruction set's (isa.h: axpy4, axpy4_tokens, axpy_block).
#include <ATen/Parallel.h>

#include "gemm.h"
#include "isa.h"

namespace wide_cpu {

template <typename T>
void gemm_k_packed_impl(const T* x, const T* w, const int32_t* mask, const T* bias, T* out, const Geometry& d) {
  const Kernels<T>& kern = kernels<T>();
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
          kern.axpy4(blk, d.gs, xg, acc);
          for (int j = 0; j < 4; ++j)
            std::memcpy(&buf[((cb + j * q + i - cb) * d.M + rows[0]) * KB], acc[j], sizeof acc[j]);
        }
        c_done = cb + 4 * q;
      } else if (nrows > 1 && ce - cb >= 4 && kern.axpy4_tokens) {
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
              kern.axpy4(blk, d.gs, xg[0], one);
              for (int j = 0; j < 4; ++j) std::memcpy(acc[j], one[j], sizeof one[j]);
            } else {
              kern.axpy4_tokens(blk, d.gs, xg, nm, acc);
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
          kern.axpy_block(blk, d.gs, xg, nm, acc);
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

template void gemm_k_packed_impl<float>(const float*, const float*, const int32_t*, const float*, float*,
                                        const Geometry&);
template void gemm_k_packed_impl<uint16_t>(const uint16_t*, const uint16_t*, const int32_t*, const uint16_t*,
                                           uint16_t*, const Geometry&);
template void gemm_k_packed_impl<c10::Half>(const c10::Half*, const c10::Half*, const int32_t*, const c10::Half*,
                                            c10::Half*, const Geometry&);

}  // namespace wide_cpu
