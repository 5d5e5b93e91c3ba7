// wide_kernels.h: plain C launch functions for the WIDE ops (docs/opset.md).
//
// The kernels are the OpenAI Triton kernels of wide_export/kernels/triton_kernels.py,
// compiled ahead of time (wide_export/kernels/aot.py) to cubins for the
// architectures of the build and launched through the CUDA driver API. The
// TensorRT plugins call these functions; Python calls the same kernels
// through Triton directly (wide_export.kernels).
//
// Contract for every launch function:
//  - all pointers are device pointers; tensors are contiguous row-major
//    (x [M, K], weights [N, K] in nn.Linear layout, mask [M, G] int32, y [M, N]);
//  - no allocation, no host synchronisation: temporary storage comes from the
//    caller's `workspace` of at least the size the *_workspace_size() query
//    returns (non-decreasing in M, so the size for a profile's maximum M
//    covers every smaller M);
//  - the work is queued on `stream`; the return value reports argument errors
//    and launch errors only (WIDE_OK = 0). wide_status_string() explains it.
#ifndef WIDE_KERNELS_H
#define WIDE_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WIDE_KERNELS_API_VERSION 5

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
  WIDE_ERR_CUDA = 4,
  WIDE_ERR_NO_KERNEL = 5   // no cubin for this GPU architecture / specialization in this build
} wide_status_t;

// The algorithms of the masked GEMMs (docs/kernels.md). AUTO follows the
// per-architecture thresholds of wide_export/kernels/policy.json.
typedef enum {
  WIDE_ALGO_AUTO = 0,
  WIDE_ALGO_GEMV = 1,     // per token, only the token's active weight bytes (decode)
  WIDE_ALGO_GROUPED = 2,  // per-group row lists + grouped GEMM (N) / scatter-add (K)
  WIDE_ALGO_TILE = 3,     // token-order tiles, mask in the epilogue / per-tile K-slice skipping
  WIDE_ALGO_DENSE = 4     // cuBLASLt on the full weights + one mask pass (builds with cuBLASLt only)
} wide_algo_t;

const char* wide_status_string(int status);
int wide_kernels_api_version(void);
// Text of the CUDA error behind the calling thread's last WIDE_ERR_CUDA.
const char* wide_last_cuda_error_string(void);
// Number of embedded cubins, and whether one exists for `key` at compute capability `arch` (e.g. 90).
int wide_kernels_cubin_count(void);
int wide_kernels_has_cubin(const char* key, int arch);
// 1 when this build has the cuBLASLt dense path and libcublasLt loads (AUTO's "dense" fallback runs it;
// otherwise the tile kernels).
int wide_kernels_has_cublaslt(void);

// Router: mask[m, g] = (l[m, g, 0] >= l[m, g, 1]), l = (x Wc^T + bc) Wr^T + br,
// float32 math whatever the dtype of x. Router weights are float32.
//   x [M, H]   wc [R, H]   bc [R]   wr [2G, R]   br [2G]   mask [M, G] int32.   R <= 256.
int wide_router(const void* x, wide_dtype_t dtype, int64_t M, int64_t H,
                const float* wc, const float* bc, int64_t R, const float* wr, const float* br, int64_t G,
                int32_t* mask, cudaStream_t stream);
// The same with a workspace: up to 64 tokens the compressor GEMM is split over many CTAs (decode),
// its float32 partials in the workspace; with less than wide_router_workspace_size(M, H, R) bytes the
// one-pass router runs (what wide_router does). The size is non-decreasing in M.
size_t wide_router_workspace_size(int64_t M, int64_t H, int64_t R);
int wide_router_ws(const void* x, wide_dtype_t dtype, int64_t M, int64_t H,
                   const float* wc, const float* bc, int64_t R, const float* wr, const float* br, int64_t G,
                   int32_t* mask, void* workspace, size_t workspace_size, cudaStream_t stream);

typedef struct {
  int64_t M, N, K;
  int64_t group_size;            // channels per group: along N (gemm_n), along K (gemm_k)
  const void* x;                 // [M, K]
  const void* w;                 // [N, K]; gate weight for the gated op
  const void* w2;                // gated op: up weight [N, K]; else NULL
  const void* bias;              // gemm_n, gemm_k: [N] or NULL; the gated op ignores it
  const int32_t* mask;           // [M, G] int32, 1 = execute
  void* y;                       // [M, N]
  wide_dtype_t dtype;            // of x, w, w2, bias and y
  wide_algo_t algo;
} wide_gemm_params_t;

size_t wide_gemm_params_sizeof(void);
// Workspace for the GEMM on these sizes (row lists of the grouped algorithm, float32 accumulator of
// the K-pruned scatter-add). Non-decreasing in M.
size_t wide_gemm_workspace_size(const wide_gemm_params_t* p);
// The algorithm AUTO resolves to on a device of compute capability `arch` by the architecture's policy entry
// (a GPU model's own entry: wide_gemm_describe_device); kind_k: 0 gemm_n, 1 gemm_k, 2 gated.
int wide_gemm_resolve_algo(const wide_gemm_params_t* p, int kind_k, int arch);

// The operations, for wide_gemm_describe.
typedef enum {
  WIDE_OP_GEMM_N = 0,        // wide_gemm_n
  WIDE_OP_GEMM_N_GATED = 1,  // wide_gemm_n_gated
  WIDE_OP_GEMM_K = 2         // wide_gemm_k
} wide_op_t;

// What the call of `op` with these arguments would launch on a device of compute capability `arch`,
// without touching CUDA (pointers are only compared, never dereferenced): one "key@variant grid=XxYxZ"
// per kernel ("memset BYTES" per memset), space-separated, written NUL-terminated into `out`.
// variant: "a16" = the cubin compiled assuming the call's pointers and dimensions (N, K, group_size,
// row stride) are multiples of 16 (vector loads, cp.async / TMA pipelines, as Triton's JIT specializes);
// "any" = the cubin that assumes nothing, launched whenever one of those is not a multiple of 16.
// Returns the status the launch would return for these arguments (WIDE_ERR_INVALID_ARGUMENT also
// when `out_size` is too small).
int wide_gemm_describe(const wide_gemm_params_t* p, int op, int arch, void* workspace, size_t workspace_size,
                       char* out, size_t out_size);
// As wide_gemm_describe, on a device named `device` (cuDeviceGetName's name, e.g. "NVIDIA H200", which the
// launches read from the current device): policy.json's "sm_<arch>@<device>" entry where the build has one,
// else the architecture's. NULL or "": as wide_gemm_describe (API version 4).
int wide_gemm_describe_device(const wide_gemm_params_t* p, int op, int arch, const char* device, void* workspace,
                              size_t workspace_size, char* out, size_t out_size);

// y[m, n] = (x[m] . w[n] + bias[n]) * mask[m, n / group_size]; skipped outputs are 0.
int wide_gemm_n(const wide_gemm_params_t* p, void* workspace, size_t workspace_size, cudaStream_t stream);
// y[m, n] = silu(x[m] . w[n]) * (x[m] . w2[n]) * mask[m, n / group_size].
int wide_gemm_n_gated(const wide_gemm_params_t* p, void* workspace, size_t workspace_size, cudaStream_t stream);
// y[m, n] = sum_k x[m, k] * mask[m, k / group_size] * w[n, k] (+ bias[n], every output); skipped inputs ignored.
int wide_gemm_k(const wide_gemm_params_t* p, void* workspace, size_t workspace_size, cudaStream_t stream);

// WideMaskedAttention (docs/opset.md) under the op's causal contract (allowed is 0 after each query's position
// S - T + t; those keys are not scored): y = softmax(q k^T / sqrt(D), keys not allowed at float32's lowest) v, a
// row allowed no key the mean of v over all S keys, and y[b, h, t] = 0 where head_mask[b, t, h / group_heads]
// is 0. All tensors contiguous; q, k, v and y of `dtype`; D <= 128, and a multiple of 16 when T > 1. API version 5.
// T > 1 (prefill): tiles of 64 queries x one head; a tile none of whose queries keeps h's group computes nothing.
// T == 1 (decode, Hq / Hk <= 16): one program per (sequence, KV head, split of the keys) over the KV head's active
// query heads, so a KV head none of whose query heads is active reads no key; split over the keys to fill the GPU
// when the workspace holds the float32 partials (wide_masked_attention_workspace_size at the largest B and S),
// else one split.
typedef struct {
  int64_t B, Hq, Hk, T, S, D;     // S >= T: the past and the new keys
  int64_t group_heads;            // query heads per attention group; Hq % group_heads == 0, Hq % Hk == 0
  const void* q;                  // [B, Hq, T, D]
  const void* k;                  // [B, Hk, S, D]
  const void* v;                  // [B, Hk, S, D]
  const uint8_t* allowed;         // [B, 1, T, S], 1 byte each (TensorRT bool), 0 = not allowed
  const int32_t* head_mask;       // [B, T, Hq / group_heads], 1 = the group executes
  void* y;                        // [B, Hq, T, D]
  wide_dtype_t dtype;
} wide_attention_params_t;

size_t wide_attention_params_sizeof(void);
// Workspace for every call with at most p's B and S (p's other sizes; its pointers may be NULL); 0 when none splits.
size_t wide_masked_attention_workspace_size(const wide_attention_params_t* p);
// What wide_masked_attention would launch on compute capability `arch` ("key@variant grid=XxYxZ" per launch,
// space-separated), without CUDA.
int wide_masked_attention_describe(const wide_attention_params_t* p, int arch, void* workspace, size_t workspace_size,
                                   char* out, size_t out_size);
int wide_masked_attention(const wide_attention_params_t* p, void* workspace, size_t workspace_size,
                          cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif  // WIDE_KERNELS_H
