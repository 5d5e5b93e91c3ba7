// router.cu: WideRouter, fp32 weights and fp32 accumulation throughout so the
// decisions match the reference (flips only at near-ties).
// Fused path (R <= 64, the WIDE routers use R = 16..32): kernel 1 splits H
// over blocks (rows x H-slices, x read once, Wc slice staged in shared
// memory) and writes fp32 partial z; kernel 2 (a warp per row) sums the
// slices, adds bc, computes both logits of every group and writes the
// decision l0 >= l1 (ties execute). Deterministic: fixed summation order.
// Wider compressors fall back to two generic fp32 linears + a decision pass.
#include "common.cuh"
#include "internal.h"

namespace wide {
namespace {

__global__ void decide_kernel(const float* logits, int M, int G, int32_t* mask, int64_t ldmask) {
  const int64_t total = static_cast<int64_t>(M) * G;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / G, g = i % G;
    const float* l = logits + m * 2 * G + 2 * g;
    mask[m * ldmask + g] = l[0] >= l[1] ? 1 : 0;
  }
}

size_t align256(size_t v) { return (v + 255) & ~static_cast<size_t>(255); }

constexpr int kFusedMaxR = 64;
constexpr int kRowsPerBlock = 32, kSliceK = 32, kThreads = 256, kMaxSlices = 32;

// H-slice length (a multiple of kSliceK) and slice count: about four blocks
// per SM of a 132-SM part, each slice at least 256 wide.
void router_split(int64_t M, int64_t H, int64_t* slice, int64_t* splits) {
  const int64_t rowblocks = ceil_div(M, kRowsPerBlock);
  int64_t s = ceil_div(528, rowblocks);
  const int64_t by_h = H / 256 > 1 ? H / 256 : 1;
  s = s < by_h ? s : by_h;
  s = s < kMaxSlices ? s : kMaxSlices;
  s = s > 1 ? s : 1;
  *slice = ceil_div(ceil_div(H, s), kSliceK) * kSliceK;
  *splits = ceil_div(H, *slice);
}

template <typename TX>
__global__ void __launch_bounds__(kThreads)
router_partial_kernel(const TX* x, int64_t ldx, int M, int H, const float* wc, int R, int slice,
                      float* partial) {
  constexpr int kPairs = kRowsPerBlock * kFusedMaxR / kThreads;  // (row, r) outputs per thread
  __shared__ float xs[kRowsPerBlock][kSliceK + 1];
  __shared__ float ws[kFusedMaxR][kSliceK + 1];
  const int tid = threadIdx.x;
  const int m0 = blockIdx.x * kRowsPerBlock, split = blockIdx.y;
  const int h0 = split * slice, h1 = min(H, h0 + slice);
  float acc[kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) acc[i] = 0.0f;
  for (int k0 = h0; k0 < h1; k0 += kSliceK) {
#pragma unroll
    for (int j = 0; j < kRowsPerBlock * kSliceK / kThreads; ++j) {
      const int e = tid + j * kThreads, row = e / kSliceK, kk = e % kSliceK;
      const int m = m0 + row, k = k0 + kk;
      xs[row][kk] = (m < M && k < h1) ? to_f32(x[m * ldx + k]) : 0.0f;
    }
    for (int e = tid; e < R * kSliceK; e += kThreads) {
      const int r = e / kSliceK, kk = e % kSliceK, k = k0 + kk;
      ws[r][kk] = k < h1 ? wc[static_cast<int64_t>(r) * H + k] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const int p = tid + i * kThreads;
      if (p < kRowsPerBlock * R) {
        const int row = p / R, r = p % R;
        float a = acc[i];
#pragma unroll 8
        for (int kk = 0; kk < kSliceK; ++kk) a = fmaf(xs[row][kk], ws[r][kk], a);
        acc[i] = a;
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int p = tid + i * kThreads;
    const int row = p / R, r = p % R;
    if (p < kRowsPerBlock * R && m0 + row < M)
      partial[(static_cast<int64_t>(split) * M + m0 + row) * R + r] = acc[i];
  }
}

__global__ void __launch_bounds__(kThreads)
router_finish_kernel(const float* partial, int splits, int M, int R, const float* bc, const float* wr,
                     const float* br, int G, int32_t* mask, int64_t ldmask) {
  __shared__ float zs[kThreads / 32][kFusedMaxR];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int m = blockIdx.x * (kThreads / 32) + warp; m < M; m += gridDim.x * (kThreads / 32)) {
    for (int r = lane; r < R; r += 32) {
      float z = bc[r];
      for (int s = 0; s < splits; ++s) z += partial[(static_cast<int64_t>(s) * M + m) * R + r];
      zs[warp][r] = z;
    }
    __syncwarp();
    for (int g = lane; g < G; g += 32) {
      const float* w0 = wr + static_cast<int64_t>(2 * g) * R;
      const float* w1 = w0 + R;
      float l0 = br[2 * g], l1 = br[2 * g + 1];
      for (int r = 0; r < R; ++r) {
        l0 = fmaf(zs[warp][r], w0[r], l0);
        l1 = fmaf(zs[warp][r], w1[r], l1);
      }
      mask[m * ldmask + g] = l0 >= l1 ? 1 : 0;
    }
    __syncwarp();
  }
}

template <typename TX>
int router_fused(const void* x, int64_t ldx, int M, int H, const float* wc, const float* bc, int R,
                 const float* wr, const float* br, int G, int32_t* mask, int64_t ldmask,
                 float* partial, cudaStream_t stream) {
  int64_t slice, splits;
  router_split(M, H, &slice, &splits);
  const int64_t rowblocks = ceil_div(M, kRowsPerBlock);
  if (rowblocks > 0x7fffffff || splits > 65535) return WIDE_ERR_INVALID_ARGUMENT;
  router_partial_kernel<TX><<<dim3(static_cast<unsigned>(rowblocks), static_cast<unsigned>(splits)),
                              kThreads, 0, stream>>>(static_cast<const TX*>(x), ldx, M, H, wc, R,
                                                     static_cast<int>(slice), partial);
  WIDE_LAUNCHED();
  const int64_t blocks = ceil_div(M, kThreads / 32);
  router_finish_kernel<<<static_cast<unsigned>(blocks < 16384 ? blocks : 16384), kThreads, 0, stream>>>(
      partial, static_cast<int>(splits), M, R, bc, wr, br, G, mask, ldmask);
  WIDE_LAUNCHED();
  return WIDE_OK;
}

int linear(wide_dtype_t dtype, const KArgs& a, cudaStream_t stream) {
  if (a.M <= kGemvMaxRows) return gemv(OP_LIN, dtype, a, false, stream);
  return simt_gemm(OP_LIN, dtype, a, stream);
}

}  // namespace
}  // namespace wide

using namespace wide;

extern "C" size_t wide_router_workspace_size(int64_t M, int64_t H, int64_t R, int64_t G) {
  if (M <= 0 || H <= 0 || R <= 0 || G <= 0) return 0;
  if (R <= kFusedMaxR) {  // partial z; sized for every row count <= M (monotonic in M)
    const int64_t rows = max_splits_times_rows(M, 1, kMaxSlices, [&](int64_t m) {
      int64_t slice, splits;
      router_split(m, H, &slice, &splits);
      return splits;
    });
    return align256(sizeof(float) * static_cast<size_t>(rows * R));
  }
  return align256(sizeof(float) * static_cast<size_t>(M * R)) +
         align256(sizeof(float) * static_cast<size_t>(M * 2 * G));
}

extern "C" int wide_router(const void* x, int64_t ldx, wide_dtype_t dtype, int64_t M, int64_t H,
                           const float* wc, const float* bc, int64_t R, const float* wr,
                           const float* br, int64_t G, int32_t* mask, int64_t ldmask,
                           void* workspace, size_t workspace_size, cudaStream_t stream) {
  if (dtype != WIDE_FLOAT32 && dtype != WIDE_FLOAT16 && dtype != WIDE_BFLOAT16)
    return WIDE_ERR_UNSUPPORTED_DTYPE;
  const int64_t kMax = 0x7fffffff;
  WIDE_REQUIRE(M >= 0 && H >= 1 && R >= 1 && G >= 1);
  WIDE_REQUIRE(M <= kMax && H <= kMax && R <= kMax && 2 * G <= kMax);
  WIDE_REQUIRE(ldx >= H && ldmask >= G);
  if (M == 0) return WIDE_OK;
  WIDE_REQUIRE(x && wc && bc && wr && br && mask);
  const size_t need = wide_router_workspace_size(M, H, R, G);
  if (workspace == nullptr || workspace_size < need) return WIDE_ERR_WORKSPACE_TOO_SMALL;

  if (R <= kFusedMaxR) {
    const int m = static_cast<int>(M), h = static_cast<int>(H), r = static_cast<int>(R);
    const int g = static_cast<int>(G);
    float* partial = static_cast<float*>(workspace);
    return dispatch_dtype(dtype, [&](auto t) -> int {
      return router_fused<decltype(t)>(x, ldx, m, h, wc, bc, r, wr, br, g, mask, ldmask, partial, stream);
    });
  }

  float* z = static_cast<float*>(workspace);
  float* logits = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) +
                                           align256(sizeof(float) * static_cast<size_t>(M * R)));
  KArgs s1{};
  s1.M = static_cast<int>(M); s1.N = static_cast<int>(R); s1.K = static_cast<int>(H);
  s1.gs = 1; s1.G = 1;
  s1.x = x; s1.ldx = ldx; s1.w = wc; s1.ldw = H; s1.bias = bc; s1.y = z; s1.ldy = R;
  int rc = linear(dtype, s1, stream);
  if (rc != WIDE_OK) return rc;

  KArgs s2 = s1;
  s2.N = static_cast<int>(2 * G); s2.K = static_cast<int>(R);
  s2.x = z; s2.ldx = R; s2.w = wr; s2.ldw = R; s2.bias = br; s2.y = logits; s2.ldy = 2 * G;
  rc = linear(WIDE_FLOAT32, s2, stream);
  if (rc != WIDE_OK) return rc;

  const int64_t total = M * G;
  const int blocks = static_cast<int>(ceil_div(total, 256) < 4096 ? ceil_div(total, 256) : 4096);
  decide_kernel<<<blocks, 256, 0, stream>>>(logits, static_cast<int>(M), static_cast<int>(G), mask,
                                            ldmask);
  WIDE_LAUNCHED();
  return WIDE_OK;
}
