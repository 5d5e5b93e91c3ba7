// gemm_api.cu: the C entry points of the masked GEMMs and the mask layout:
// argument validation, workspace query and the choice of path:
//   M <= kGemvMaxRows        -> decode GEMV (skips inactive weight bytes)
//   fp16/bf16, aligned rows  -> tensor-core tiles (per-group tiles or dense
//                               tiles chosen on the device from the mask)
//   otherwise (fp32, odd)    -> plain SIMT tiles
#include "common.cuh"
#include "tc.h"

using namespace wide;

namespace {

constexpr int64_t kMax32 = 0x7fffffff;

bool valid_dtype(wide_dtype_t d) {
  return d == WIDE_FLOAT32 || d == WIDE_FLOAT16 || d == WIDE_BFLOAT16;
}

bool sizes_ok(const wide_gemm_params_t* p) {
  return p->M >= 0 && p->N >= 1 && p->K >= 1 && p->group_size >= 1 && p->num_groups >= 1 &&
         p->M <= kMax32 && p->N <= kMax32 && p->K <= kMax32;
}

int validate(const wide_gemm_params_t* p, Op op, KArgs* a) {
  if (p == nullptr) return WIDE_ERR_INVALID_ARGUMENT;
  if (!valid_dtype(p->dtype)) return WIDE_ERR_UNSUPPORTED_DTYPE;
  WIDE_REQUIRE(p->algo == WIDE_ALGO_AUTO || p->algo == WIDE_ALGO_DENSE ||
               p->algo == WIDE_ALGO_SPARSE);
  WIDE_REQUIRE(sizes_ok(p));
  const int64_t grouped = (op == OP_K) ? p->K : p->N;
  WIDE_REQUIRE(p->group_size * p->num_groups == grouped);
  WIDE_REQUIRE(p->ldx >= p->K && p->ldw >= p->K && p->ldy >= p->N && p->ldmask >= p->num_groups);
  WIDE_REQUIRE((op == OP_GATED) == (p->w2 != nullptr));
  WIDE_REQUIRE(op == OP_N || p->bias == nullptr);
  if (p->M > 0) WIDE_REQUIRE(p->x && p->w && p->mask && p->y);
  *a = KArgs{};
  a->M = static_cast<int>(p->M); a->N = static_cast<int>(p->N); a->K = static_cast<int>(p->K);
  a->gs = static_cast<int>(p->group_size); a->G = static_cast<int>(p->num_groups);
  a->x = p->x; a->ldx = p->ldx; a->w = p->w; a->w2 = p->w2; a->ldw = p->ldw; a->bias = p->bias;
  a->mask = p->mask; a->ldmask = p->ldmask; a->y = p->y; a->ldy = p->ldy;
  return WIDE_OK;
}

int run(const wide_gemm_params_t* p, Op op, void* workspace, size_t workspace_size,
        cudaStream_t stream) {
  KArgs a;
  const int rc = validate(p, op, &a);
  if (rc != WIDE_OK) return rc;
  if (a.M == 0) return WIDE_OK;
  const size_t need = wide_gemm_workspace_size(p);
  if (workspace_size < need || (need > 0 && workspace == nullptr)) return WIDE_ERR_WORKSPACE_TOO_SMALL;
  if (a.M <= kGemvMaxRows && (op != OP_K || a.G <= kGemvMaxGroupsK))
    return gemv(op, p->dtype, a, p->algo != WIDE_ALGO_DENSE, stream);
  if (tc_supported(op, p->dtype, a))
    return tc_gemm(op, p->dtype, a, p->layout, p->algo, workspace, workspace_size, stream);
  return simt_gemm(op, p->dtype, a, stream);
}

}  // namespace

extern "C" size_t wide_gemm_params_sizeof(void) { return sizeof(wide_gemm_params_t); }

extern "C" size_t wide_gemm_workspace_size(const wide_gemm_params_t* p) {
  if (p == nullptr || !sizes_ok(p)) return 0;
  return tc_workspace_size(p->M, p->N, p->K, p->num_groups);
}

extern "C" int wide_gemm_n(const wide_gemm_params_t* p, void* workspace, size_t workspace_size,
                           cudaStream_t stream) {
  return run(p, OP_N, workspace, workspace_size, stream);
}

extern "C" int wide_gemm_n_gated(const wide_gemm_params_t* p, void* workspace,
                                 size_t workspace_size, cudaStream_t stream) {
  return run(p, OP_GATED, workspace, workspace_size, stream);
}

extern "C" int wide_gemm_k(const wide_gemm_params_t* p, void* workspace, size_t workspace_size,
                           cudaStream_t stream) {
  return run(p, OP_K, workspace, workspace_size, stream);
}

extern "C" int64_t wide_layout_ints(int64_t M, int64_t G) {
  if (M < 0 || G < 1) return 0;
  return G + G * M;
}

extern "C" int wide_mask_layout(const int32_t* mask, int64_t ldmask, int64_t M, int64_t G,
                                int32_t* layout, cudaStream_t stream) {
  WIDE_REQUIRE(M >= 0 && G >= 1 && M <= kMax32 && G <= kMax32 && ldmask >= G);
  WIDE_REQUIRE(layout != nullptr && (M == 0 || mask != nullptr));
  return mask_layout(mask, ldmask, static_cast<int>(M), static_cast<int>(G), layout, stream);
}
