// Comparisons with a number, the bitwise and and clamp: the cross-entropy's handling of which targets
// are in range. Comparisons write bool; integers are exact in double below 2^53.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>

#include "tensor_io.h"

using namespace diopi_ref;

namespace {

diopiError_t compare(const char* symbol, diopiTensorHandle_t out, diopiConstTensorHandle_t self, double other,
                     const std::function<bool(double, double)>& f) {
  return guarded(symbol, [&] {
    need(out, "out"), need(self, "self");
    if (out->dtype != DIOPI_DTYPE_BOOL) fail(DIOPI_ERR_DTYPE, "out must be bool");
    require_shape(out, shape_of(self), "out");
    Buffer x = read(self);
    for (double& v : x) v = f(v, other) ? 1.0 : 0.0;
    write_output(out, x, symbol);
  });
}

bool integral(diopiDtype_t d) {
  return d == DIOPI_DTYPE_BOOL || d == DIOPI_DTYPE_INT32 || d == DIOPI_DTYPE_INT64;
}

}  // namespace

extern "C" {

DIOPI_API diopiError_t diopi_aten_ge_Scalar(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                            double other) {
  return compare("diopi_aten_ge_Scalar", out, self, other, [](double a, double b) { return a >= b; });
}

DIOPI_API diopiError_t diopi_aten_lt_Scalar(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                            double other) {
  return compare("diopi_aten_lt_Scalar", out, self, other, [](double a, double b) { return a < b; });
}

DIOPI_API diopiError_t diopi_aten_bitwise_and_Tensor(diopiContextHandle_t, diopiTensorHandle_t out,
                                                     diopiConstTensorHandle_t self, diopiConstTensorHandle_t other) {
  return guarded("diopi_aten_bitwise_and_Tensor", [&] {
    need(out, "out"), need(self, "self"), need(other, "other");
    if (!integral(out->dtype) || !integral(self->dtype) || !integral(other->dtype))
      fail(DIOPI_ERR_DTYPE, "bitwise_and takes bool, int32 or int64 tensors");
    const Shape shape = broadcast_shapes(shape_of(self), shape_of(other));
    require_shape(out, shape, "out");
    Buffer x = read(self, shape);
    const Buffer y = read(other, shape);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<double>(static_cast<int64_t>(x[i]) & static_cast<int64_t>(y[i]));
    write_output(out, x, "diopi_aten_bitwise_and_Tensor");
  });
}

DIOPI_API diopiError_t diopi_aten_clamp(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                        double min, double max) {
  return guarded("diopi_aten_clamp", [&] {
    need(out, "out"), need(self, "self");
    if (std::isnan(min) || std::isnan(max)) fail(DIOPI_ERR_INVALID_ARGUMENT, "clamp bounds must not be NaN");
    require_shape(out, shape_of(self), "out");
    Buffer x = read(self);
    for (double& v : x)
      if (!std::isnan(v)) v = std::min(std::max(v, min), max);
    write_output(out, x, "diopi_aten_clamp");
  });
}

}  // extern "C"
