// Masking: the lower triangle (a causal mask) and the elementwise choice between two tensors.
#include "tensor_io.h"

using namespace diopi_ref;

extern "C" {

diopiError_t diopi_aten_tril(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                             int64_t diagonal) {
  return guarded(__func__, [&] {
    need(out, "out"), need(self, "self");
    const Shape shape = shape_of(self);
    if (shape.size() < 2) fail(DIOPI_ERR_INVALID_ARGUMENT, "tril needs at least 2 dims, self has " + to_string(shape));
    require_shape(out, shape, "out");
    Buffer x = read(self);
    const int64_t rows = shape[shape.size() - 2], cols = shape.back();
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t col = int64_t(i) % cols, row = (int64_t(i) / cols) % rows;
      if (col - row > diagonal) x[i] = 0.0;
    }
    WRITE(out, x);
  });
}

diopiError_t diopi_aten_where_self(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t condition,
                                   diopiConstTensorHandle_t self, diopiConstTensorHandle_t other) {
  return guarded(__func__, [&] {
    need(out, "out"), need(condition, "condition"), need(self, "self"), need(other, "other");
    if (condition->dtype != DIOPI_DTYPE_BOOL) fail(DIOPI_ERR_DTYPE, "condition must be bool");
    const Shape shape = broadcast_shapes(broadcast_shapes(shape_of(condition), shape_of(self)), shape_of(other));
    require_shape(out, shape, "out");
    const Buffer c = read(condition, shape), a = read(self, shape), b = read(other, shape);
    Buffer y(a.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = c[i] != 0.0 ? a[i] : b[i];
    WRITE(out, y);
  });
}

}  // extern "C"
