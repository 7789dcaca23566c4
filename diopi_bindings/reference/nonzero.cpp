// nonzero: an output whose size depends on the data. The kernel counts first, then asks the framework for
// the output through ctx->require_tensor (so the memory is the framework's, on the call's device), writes
// it and hands its handle back through `out`. A boolean mask index (x[mask]) is nonzero's columns.
#include <string>

#include "tensor_io.h"

using namespace diopi_ref;

extern "C" {

diopiError_t diopi_aten_nonzero(diopiContextHandle_t ctx, diopiTensorHandle_t* out, diopiConstTensorHandle_t self) {
  return guarded(__func__, [&] {
    need(self, "self");
    if (out == nullptr) fail(DIOPI_ERR_INVALID_ARGUMENT, "out is NULL (expected where to store the result's handle)");
    if (ctx == nullptr || ctx->require_tensor == nullptr)
      fail(DIOPI_ERR_INVALID_ARGUMENT, "the context has no require_tensor: nonzero's output size depends on the data");
    const Shape shape = shape_of(self);
    const Buffer x = read(self);
    std::vector<int64_t> hits;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != 0.0) hits.push_back(int64_t(i));  // NaN != 0: counts, as in torch
    const int64_t ndim = int64_t(shape.size());
    const Shape out_shape{int64_t(hits.size()), ndim};
    diopiTensorHandle_t result = nullptr;
    const diopiError_t code = ctx->require_tensor(ctx->allocator_state, &result, 2, out_shape.data(), DIOPI_DTYPE_INT64);
    if (code != DIOPI_SUCCESS || result == nullptr)
      fail(code != DIOPI_SUCCESS ? code : DIOPI_ERR_ALLOCATION,
           "the framework did not allocate the output " + to_string(out_shape));
    Buffer coords(hits.size() * size_t(ndim));
    for (size_t h = 0; h < hits.size(); ++h) {
      int64_t rest = hits[h];
      for (int64_t d = ndim - 1; d >= 0; --d) {
        coords[h * size_t(ndim) + size_t(d)] = double(rest % shape[size_t(d)]);
        rest /= shape[size_t(d)];
      }
    }
    WRITE(result, coords);
    *out = result;
  });
}

}  // extern "C"
