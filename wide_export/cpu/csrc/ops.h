// The small ops around the projections, on checked pointers (bindings.cpp checks the tensors): RMSNorm, rotary
// embedding, decode attention, the router. Each runs the instruction set's kernel (isa.h); the caller checks first
// that it runs (small_ops_run, attention_runs).
#pragma once

#include "common.h"
#include "isa.h"

namespace wide_cpu {

// RMSNorm of M rows of H: out = w * T(x * rsqrt(mean(x^2) + eps))
template <typename T>
void rms_norm_impl(const T* x, const T* w, T* out, int64_t M, int64_t H, float eps);

// Rotary embedding in place of x [M, H, D], cos / sin [M, D]
template <typename T>
void rope_impl(T* x, int64_t M, int64_t H, int64_t D, const T* cos, const T* sin);

// Decode attention: q [B, Hq, D], k / v with AttnShape's strides, out [B, Hq, D]; mask [B, Hq / group_heads] int32
// (the heads of skipped groups are not computed: 0) or null
template <typename T>
void decode_attention_impl(const T* q, const T* k, const T* v, T* out, const AttnShape& a, const int32_t* mask,
                           int64_t group_heads);

// The router for M tokens: mask[m, g] = logits[m, 2g] >= logits[m, 2g + 1], logits = (h Wc^T + bc) Wr^T + br
void router_impl(const float* h, int64_t M, int64_t H, const float* wc, const float* bc, int64_t R, const float* wr,
                 const float* br, int64_t G, int32_t* mask);

}  // namespace wide_cpu
