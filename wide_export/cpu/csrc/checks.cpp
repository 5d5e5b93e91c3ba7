// Argument checks shared by every op (checks.h).
#include "checks.h"

#include <c10/util/Exception.h>

#include <ostream>

namespace wide_cpu {

int64_t mul_sizes(int64_t a, int64_t b, const char* op, const char* what) {
  int64_t r = 0;
  TORCH_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &r), op, ": ", what, " (", a, " x ", b,
              ") is negative or does not fit in 64 bits");
  return r;
}

int64_t lead_rows(const at::Tensor& t, int64_t keep, const char* op) {
  int64_t r = 1;
  for (int64_t i = 0; i + keep < t.dim(); ++i) r = mul_sizes(r, t.size(i), op, "the rows of a tensor");
  return r;
}

std::ostream& operator<<(std::ostream& os, const Label& label) {
  if (label.layer >= 0) os << "layer " << label.layer << "'s ";
  return os << label.name;
}

void check_tensor(const at::Tensor& t, const char* op, const Label& name, at::ScalarType dt, bool rows_only) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is missing");
  TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided, op, ": ", name, " must be a dense CPU tensor, got ",
              t.device(), " ", t.layout());
  TORCH_CHECK(!t.is_neg() && !t.is_conj(), op, ": ", name, " must not be a lazily negated / conjugated view");
  TORCH_CHECK(rows_only || t.is_contiguous(), op, ": ", name, " must be contiguous");
  if (dt == kAnyFloat) {
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf,
                op, ": ", name, " must be float32, bfloat16 or float16, got ", t.scalar_type());
  } else {
    TORCH_CHECK(t.scalar_type() == dt, op, ": ", name, " must be ", dt, ", got ", t.scalar_type());
  }
}

void check_shape(const at::Tensor& t, at::IntArrayRef shape, const char* op, const char* name) {
  TORCH_CHECK(t.sizes().equals(shape), op, ": ", name, " must be ", shape, ", got ", t.sizes());
}

void check_act(const at::Tensor& x, const char* op, const char* name) {
  check_tensor(x, op, name, kAnyFloat);
  TORCH_CHECK(x.dim() >= 1, op, ": ", name, " must have at least one dim");
}

void Apart::add(const at::Tensor& t, bool written, const char* name, int64_t index, bool layer) {
  if (!t.defined() || t.numel() == 0) return;
  int64_t last = 0;
  for (int64_t i = 0; i < t.dim(); ++i) last += (t.size(i) - 1) * t.stride(i);
  const uintptr_t b = reinterpret_cast<uintptr_t>(t.data_ptr());
  (written ? out_ : in_).push_back({b, b + static_cast<uintptr_t>(last + 1) * t.element_size(), name, index,
                                    layer});
}

void Apart::check() {
  std::sort(out_.begin(), out_.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < out_.size(); ++i)
    if (out_[i].begin < out_[i - 1].end) fail(out_[i - 1], out_[i]);
  for (const Span& r : in_) {  // the first written span that ends after r begins (written ends ascend too)
    auto it = std::upper_bound(out_.begin(), out_.end(), r.begin,
                               [](uintptr_t v, const Span& s) { return v < s.end; });
    if (it != out_.end() && it->begin < r.end) fail(*it, r);
  }
}

void Apart::fail(const Span& a, const Span& b) const {
  const auto label = [](const Span& s) {
    if (s.index < 0) return std::string(s.name);
    return s.layer ? "layer " + std::to_string(s.index) + "'s " + s.name
                   : std::string(s.name) + "[" + std::to_string(s.index) + "]";
  };
  TORCH_CHECK(false, op_, ": ", label(a), " and ", label(b),
              " overlap in memory (an output must not share memory with another argument)");
  __builtin_unreachable();
}

}  // namespace wide_cpu
