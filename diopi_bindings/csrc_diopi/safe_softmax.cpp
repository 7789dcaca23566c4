// aten::_safe_softmax (softmax, a row whose every element is -inf giving zeros) has no DIOPI function: on the
// device it is composed here, in C++, of routed operators: softmax (diopiSoftmax), the row's maximum
// (diopiMax), a comparison with the dtype's lowest finite value (diopiLtScalar: only a -inf maximum is below;
// a NaN is not, so a row with a NaN keeps softmax's NaN, as in ATen) and diopiWhere.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <atomic>
#include <limits>
#include <optional>

#include "router.h"

namespace diopi_bindings {

namespace {

std::atomic<int64_t> g_calls{0};

double lowest(at::ScalarType type) {
  switch (type) {
    case at::kDouble: return std::numeric_limits<double>::lowest();
    case at::kHalf: return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    case at::kBFloat16: return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    default: return static_cast<double>(std::numeric_limits<float>::lowest());
  }
}

at::Tensor safe_softmax(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  const at::Tensor x = dtype.has_value() && *dtype != self.scalar_type() ? self.to(*dtype) : self;
  at::Tensor out = at::_softmax(x, dim, false);
  if (x.numel() == 0) return out;
  const at::Tensor row_max = std::get<0>(at::max(x, dim, /*keepdim=*/true));
  const at::Tensor masked = at::lt(row_max, lowest(x.scalar_type()));
  return at::where(masked, at::zeros({}, out.options()), out);
}

}  // namespace

bool register_safe_softmax(torch::Library& lib, void* library) {
  for (const char* fn : {"diopiSoftmax", "diopiMax", "diopiLtScalar", "diopiWhere", "diopiFill"}) {
    if (dlsym(library, fn) == nullptr) return false;  // the device's other path serves it
  }
  lib.impl("_safe_softmax", TORCH_FN(safe_softmax));
  return true;
}

int64_t safe_softmax_calls() { return g_calls.load(std::memory_order_relaxed); }

}  // namespace diopi_bindings
