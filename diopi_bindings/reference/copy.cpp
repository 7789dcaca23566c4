// Data movement: cast, copy (broadcast), fill, clone into any output strides (contiguous, transpose).
#include "tensor_io.h"

using namespace diopi_ref;

extern "C" {

diopiError_t diopi_aten__to_copy(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return guarded(__func__, [&] {
    need(out, "out"), need(self, "self");
    require_shape(out, shape_of(self), "out");
    WRITE(out, read(self));
  });
}

diopiError_t diopi_aten_copy_(diopiContextHandle_t, diopiTensorHandle_t self, diopiConstTensorHandle_t src) {
  return guarded(__func__, [&] {
    need(self, "self"), need(src, "src");
    WRITE(self, read(src, shape_of(self)));
  });
}

diopiError_t diopi_aten_fill__Scalar(diopiContextHandle_t, diopiTensorHandle_t self, double value) {
  return guarded(__func__, [&] {
    need(self, "self");
    WRITE(self, Buffer(size_t(numel(shape_of(self))), value));
  });
}

diopiError_t diopi_aten_clone(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self) {
  return guarded(__func__, [&] {
    need(out, "out"), need(self, "self");
    require_shape(out, shape_of(self), "out");
    if (out->dtype != self->dtype) fail(DIOPI_ERR_DTYPE, "clone keeps the dtype: out and self differ");
    WRITE(out, read(self));
  });
}

}  // extern "C"
