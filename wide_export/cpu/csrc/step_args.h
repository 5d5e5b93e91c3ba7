// The decode step's arguments: each layer a DecodeLayer (a registered torch class, torch.classes.wide_cpu.DecodeLayer)
// made once from its weights and geometry ints BY NAME, and the op wide_cpu::decode_step that checks them every call
// (step_args.cpp) and runs the step (decode_step.cpp). cpu/step.py keeps the one Python table of the names
// (LAYER_WEIGHTS, LAYER_GEOMETRY); torch.ops.wide_cpu.decode_step_names() gives the op's, which a test compares.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <string>
#include <tuple>
#include <vector>

namespace wide_cpu {

// One decoder layer's weights, each under its DecoderLayer parameter's name (kLayerWeights in step_args.cpp);
// undefined: the layer has none. The tensors themselves (a parameter's data replaced in place is read anew).
struct LayerTensors {
  at::Tensor input_norm;                                  // input_layernorm.weight [H]
  at::Tensor wq, bq, wk, bk, wv, bv;                      // self_attn.{q,k,v}_proj.{weight,bias} [N, H], [N]
  at::Tensor q_norm, k_norm;                              // self_attn.{q,k}_norm.weight [D] (Qwen3)
  at::Tensor wo, bo;                                      // self_attn.o_proj.{weight,bias} [H, Hq D], [H]
  at::Tensor post_norm;                                   // post_attention_layernorm.weight [H]
  at::Tensor wg, wu, wd;                                  // mlp.{gate,up,down}_proj.weight [F, H], [F, H], [H, F]
  at::Tensor attention_wc, attention_bc, attention_wr, attention_br;  // router_attention.{compressor,router}.*
  at::Tensor ffn_wc, ffn_bc, ffn_wr, ffn_br;                          // router_ffn.{compressor,router}.*
};

// Its geometry ints, by name (kLayerGeometry): heads and KV heads of head_dim; the attention router's heads a group
// and the FFN router's channels a group, 0 where that sublayer is not routed
struct LayerGeometry {
  int64_t heads = 0, kv_heads = 0, head_dim = 0, attention_group_heads = 0, ffn_group_size = 0;
};

// A layer as the op takes it: made from dicts of name -> tensor and name -> int; an unknown name, or a geometry int
// missing, is refused here (the weights a layer needs depend on its geometry: checked by the op, every call)
class DecodeLayer : public torch::CustomClassHolder {
 public:
  DecodeLayer(const c10::Dict<std::string, at::Tensor>& weights, const c10::Dict<std::string, int64_t>& geometry);
  const LayerTensors& weights() const { return w_; }
  const LayerGeometry& geometry() const { return g_; }
  std::vector<std::string> names() const;  // the weights it holds, in the table's order

 private:
  LayerTensors w_;
  LayerGeometry g_;
};

// Every weight name the op takes (in cpu/step.py's order) and every geometry name
std::tuple<std::vector<std::string>, std::vector<std::string>> decode_step_names();

// h [B, 1, H] -> out [B, 1, V]: every layer (force[l]: all its groups execute), its cache's row `length` written; the
// final norm, the LM head. False (nothing written) where the instruction set in use has no decode attention.
bool decode_step(const at::Tensor& h, const std::vector<c10::intrusive_ptr<DecodeLayer>>& layers,
                 at::IntArrayRef force, at::TensorList cache_k, at::TensorList cache_v, int64_t length,
                 const at::Tensor& cos, const at::Tensor& sin, double eps, const at::Tensor& norm_w,
                 const at::Tensor& head_w, at::Tensor& out);

}  // namespace wide_cpu
