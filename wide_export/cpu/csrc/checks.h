// Argument checks, shared by every op and run before any of its data is read or written, so before the choice of
// instruction set: every path (AVX-512, AVX2, scalar) sits behind them. A refused argument is one TORCH_CHECK line
// (a RuntimeError in Python) that names the op and the argument; cpu/ops.py turns it into a WideError. And the
// tensor-to-pointer helpers of bindings.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "common.h"

namespace wide_cpu {

constexpr at::ScalarType kAnyFloat = at::ScalarType::Undefined;  // check_tensor: float32, bfloat16 or float16

// a * b of sizes, refused where either is negative or the product does not fit in 64 bits (a group count times a
// group size of 2**62 wraps to a real width otherwise)
int64_t mul_sizes(int64_t a, int64_t b, const char* op, const char* what);

// The product of t's sizes but its last `keep` (the rows of a [.., H] tensor), overflow-checked: a zero-sized
// dim elsewhere makes numel() 0, so numel() / H is no row count (and a division by zero where H is 0)
int64_t lead_rows(const at::Tensor& t, int64_t keep, const char* op);

// An argument's name in an error message: `name`, or with a layer (>= 0) "layer L's name" (formatted only when a
// check fails)
struct Label {
  Label(const char* name) : name(name) {}  // NOLINT: a plain name converts
  Label(const char* name, int64_t layer) : name(name), layer(layer) {}
  const char* name;
  int64_t layer = -1;
};
std::ostream& operator<<(std::ostream& os, const Label& label);

// t present, a dense strided CPU tensor of dtype `dt` (kAnyFloat: one the kernels compute in), contiguous unless
// `rows_only` (then only its last dim is checked, by the caller)
void check_tensor(const at::Tensor& t, const char* op, const Label& name, at::ScalarType dt, bool rows_only = false);

void check_shape(const at::Tensor& t, at::IntArrayRef shape, const char* op, const char* name);

// An activation [.., H]: a contiguous float CPU tensor of at least one dim
void check_act(const at::Tensor& x, const char* op, const char* name);

// The tensors of a call: every one it writes must share no byte with any other it reads or writes (an `out` that
// is an input would be overwritten while still read). By the bytes each spans (torch's strides are >= 0): written
// spans sorted, each read one looked up among them. An empty tensor spans nothing. A span's label is its name, with
// `index` (>= 0) in brackets after it, or (read_layer) "layer L's name". Names are not copied: they must outlive check().
class Apart {
 public:
  explicit Apart(const char* op) : op_(op) {}
  void add(const at::Tensor& t, bool written, const char* name, int64_t index = -1, bool layer = false);
  void read(const at::Tensor& t, const char* name, int64_t index = -1) { add(t, false, name, index); }
  void write(const at::Tensor& t, const char* name, int64_t index = -1) { add(t, true, name, index); }
  void read_layer(const at::Tensor& t, const char* name, int64_t layer) { add(t, false, name, layer, true); }
  void check();

 private:
  struct Span {
    uintptr_t begin, end;
    const char* name;
    int64_t index;
    bool layer;
  };
  [[noreturn]] void fail(const Span& a, const Span& b) const;
  const char* op_;
  std::vector<Span> out_, in_;
};

// f(static_cast<T*>(nullptr)) with T the element type of x's dtype (float, c10::Half, uint16_t for bfloat16)
template <typename F>
void by_dtype(const at::Tensor& x, F&& f) {
  if (x.scalar_type() == at::kFloat) f(static_cast<float*>(nullptr));
  else if (x.scalar_type() == at::kHalf) f(static_cast<c10::Half*>(nullptr));
  else f(static_cast<uint16_t*>(nullptr));
}

template <typename T>
const T* ptr(const at::Tensor& t) { return static_cast<const T*>(t.data_ptr()); }

template <typename T>
const T* ptr(const std::optional<at::Tensor>& t) { return t && t->defined() ? ptr<T>(*t) : nullptr; }

}  // namespace wide_cpu
