// The masked GEMMs over the groups a call's tokens execute (gemm.cpp; pack_k's layout: repack.cpp), on checked
// pointers (bindings.cpp checks the tensors). x [M, K] and the weights of one dtype T, mask [M, G] int32.
#pragma once

#include "common.h"

namespace wide_cpu {

// For every group: the rows (tokens) that execute it, in order; groups no row executes are not listed.
struct Plan {
  std::vector<int32_t> rows;   // concatenated row lists
  std::vector<int64_t> start;  // per listed group: offset into rows; start[i + 1] - start[i] rows
  std::vector<int64_t> group;  // the listed groups
};

// The plan of this call, in the calling thread's own Plan (grown once). Kernels take it by reference before
// at::parallel_for: a lambda naming a thread_local would see each worker's own, empty one.
Plan& call_plan(const int32_t* mask, int64_t M, int64_t G);

// N-pruned: out = x W^T + b (w [N, K]), the outputs of a token's skipped groups 0; with w2 (gated), out =
// silu(x W^T) * (x W2^T) (no bias)
template <typename T>
void gemm_n_impl(const T* x, const T* w, const int32_t* mask, const T* bias, T* out, const Geometry& d,
                 const T* w2 = nullptr);

// K-pruned: out = x W^T + b over the input groups each token executes, from w [N, K]
template <typename T>
void gemm_k_impl(const T* x, const T* w, const int32_t* mask, const T* bias, T* out, const Geometry& d);

// The same from pack_k's layout w [G, N / KB, gs, KB] (repack.cpp)
template <typename T>
void gemm_k_packed_impl(const T* x, const T* w, const int32_t* mask, const T* bias, T* out, const Geometry& d);

// The same from wt = W^T [K, N] (row-major)
template <typename T>
void gemm_kt_impl(const T* x, const T* wt, const int32_t* mask, const T* bias, T* out, const Geometry& d);

}  // namespace wide_cpu
