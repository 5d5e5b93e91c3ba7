// A decode step's layers, final norm and LM head in one call (decode_step.cpp), on checked pointers: bindings.cpp
// checks the op's tensors (each layer's weights by name) and fills these.
#pragma once

#include "common.h"

namespace wide_cpu {

// A router's float32 weights (ops/reference.py wide_router): wc [R, H], bc [R], wr [2G, R], br [2G]
struct RouterWeights {
  const float *wc = nullptr, *bc = nullptr, *wr = nullptr, *br = nullptr;
  int64_t R = 0;
};

// One layer's weights, of the step's dtype (the routers' float32); null where the layer has none (a bias, Qwen3's
// q / k norms, a router). wo / wd: W^T [K, N] where their sublayer is routed (gemm_kt), else [N, K].
struct LayerWeights {
  const void *input_norm = nullptr, *wq = nullptr, *bq = nullptr, *wk = nullptr, *bk = nullptr, *wv = nullptr,
             *bv = nullptr, *q_norm = nullptr, *k_norm = nullptr, *wo = nullptr, *bo = nullptr,
             *post_norm = nullptr, *wg = nullptr, *wu = nullptr, *wd = nullptr;
  RouterWeights attention_router, ffn_router;
};

// B rows of hidden size H; Hq / Hk heads of size D; FFN size F; gh: the attention router's heads a group (0: no
// router), gs: the FFN router's channels a group (0: none); force: every group executes
struct LayerShape {
  int64_t B, H, Hq, Hk, D, F, gh, gs;
  bool force;
};

struct StepLayer {
  LayerWeights w;
  LayerShape s;
  void *cache_k, *cache_v;      // [B, Hk, capacity, D], the same strides
  int64_t cache_b, cache_h;     // their batch and head strides (rows are D apart)
};

// h [B, H] -> out [B, V] logits (the step's dtype): every layer (writing its cache's row `length`), the final
// RMSNorm (norm_w [H]), the LM head (head_w [V, H]). Needs the decode attention (isa.h: attention_runs).
template <typename T>
void decode_step_impl(const T* h, const std::vector<StepLayer>& layers, int64_t length, const T* cos, const T* sin,
                      float eps, const T* norm_w, const T* head_w, int64_t V, T* out);

}  // namespace wide_cpu
