// The decode step's named arguments (step_args.h): the tables of names, DecodeLayer, and the op's checks of every
// layer by name before anything is read or written (a missing, unknown or mistyped weight is one error line naming
// it, and the layer).
#include "step_args.h"

#include <ATen/MemoryOverlap.h>

#include "checks.h"
#include "decode_step.h"
#include "isa.h"

namespace wide_cpu {
namespace {

using Field = at::Tensor LayerTensors::*;

// A layer's weights by name: each the DecoderLayer parameter's path (model/modeling.py), in cpu/step.py's order
// (LAYER_WEIGHTS). Routers' weights are float32 whatever the step's dtype.
struct WeightName {
  const char* name;
  Field field;
  bool router;
};
constexpr WeightName kLayerWeights[] = {
    {"input_layernorm.weight", &LayerTensors::input_norm, false},
    {"self_attn.q_proj.weight", &LayerTensors::wq, false},
    {"self_attn.q_proj.bias", &LayerTensors::bq, false},
    {"self_attn.k_proj.weight", &LayerTensors::wk, false},
    {"self_attn.k_proj.bias", &LayerTensors::bk, false},
    {"self_attn.v_proj.weight", &LayerTensors::wv, false},
    {"self_attn.v_proj.bias", &LayerTensors::bv, false},
    {"self_attn.q_norm.weight", &LayerTensors::q_norm, false},
    {"self_attn.k_norm.weight", &LayerTensors::k_norm, false},
    {"self_attn.o_proj.weight", &LayerTensors::wo, false},
    {"self_attn.o_proj.bias", &LayerTensors::bo, false},
    {"post_attention_layernorm.weight", &LayerTensors::post_norm, false},
    {"mlp.gate_proj.weight", &LayerTensors::wg, false},
    {"mlp.up_proj.weight", &LayerTensors::wu, false},
    {"mlp.down_proj.weight", &LayerTensors::wd, false},
    {"router_attention.compressor.weight", &LayerTensors::attention_wc, true},
    {"router_attention.compressor.bias", &LayerTensors::attention_bc, true},
    {"router_attention.router.weight", &LayerTensors::attention_wr, true},
    {"router_attention.router.bias", &LayerTensors::attention_br, true},
    {"router_ffn.compressor.weight", &LayerTensors::ffn_wc, true},
    {"router_ffn.compressor.bias", &LayerTensors::ffn_bc, true},
    {"router_ffn.router.weight", &LayerTensors::ffn_wr, true},
    {"router_ffn.router.bias", &LayerTensors::ffn_br, true},
};

struct GeometryName {
  const char* name;
  int64_t LayerGeometry::*field;
};
constexpr GeometryName kLayerGeometry[] = {
    {"heads", &LayerGeometry::heads},
    {"kv_heads", &LayerGeometry::kv_heads},
    {"head_dim", &LayerGeometry::head_dim},
    {"attention_group_heads", &LayerGeometry::attention_group_heads},
    {"ffn_group_size", &LayerGeometry::ffn_group_size},
};

// A sublayer's router: its four weights, and the geometry int that says it is routed
struct RouterFields {
  Field wc, bc, wr, br;
  const char* sublayer;
  const char* geometry;
};
constexpr RouterFields kAttentionRouter{&LayerTensors::attention_wc, &LayerTensors::attention_bc,
                                        &LayerTensors::attention_wr, &LayerTensors::attention_br, "attention",
                                        "attention_group_heads"};
constexpr RouterFields kFfnRouter{&LayerTensors::ffn_wc, &LayerTensors::ffn_bc, &LayerTensors::ffn_wr,
                                  &LayerTensors::ffn_br, "FFN", "ffn_group_size"};

const WeightName& slot(Field f) {
  for (const WeightName& w : kLayerWeights)
    if (w.field == f) return w;
  TORCH_CHECK(false, "wide_cpu::decode_step: a field without a name");  // not reached: every field is listed
  return kLayerWeights[0];
}

// [N, K] stored as W^T [K, N] row-major (its transpose contiguous): how a routed o_proj / down_proj is kept
bool transposed_contiguous(const at::Tensor& t) {
  return t.dim() == 2 && (t.size(0) <= 1 || t.stride(0) == 1) && (t.size(1) <= 1 || t.stride(1) == t.size(0));
}

const void* data(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

RouterWeights router_weights(const LayerTensors& w, const RouterFields& r) {
  RouterWeights rw;
  rw.wc = static_cast<const float*>(data(w.*r.wc)), rw.bc = static_cast<const float*>(data(w.*r.bc));
  rw.wr = static_cast<const float*>(data(w.*r.wr)), rw.br = static_cast<const float*>(data(w.*r.br));
  rw.R = (w.*r.wc).size(0);
  return rw;
}

// Layer l's weights and caches checked against h and its geometry; its pointers and shape. Every tensor is listed
// in io (the caches written).
StepLayer check_layer(const at::Tensor& h, const DecodeLayer& layer, bool force, const at::Tensor& ck,
                      const at::Tensor& cv, int64_t length, Apart& io, int64_t l) {
  const char* op = "wide_cpu::decode_step";
  const LayerTensors& w = layer.weights();
  const LayerGeometry& g = layer.geometry();
  const int64_t H = h.size(-1), B = h.numel() / H;  // H > 0: decode_step
  const int64_t Hq = g.heads, Hk = g.kv_heads, D = g.head_dim, gh = g.attention_group_heads, gs = g.ffn_group_size;
  TORCH_CHECK(Hq > 0 && Hk > 0 && Hq % Hk == 0 && D > 0 && D % 2 == 0 && D <= 512 && gh >= 0 && gs >= 0, op,
              ": layer ", l, ": bad heads, head size or group sizes (heads ", Hq, ", kv_heads ", Hk, ", head_dim ", D,
              ", attention_group_heads ", gh, ", ffn_group_size ", gs, ")");
  const auto has = [&](Field f) { return (w.*f).defined(); };
  // a weight the layer must have, of `shape`; `transposed`: stored as W^T (a routed sublayer's o / down)
  const auto want = [&](Field f, std::initializer_list<int64_t> shape, bool transposed = false) {
    const WeightName& s = slot(f);
    const at::Tensor& t = w.*f;
    TORCH_CHECK(t.defined(), op, ": layer ", l, " has no ", s.name);
    check_tensor(t, op, Label(s.name, l), s.router ? at::kFloat : h.scalar_type(), transposed);
    TORCH_CHECK(t.sizes().equals(shape) && (!transposed || transposed_contiguous(t)), op, ": layer ", l, "'s ",
                s.name, " must be ", s.router ? "float32 " : "of h's dtype ", at::IntArrayRef(shape),
                transposed ? " stored as W^T (its transpose contiguous: the sublayer is routed)" : " contiguous",
                ", got ", t.sizes(), " strides ", t.strides());
  };
  TORCH_CHECK(has(&LayerTensors::wg), op, ": layer ", l, " has no ", slot(&LayerTensors::wg).name);
  TORCH_CHECK(w.wg.dim() == 2, op, ": layer ", l, "'s ", slot(&LayerTensors::wg).name, " must be [F, H], got ",
              w.wg.sizes());
  const int64_t NQ = mul_sizes(Hq, D, op, "heads x head size"), NK = mul_sizes(Hk, D, op, "KV heads x head size");
  const int64_t F = w.wg.size(0);
  TORCH_CHECK(!gh || Hq % gh == 0, op, ": layer ", l, ": the attention group heads must divide the heads");
  TORCH_CHECK(!gs || F % gs == 0, op, ": layer ", l, ": the FFN group size must divide the FFN size");
  want(&LayerTensors::input_norm, {H}), want(&LayerTensors::wq, {NQ, H}), want(&LayerTensors::wk, {NK, H});
  want(&LayerTensors::wv, {NK, H}), want(&LayerTensors::post_norm, {H}), want(&LayerTensors::wg, {F, H});
  want(&LayerTensors::wu, {F, H});
  if (has(&LayerTensors::bq)) want(&LayerTensors::bq, {NQ});
  if (has(&LayerTensors::bk)) want(&LayerTensors::bk, {NK});
  if (has(&LayerTensors::bv)) want(&LayerTensors::bv, {NK});
  TORCH_CHECK(has(&LayerTensors::q_norm) == has(&LayerTensors::k_norm), op, ": layer ", l, "'s ",
              slot(&LayerTensors::q_norm).name, " and ", slot(&LayerTensors::k_norm).name, " come together");
  if (has(&LayerTensors::q_norm)) want(&LayerTensors::q_norm, {D}), want(&LayerTensors::k_norm, {D});
  want(&LayerTensors::wo, {H, NQ}, gh != 0);  // nn.Linear's [N, K]; a routed one kept as W^T (gemm_kt)
  if (has(&LayerTensors::bo)) want(&LayerTensors::bo, {H});
  want(&LayerTensors::wd, {H, F}, gs != 0);
  for (const RouterFields* r : {&kAttentionRouter, &kFfnRouter}) {
    const int64_t G = r == &kAttentionRouter ? (gh ? Hq / gh : 0) : (gs ? F / gs : 0);
    const Field fields[] = {r->wc, r->bc, r->wr, r->br};
    if (!G) {
      for (Field f : fields)
        TORCH_CHECK(!has(f), op, ": layer ", l, "'s ", slot(f).name, " is given but its ", r->sublayer,
                    " is not routed (", r->geometry, " 0)");
      continue;
    }
    TORCH_CHECK(has(r->wc), op, ": layer ", l, " has no ", slot(r->wc).name, " (its ", r->sublayer, " is routed)");
    TORCH_CHECK((w.*r->wc).dim() == 2, op, ": layer ", l, "'s ", slot(r->wc).name, " must be [R, H], got ",
                (w.*r->wc).sizes());
    const int64_t R = (w.*r->wc).size(0);
    want(r->wc, {R, H}), want(r->bc, {R}), want(r->wr, {2 * G, R}), want(r->br, {2 * G});
  }
  // the layer's scratch (decode_step.cpp: Arena), in 64 bits
  const int64_t ga = gh ? Hq / gh : 1, gf = gs ? F / gs : 1;
  mul_sizes(B, 4 * H + 2 * NQ + 2 * NK + F + 1 + ga + gf, op, "the rows x a layer's scratch");
  for (const at::Tensor* t : {&ck, &cv}) {
    const char* name = t == &ck ? "cache_k" : "cache_v";
    check_tensor(*t, op, name, h.scalar_type(), true);
    TORCH_CHECK(t->dim() == 4 && t->size(0) == B && t->size(1) == Hk && t->size(3) == D && t->stride(3) == 1 &&
                    t->stride(2) == D && t->strides().equals(ck.strides()),
                op, ": caches must be [B, Hk, capacity, D] of h's dtype, rows contiguous, k and v alike, got ", name,
                " ", t->sizes(), " strides ", t->strides());
    TORCH_CHECK(length >= 0 && length < t->size(2), op, ": ", name, " is full (", length, " positions of ",
                t->size(2), ")");
    TORCH_CHECK(at::has_internal_overlap(*t) != at::MemOverlap::Yes, op, ": ", name,
                " has positions that share memory (an expanded tensor)");
    io.write(*t, name, l);
  }
  for (const WeightName& s : kLayerWeights)
    if ((w.*s.field).defined()) io.read_layer(w.*s.field, s.name, l);

  StepLayer out;
  LayerWeights& lw = out.w;
  lw.input_norm = data(w.input_norm), lw.post_norm = data(w.post_norm);
  lw.wq = data(w.wq), lw.bq = data(w.bq), lw.wk = data(w.wk), lw.bk = data(w.bk), lw.wv = data(w.wv);
  lw.bv = data(w.bv), lw.q_norm = data(w.q_norm), lw.k_norm = data(w.k_norm), lw.wo = data(w.wo);
  lw.bo = data(w.bo), lw.wg = data(w.wg), lw.wu = data(w.wu), lw.wd = data(w.wd);
  if (gh) lw.attention_router = router_weights(w, kAttentionRouter);
  if (gs) lw.ffn_router = router_weights(w, kFfnRouter);
  out.s = LayerShape{B, H, Hq, Hk, D, F, gh, gs, force};
  out.cache_k = ck.data_ptr(), out.cache_v = cv.data_ptr();
  out.cache_b = ck.stride(0), out.cache_h = ck.stride(1);
  return out;
}

}  // namespace

DecodeLayer::DecodeLayer(const c10::Dict<std::string, at::Tensor>& weights,
                         const c10::Dict<std::string, int64_t>& geometry) {
  const char* op = "wide_cpu::DecodeLayer";
  for (const auto& e : weights) {
    const std::string name = e.key();
    const WeightName* s = nullptr;
    for (const WeightName& w : kLayerWeights)
      if (name == w.name) s = &w;
    TORCH_CHECK(s, op, ": unknown weight '", name, "' (the names a layer takes: cpu/step.py LAYER_WEIGHTS)");
    w_.*(s->field) = e.value();
  }
  for (const auto& e : geometry) {
    const std::string name = e.key();
    bool known = false;
    for (const GeometryName& g : kLayerGeometry) known = known || name == g.name;
    TORCH_CHECK(known, op, ": unknown geometry '", name, "' (the names a layer takes: cpu/step.py LAYER_GEOMETRY)");
  }
  for (const GeometryName& g : kLayerGeometry) {
    const auto it = geometry.find(g.name);
    TORCH_CHECK(it != geometry.end(), op, ": geometry '", g.name, "' is missing");
    g_.*(g.field) = it->value();
  }
}

std::vector<std::string> DecodeLayer::names() const {
  std::vector<std::string> held;
  for (const WeightName& s : kLayerWeights)
    if ((w_.*s.field).defined()) held.emplace_back(s.name);
  return held;
}

std::tuple<std::vector<std::string>, std::vector<std::string>> decode_step_names() {
  std::vector<std::string> weights, geometry;
  for (const WeightName& s : kLayerWeights) weights.emplace_back(s.name);
  for (const GeometryName& g : kLayerGeometry) geometry.emplace_back(g.name);
  return {weights, geometry};
}

bool decode_step(const at::Tensor& h, const std::vector<c10::intrusive_ptr<DecodeLayer>>& layers,
                 at::IntArrayRef force, at::TensorList cache_k, at::TensorList cache_v, int64_t length,
                 const at::Tensor& cos, const at::Tensor& sin, double eps, const at::Tensor& norm_w,
                 const at::Tensor& head_w, at::Tensor& out) {
  const char* op = "wide_cpu::decode_step";
  check_act(h, op, "h");
  const int64_t H = h.size(-1), B = lead_rows(h, 1, op);
  TORCH_CHECK(H > 0 && B > 0 && B <= INT32_MAX, op, ": h must be [B, 1, H] with B, H > 0, got ", h.sizes());
  const int64_t L = static_cast<int64_t>(layers.size());
  TORCH_CHECK(L > 0 && static_cast<int64_t>(cache_k.size()) == L && static_cast<int64_t>(cache_v.size()) == L &&
                  static_cast<int64_t>(force.size()) == L,
              op, ": one DecodeLayer, force flag, key cache and value cache per layer, got ", L, ", ", force.size(),
              ", ", cache_k.size(), " and ", cache_v.size());
  for (int64_t l = 0; l < L; ++l) TORCH_CHECK(layers[l], op, ": layer ", l, " is missing");
  const int64_t D = layers[0]->geometry().head_dim;
  for (int64_t l = 0; l < L; ++l)
    TORCH_CHECK(layers[l]->geometry().head_dim == D, op, ": one head size for all layers");
  Apart io(op);
  io.read(h, "h");
  const char* names[] = {"cos", "sin"};
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& t = i ? sin : cos;
    check_tensor(t, op, names[i], h.scalar_type());
    TORCH_CHECK(D > 0 && t.numel() == mul_sizes(B, D, op, "the rows x head size"), op, ": ", names[i],
                " must be [B, D] of h's dtype, got ", t.sizes());
    io.read(t, names[i]);
  }
  check_tensor(norm_w, op, "norm_w", h.scalar_type());
  check_tensor(head_w, op, "head_w", h.scalar_type());
  TORCH_CHECK(norm_w.numel() == H && head_w.dim() == 2 && head_w.size(1) == H, op,
              ": the final norm [H] and the LM head [V, H] must be contiguous, of h's dtype, got ", norm_w.sizes(),
              " and ", head_w.sizes());
  const int64_t V = head_w.size(0);
  check_tensor(out, op, "out", h.scalar_type());
  TORCH_CHECK(out.numel() == mul_sizes(B, V, op, "the rows x vocabulary"), op, ": out must be [B, V] = [", B, ", ",
              V, "] of h's dtype, got ", out.sizes());
  io.read(norm_w, "norm_w"), io.read(head_w, "head_w"), io.write(out, "out");
  std::vector<StepLayer> steps(L);
  for (int64_t l = 0; l < L; ++l)
    steps[l] = check_layer(h, *layers[l], force[l] != 0, cache_k[l], cache_v[l], length, io, l);
  io.check();
  if (!attention_runs(D)) return false;
  by_dtype(h, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    decode_step_impl<T>(ptr<T>(h), steps, length, ptr<T>(cos), ptr<T>(sin), static_cast<float>(eps), ptr<T>(norm_w),
                        ptr<T>(head_w), V, static_cast<T*>(out.data_ptr()));
  });
  return true;
}

}  // namespace wide_cpu
