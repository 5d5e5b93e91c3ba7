// wide_kernels.h: plain C launch functions for the WIDE ops (docs/opset.md).
//
// Contract for every launch function:
//  - all pointers are device pointers, all tensors row-major with an explicit
//    leading dimension (elements between consecutive rows);
//  - no allocation, no host synchronisation: temporary storage comes from the
//    caller's `workspace` of at least the size the matching *_workspace_size()
//    query returns (may be 0, then workspace may be NULL);
//  - the work is queued on `stream`; the return value reports argument errors
//    and launch errors only (WIDE_OK = 0). wide_status_string() explains it.
// The same functions back the TensorRT plugins and the Python (ctypes) wrappers.
#ifndef WIDE_KERNELS_H
#define WIDE_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WIDE_KERNELS_API_VERSION 1

typedef enum {
  WIDE_FLOAT32 = 0,
  WIDE_FLOAT16 = 1,
  WIDE_BFLOAT16 = 2
} wide_dtype_t;

typedef enum {
  WIDE_OK = 0,
  WIDE_ERR_INVALID_ARGUMENT = 1,
  WIDE_ERR_UNSUPPORTED_DTYPE = 2,
  WIDE_ERR_WORKSPACE_TOO_SMALL = 3,
  WIDE_ERR_CUDA = 4
} wide_status_t;

// Algorithm choice for the masked GEMMs. AUTO picks at run time (decode GEMV
// for small M, tile skipping for prefill, dense fallback when the active
// fraction of the tile grid is too high for skipping to pay).
typedef enum {
  WIDE_ALGO_AUTO = 0,
  WIDE_ALGO_DENSE = 1,   // dense compute, mask applied to the result / inputs
  WIDE_ALGO_SPARSE = 2   // always skip inactive work
} wide_algo_t;

const char* wide_status_string(int status);
int wide_kernels_api_version(void);
// Text of the CUDA error behind the calling thread's last WIDE_ERR_CUDA (added, compatible).
const char* wide_last_cuda_error_string(void);

// ---------------------------------------------------------------------------
// Router: mask[m, g] = (l[m, g, 0] >= l[m, g, 1]), l = (x Wc^T + bc) Wr^T + br,
// fp32 accumulation whatever the dtype of x. Router weights are float32.
//   x  [M, H] (dtype, ldx)    wc [R, H]   bc [R]   wr [2G, R]   br [2G]
//   mask [M, G] int32 (ldmask)
// Non-decreasing in M: the size for a maximum M also covers every smaller M
// (TensorRT sizes workspaces at the profile maximum).
size_t wide_router_workspace_size(int64_t M, int64_t H, int64_t R, int64_t G);
int wide_router(const void* x, int64_t ldx, wide_dtype_t dtype, int64_t M, int64_t H,
                const float* wc, const float* bc, int64_t R,
                const float* wr, const float* br, int64_t G,
                int32_t* mask, int64_t ldmask,
                void* workspace, size_t workspace_size, cudaStream_t stream);

// ---------------------------------------------------------------------------
// Mask reordering ("token layout"): for every group g, the rows m whose mask
// is on, packed first. Layout in one int32 buffer of wide_layout_ints(M, G):
//   counts[G]        number of active rows of group g
//   rows[G][M]       rows[g][0 .. counts[g]) are the active rows, ascending
// It can be computed once and passed to every GEMM sharing the mask
// (gate+up+down; q+o). The GEMMs accept layout == NULL and then build it
// themselves in their workspace.
int64_t wide_layout_ints(int64_t M, int64_t G);
int wide_mask_layout(const int32_t* mask, int64_t ldmask, int64_t M, int64_t G,
                     int32_t* layout, cudaStream_t stream);

// ---------------------------------------------------------------------------
// Masked GEMMs. Weights in nn.Linear layout [N, K] (ldw >= K).
typedef struct {
  int64_t M, N, K;
  int64_t group_size;            // channels per group: along N (gemm_n), along K (gemm_k)
  int64_t num_groups;            // G; N == G*group_size (gemm_n) or K == G*group_size (gemm_k)
  const void* x;  int64_t ldx;   // [M, K]
  const void* w;  int64_t ldw;   // [N, K]; gate weight for the gated op
  const void* w2;                // gated op: up weight [N, K] with the same ldw; else NULL
  const void* bias;              // gemm_n: [N] or NULL; must be NULL elsewhere
  const int32_t* mask; int64_t ldmask;  // [M, G] int32, 1 = execute
  const int32_t* layout;         // optional precomputed wide_mask_layout(), or NULL (gemm_k ignores it)
  void* y;        int64_t ldy;   // [M, N]
  wide_dtype_t dtype;            // of x, w, w2, bias and y
  wide_algo_t algo;
} wide_gemm_params_t;

// sizeof(wide_gemm_params_t) as compiled, so bindings can check their mirror (added, compatible).
size_t wide_gemm_params_sizeof(void);

// Workspace for any of the three GEMMs on these sizes (covers the layout).
// Non-decreasing in M: the size for a maximum M also covers every smaller M.
size_t wide_gemm_workspace_size(const wide_gemm_params_t* p);

// y[m, n] = (x[m] . w[n] + bias[n]) * mask[m, n / group_size]; skipped outputs are 0.
int wide_gemm_n(const wide_gemm_params_t* p, void* workspace, size_t workspace_size,
                cudaStream_t stream);
// y[m, n] = silu(x[m] . w[n]) * (x[m] . w2[n]) * mask[m, n / group_size].
int wide_gemm_n_gated(const wide_gemm_params_t* p, void* workspace, size_t workspace_size,
                      cudaStream_t stream);
// y[m, n] = sum_k x[m, k] * mask[m, k / group_size] * w[n, k]; skipped inputs ignored.
int wide_gemm_k(const wide_gemm_params_t* p, void* workspace, size_t workspace_size,
                cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif  // WIDE_KERNELS_H
