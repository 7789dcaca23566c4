// Data movement: cast, copy (broadcast), fill, clone into any output strides (contiguous, transpose),
// concatenation, and the backward of slicing (the gradient placed into zeros).
#include <algorithm>

#include "strided.h"
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

diopiError_t diopi_aten_slice_backward(diopiContextHandle_t, diopiTensorHandle_t out,
                                       diopiConstTensorHandle_t grad_output, diopiSize_t input_sizes, int64_t dim,
                                       int64_t start, int64_t end, int64_t step) {
  return guarded(__func__, [&] {
    need(out, "out"), need(grad_output, "grad_output");
    const Shape shape(input_sizes.data, input_sizes.data + input_sizes.len);
    require_shape(out, shape, "out");
    const int64_t d = normalize_dim(dim, int64_t(shape.size()));
    if (step <= 0) fail(DIOPI_ERR_INVALID_ARGUMENT, "step must be positive, got " + std::to_string(step));
    const int64_t size = shape[size_t(d)];
    auto clamp = [size](int64_t i) { return std::min(std::max(i < 0 ? i + size : i, int64_t(0)), size); };
    const int64_t first = clamp(start), last = std::max(clamp(end), first);
    Shape grad_shape = shape;
    grad_shape[size_t(d)] = (last - first + step - 1) / step;
    require_shape(grad_output, grad_shape, "grad_output");
    const Buffer g = read(grad_output);
    Buffer y(size_t(numel(shape)), 0.0);
    const Split so = split_at(shape, d), sg = split_at(grad_shape, d);
    for (int64_t o = 0; o < sg.outer; ++o)
      for (int64_t i = 0; i < sg.length; ++i)
        for (int64_t in = 0; in < sg.inner; ++in)
          y[size_t((o * so.length + first + i * step) * so.inner + in)] = g[size_t((o * sg.length + i) * sg.inner + in)];
    WRITE(out, y);
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
    if (!planted_wrong(kernel_name(__func__)) && fill_strided(self, value)) return;
    WRITE(self, Buffer(size_t(numel(shape_of(self))), value));
  });
}

diopiError_t diopi_aten_cat(diopiContextHandle_t, diopiTensorHandle_t out, diopiTensorList_t tensors, int64_t dim) {
  return guarded(__func__, [&] {
    need(out, "out");
    if (tensors.len < 1) fail(DIOPI_ERR_INVALID_ARGUMENT, "cat needs at least one tensor");
    const Shape shape = shape_of(out);
    const int64_t d = normalize_dim(dim, int64_t(shape.size()));
    const Split so = split_at(shape, d);
    Buffer y(size_t(numel(shape)));
    int64_t offset = 0;  // along dim, in the output
    for (int64_t t = 0; t < tensors.len; ++t) {
      diopiConstTensorHandle_t part = need(tensors.data[t], "tensors[i]");
      Shape part_shape = shape_of(part);
      if (part_shape.size() == 1 && part_shape[0] == 0) continue;  // torch's legacy empty tensor
      Shape expected = shape;
      if (part_shape.size() != shape.size())
        fail(DIOPI_ERR_INVALID_ARGUMENT, "tensors[" + std::to_string(t) + "] has shape " + to_string(part_shape) +
                                             ", out has " + std::to_string(shape.size()) + " dims");
      expected[size_t(d)] = part_shape[size_t(d)];
      require_shape(part, expected, "tensors[i]");
      const Buffer x = read(part);
      const int64_t length = part_shape[size_t(d)];
      for (int64_t o = 0; o < so.outer; ++o)
        for (int64_t i = 0; i < length; ++i)
          for (int64_t in = 0; in < so.inner; ++in)
            y[size_t((o * so.length + offset + i) * so.inner + in)] = x[size_t((o * length + i) * so.inner + in)];
      offset += length;
    }
    if (offset != so.length)
      fail(DIOPI_ERR_INVALID_ARGUMENT, "the tensors add up to " + std::to_string(offset) + " along dim " +
                                           std::to_string(d) + ", out has " + std::to_string(so.length));
    WRITE(out, y);
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
