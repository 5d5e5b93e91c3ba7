// The torch ops of the CPU kernels (TORCH_LIBRARY wide_cpu): each checks every argument (checks.h) before it reads
// or writes any memory, then runs the kernels on pointers.
//
//   wide_cpu::gemm_n(x, w, mask, group_size, bias?, out!)    out = (x W^T + b), skipped output groups 0
//   wide_cpu::gated(x, w_gate, w_up, mask, group_size, out!)  out = silu(x Wg^T) * (x Wu^T), skipped groups 0
//   wide_cpu::gemm_k(x, w, mask, group_size, bias?, out!)    out = x W^T + b over the executed input groups
//                                                            (w [N, K], or packed by pack_k: [G, N/16, gs, 16])
//   wide_cpu::gemm_kt(x, wt, mask, group_size, bias?, out!)  the same from wt = W^T [K, N] (row-major)
//   wide_cpu::rms_norm(x, w, eps, out!) -> bool           RMSNorm; rope(x!, cos, sin) -> bool rotary in place;
//   wide_cpu::router(h, wc, bc, wr, br, mask!)            the router: the small ops of a decode step, fused
//   wide_cpu::decode_attention(q, k, v, length, head_mask?, group_heads, out!) -> bool
//                                                         one query per sequence; skipped heads not computed
//   wide_cpu::decode_step(h, layers, force, cache_k!, cache_v!, length, cos, sin, eps, norm_w, head_w, out!)
//                                                         -> bool: a decode step's layers and LM head, one call;
//                                                         each layer a wide_cpu.DecodeLayer(weights, geometry) of
//                                                         named tensors and ints (step_args.h)
//   wide_cpu::decode_step_names() -> (str[], str[])          the weight and geometry names a layer takes
//   wide_cpu::isa() -> str                                   the instruction set the kernels run with
//   wide_cpu::set_isa(name) -> str                           use a lower one (tests run every path)
//
// x [M, K] and w [N, K] (nn.Linear layout) are float32, bfloat16 or float16 (the same dtype; out too), mask
// [M, G] int32, contiguous. An op returning bool declines (false, nothing written) where the instruction set in use
// has no kernel for it (isa.h).
#include <torch/library.h>

#include "checks.h"
#include "gemm.h"
#include "isa.h"
#include "ops.h"
#include "step_args.h"

namespace wide_cpu {
namespace {

// ---------------------------------------------------------------------------------------------------------
// The masked GEMMs. wN x wK: the weight's [N, K] (a packed w's too: its layout is checked by gemm_k). The tensors
// are listed in `io` (out written, the others read); the caller adds its own and checks them apart.
Geometry check(const at::Tensor& x, const at::Tensor& w, int64_t wN, int64_t wK, const at::Tensor& mask,
               int64_t group_size, const at::Tensor& out, bool k_pruned, const char* op, Apart& io) {
  check_tensor(x, op, "x", kAnyFloat);
  TORCH_CHECK(w.scalar_type() == x.scalar_type() && out.scalar_type() == x.scalar_type(), op,
              ": x, w and out must share a dtype, got ", x.scalar_type(), ", ", w.scalar_type(), ", ",
              out.scalar_type());
  check_tensor(w, op, "w", x.scalar_type());
  check_tensor(mask, op, "mask", at::kInt);
  check_tensor(out, op, "out", x.scalar_type());
  TORCH_CHECK(x.dim() == 2 && mask.dim() == 2 && out.dim() == 2, op, ": x, mask and out must be 2-D");
  Geometry d{x.size(0), wN, x.size(1), mask.size(1), group_size};
  TORCH_CHECK(d.M <= INT32_MAX, op, ": at most ", INT32_MAX, " rows, got ", d.M);
  TORCH_CHECK(wK == d.K, op, ": w is [N, K] with K = x.size(1) = ", d.K, ", got K = ", wK);
  TORCH_CHECK(group_size > 0, op, ": group_size must be positive, got ", group_size);
  TORCH_CHECK(mask.size(0) == d.M &&
                  mul_sizes(d.G, group_size, op, "the mask's groups x group_size") == (k_pruned ? d.K : d.N),
              op, ": mask must be [M, G] with G * group_size = ", k_pruned ? "K = " : "N = ", k_pruned ? d.K : d.N,
              ", got mask ", mask.sizes(), " and group_size ", group_size);
  check_shape(out, {d.M, d.N}, op, "out");
  io.read(x, "x"), io.read(w, "w"), io.read(mask, "mask"), io.write(out, "out");
  return d;
}

Geometry check(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mask, int64_t group_size,
               const at::Tensor& out, bool k_pruned, const char* op, Apart& io) {
  TORCH_CHECK(w.dim() == 2, op, ": w must be 2-D, got ", w.sizes());
  return check(x, w, w.size(0), w.size(1), mask, group_size, out, k_pruned, op, io);
}

void check_bias(const std::optional<at::Tensor>& bias, const at::Tensor& x, int64_t N, const char* op, Apart& io) {
  if (!bias || !bias->defined()) return;
  check_tensor(*bias, op, "bias", x.scalar_type());
  TORCH_CHECK(bias->numel() == N, op, ": bias must be [N] = [", N, "], got ", bias->sizes());
  io.read(*bias, "bias");
}

void gemm_n(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mask, int64_t group_size,
            const std::optional<at::Tensor>& bias, at::Tensor& out) {
  const char* op = "wide_cpu::gemm_n";
  Apart io(op);
  Geometry d = check(x, w, mask, group_size, out, false, op, io);
  check_bias(bias, x, d.N, op, io);
  io.check();
  if (out.numel() == 0) return;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemm_n_impl<T>(ptr<T>(x), ptr<T>(w), mask.data_ptr<int32_t>(), ptr<T>(bias), static_cast<T*>(out.data_ptr()), d);
  });
}

void gated(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up, const at::Tensor& mask,
           int64_t group_size, at::Tensor& out) {
  const char* op = "wide_cpu::gated";
  Apart io(op);
  Geometry d = check(x, w_gate, mask, group_size, out, false, op, io);
  check_tensor(w_up, op, "w_up", x.scalar_type());
  check_shape(w_up, w_gate.sizes(), op, "w_up (w_gate's shape)");
  io.read(w_up, "w_up");
  io.check();
  if (out.numel() == 0) return;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemm_n_impl<T>(ptr<T>(x), ptr<T>(w_gate), mask.data_ptr<int32_t>(), nullptr, static_cast<T*>(out.data_ptr()),
                   d, ptr<T>(w_up));
  });
}

void gemm_k(const at::Tensor& x, const at::Tensor& w, const at::Tensor& mask, int64_t group_size,
            const std::optional<at::Tensor>& bias, at::Tensor& out) {
  const char* op = "wide_cpu::gemm_k";
  const bool packed = w.dim() == 4;  // [G, N / KB, group_size, KB] from pack_k
  TORCH_CHECK(packed || w.dim() == 2, op, ": w must be [N, K] or packed [G, N / ", KB, ", group_size, ", KB,
              "], got ", w.sizes());
  Apart io(op);
  Geometry d = packed ? check(x, w, mul_sizes(w.size(1), KB, op, "a packed w's N"),
                              mul_sizes(w.size(0), w.size(2), op, "a packed w's K"), mask, group_size, out, true, op, io)
                      : check(x, w, mask, group_size, out, true, op, io);
  TORCH_CHECK(!packed || (w.size(0) == d.G && w.size(2) == group_size && w.size(3) == KB),
              op, ": a packed w is [G, N / ", KB, ", group_size, ", KB, "] (pack_k), got ", w.sizes());
  check_bias(bias, x, d.N, op, io);
  io.check();
  if (out.numel() == 0) return;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* b = ptr<T>(bias);
    if (packed)
      gemm_k_packed_impl<T>(ptr<T>(x), ptr<T>(w), mask.data_ptr<int32_t>(), b, static_cast<T*>(out.data_ptr()), d);
    else
      gemm_k_impl<T>(ptr<T>(x), ptr<T>(w), mask.data_ptr<int32_t>(), b, static_cast<T*>(out.data_ptr()), d);
  });
}

void gemm_kt(const at::Tensor& x, const at::Tensor& wt, const at::Tensor& mask, int64_t group_size,
             const std::optional<at::Tensor>& bias, at::Tensor& out) {
  const char* op = "wide_cpu::gemm_kt";
  TORCH_CHECK(wt.dim() == 2, op, ": wt must be [K, N], got ", wt.sizes());
  Apart io(op);
  Geometry d = check(x, wt, wt.size(1), wt.size(0), mask, group_size, out, true, op, io);
  check_bias(bias, x, d.N, op, io);
  io.check();
  if (out.numel() == 0) return;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemm_kt_impl<T>(ptr<T>(x), ptr<T>(wt), mask.data_ptr<int32_t>(), ptr<T>(bias), static_cast<T*>(out.data_ptr()),
                    d);
  });
}

// ---------------------------------------------------------------------------------------------------------
// The small ops
bool small_ops_run_on(const at::Tensor& x) {  // isa.h: small_ops_run for x's dtype
  bool runs = false;
  by_dtype(x, [&](auto* tag) { runs = small_ops_run<std::remove_pointer_t<decltype(tag)>>(); });
  return runs;
}

bool rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& out) {
  const char* op = "wide_cpu::rms_norm";
  check_act(x, op, "x");
  const int64_t H = x.size(-1), M = lead_rows(x, 1, op);
  check_tensor(w, op, "w", x.scalar_type());
  TORCH_CHECK(w.numel() == H, op, ": w must be [H] = [", H, "], got ", w.sizes());
  check_tensor(out, op, "out", x.scalar_type());
  check_shape(out, x.sizes(), op, "out (x's shape)");
  Apart io(op);
  io.read(x, "x"), io.read(w, "w"), io.write(out, "out");
  io.check();
  if (!small_ops_run_on(x)) return false;
  if (out.numel() == 0) return true;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rms_norm_impl<T>(ptr<T>(x), ptr<T>(w), static_cast<T*>(out.data_ptr()), M, H, static_cast<float>(eps));
  });
  return true;
}

bool rope(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const char* op = "wide_cpu::rope";
  check_act(x, op, "x");
  TORCH_CHECK(x.dim() >= 2, op, ": x must be [.., H, D], got ", x.sizes());
  const int64_t D = x.size(-1), H = x.size(-2), M = lead_rows(x, 2, op);
  TORCH_CHECK(D % 2 == 0 && D <= ROPE_MAX_D, op, ": head size must be even and <= ", ROPE_MAX_D, ", got ", D);
  Apart io(op);
  io.write(x, "x");
  const char* names[] = {"cos", "sin"};
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& t = i ? sin : cos;
    check_tensor(t, op, names[i], x.scalar_type());
    TORCH_CHECK(t.dim() >= 1 && t.size(-1) == D && t.numel() == mul_sizes(M, D, op, "the rows x D"), op,
                ": cos and sin must be [M, D] = [", M, ", ", D, "] of x's dtype, got ", names[i], " ", t.sizes());
    io.read(t, names[i]);
  }
  io.check();
  if (!small_ops_run_on(x)) return false;
  if (x.numel() == 0) return true;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rope_impl<T>(static_cast<T*>(x.data_ptr()), M, H, D, ptr<T>(cos), ptr<T>(sin));
  });
  return true;
}

bool decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t length,
                      const std::optional<at::Tensor>& head_mask, int64_t group_heads, at::Tensor& out) {
  const char* op = "wide_cpu::decode_attention";
  check_act(q, op, "q");
  check_tensor(out, op, "out", q.scalar_type());
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && v.dim() == 4, op, ": q and out [B, Hq, D], k and v [B, Hk, L, D]");
  check_shape(out, q.sizes(), op, "out (q's shape)");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hk = k.size(1);
  TORCH_CHECK(Hk > 0 && Hq % Hk == 0 && length > 0 && D <= 512, op, ": bad heads, length or head size (Hq ", Hq,
              ", Hk ", Hk, ", length ", length, ", D ", D, ")");
  Apart io(op);
  io.read(q, "q"), io.write(out, "out");
  const char* names[] = {"k", "v"};
  for (int i = 0; i < 2; ++i) {
    const at::Tensor& t = i ? v : k;
    check_tensor(t, op, names[i], q.scalar_type(), true);
    TORCH_CHECK(t.size(0) == B && t.size(1) == Hk && t.size(3) == D && t.size(2) >= length &&
                    (t.stride(3) == 1 || D <= 1) && (t.stride(2) == D || t.size(2) <= 1 || D == 0),
                op, ": k / v must be [B, Hk, >= length, D] of q's dtype, rows contiguous, got ", names[i], " ",
                t.sizes(), " strides ", t.strides());
    io.read(t, names[i]);
  }
  if (head_mask && head_mask->defined()) {
    check_tensor(*head_mask, op, "head_mask", at::kInt);
    TORCH_CHECK(group_heads > 0 && Hq % group_heads == 0 &&
                    head_mask->numel() == mul_sizes(B, Hq / group_heads, op, "the rows x head groups"), op,
                ": head_mask must be int32 [B, Hq / group_heads], got ", head_mask->sizes(), " and group_heads ",
                group_heads);
    io.read(*head_mask, "head_mask");
  }
  io.check();
  if (!attention_runs(D)) return false;
  if (out.numel() == 0) return true;
  const AttnShape a{B, Hq, Hk, length, D, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                    static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)))};
  by_dtype(q, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    decode_attention_impl<T>(ptr<T>(q), ptr<T>(k), ptr<T>(v), static_cast<T*>(out.data_ptr()), a,
                             head_mask && head_mask->defined() ? head_mask->data_ptr<int32_t>() : nullptr,
                             group_heads);
  });
  return true;
}

void router(const at::Tensor& h, const at::Tensor& wc, const at::Tensor& bc, const at::Tensor& wr,
            const at::Tensor& br, at::Tensor& mask) {
  const char* op = "wide_cpu::router";
  check_act(h, op, "h");
  const int64_t H = h.size(-1), M = lead_rows(h, 1, op);
  Apart io(op);
  io.read(h, "h");
  const char* names[] = {"wc", "bc", "wr", "br"};
  const at::Tensor* ts[] = {&wc, &bc, &wr, &br};
  for (int i = 0; i < 4; ++i) check_tensor(*ts[i], op, names[i], at::kFloat), io.read(*ts[i], names[i]);
  TORCH_CHECK(wc.dim() == 2 && wr.dim() == 2, op, ": wc [R, H], bc [R], wr [2G, R], br [2G]");
  const int64_t R = wc.size(0), G = wr.size(0) / 2;
  TORCH_CHECK(wc.size(1) == H && bc.numel() == R && wr.size(1) == R && wr.size(0) == 2 * G && br.numel() == 2 * G,
              op, ": wc [R, H], bc [R], wr [2G, R], br [2G] with H = ", H, ", got ", wc.sizes(), ", ", bc.sizes(), ", ",
              wr.sizes(), ", ", br.sizes());
  check_tensor(mask, op, "mask", at::kInt);
  TORCH_CHECK(mask.numel() == mul_sizes(M, G, op, "the rows x groups"), op, ": mask must be int32 [M, G] = [", M,
              ", ", G, "], got ", mask.sizes());
  io.write(mask, "mask");
  io.check();
  if (mask.numel() == 0) return;
  const at::Tensor hf = h.scalar_type() == at::kFloat ? h : h.to(at::kFloat);
  router_impl(ptr<float>(hf), M, H, ptr<float>(wc), ptr<float>(bc), R, ptr<float>(wr), ptr<float>(br), G,
              mask.data_ptr<int32_t>());
}

}  // namespace
}  // namespace wide_cpu

TORCH_LIBRARY(wide_cpu, m) {
  m.def("gemm_n(Tensor x, Tensor w, Tensor mask, int group_size, Tensor? bias, Tensor(a!) out) -> ()");
  m.def("gated(Tensor x, Tensor w_gate, Tensor w_up, Tensor mask, int group_size, Tensor(a!) out) -> ()");
  m.def("gemm_k(Tensor x, Tensor w, Tensor mask, int group_size, Tensor? bias, Tensor(a!) out) -> ()");
  m.def("gemm_kt(Tensor x, Tensor wt, Tensor mask, int group_size, Tensor? bias, Tensor(a!) out) -> ()");
  m.def("rms_norm(Tensor x, Tensor w, float eps, Tensor(a!) out) -> bool");
  m.def("rope(Tensor(a!) x, Tensor cos, Tensor sin) -> bool");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, int length, Tensor? head_mask, int group_heads, "
        "Tensor(a!) out) -> bool");
  m.def("router(Tensor h, Tensor wc, Tensor bc, Tensor wr, Tensor br, Tensor(a!) mask) -> ()");
  m.class_<wide_cpu::DecodeLayer>("DecodeLayer")
      .def(torch::init<c10::Dict<std::string, at::Tensor>, c10::Dict<std::string, int64_t>>())
      .def("names", &wide_cpu::DecodeLayer::names);
  m.def("decode_step(Tensor h, __torch__.torch.classes.wide_cpu.DecodeLayer[] layers, int[] force, "
        "Tensor(a!)[] cache_k, Tensor(b!)[] cache_v, int length, Tensor cos, Tensor sin, float eps, Tensor norm_w, "
        "Tensor head_w, Tensor(c!) out) -> bool");
  m.def("decode_step_names() -> (str[] weights, str[] geometry)", &wide_cpu::decode_step_names);
  m.def("isa() -> str", &wide_cpu::isa);
  m.def("set_isa(str name) -> str", &wide_cpu::set_isa);
}

TORCH_LIBRARY_IMPL(wide_cpu, CPU, m) {
  m.impl("gemm_n", &wide_cpu::gemm_n);
  m.impl("gated", &wide_cpu::gated);
  m.impl("gemm_k", &wide_cpu::gemm_k);
  m.impl("gemm_kt", &wide_cpu::gemm_kt);
  m.impl("rms_norm", &wide_cpu::rms_norm);
  m.impl("rope", &wide_cpu::rope);
  m.impl("router", &wide_cpu::router);
  m.impl("decode_attention", &wide_cpu::decode_attention);
  m.impl("decode_step", &wide_cpu::decode_step);
}
