// Factories: arange (the rotary positions). The framework sizes out from start, end and step.
#include <cmath>
#include <string>

#include "tensor_io.h"

using namespace diopi_ref;

extern "C" DIOPI_API diopiError_t diopi_aten_arange_start_step(diopiContextHandle_t, diopiTensorHandle_t out,
                                                               double start, double end, double step) {
  return guarded("diopi_aten_arange_start_step", [&] {
    need(out, "out");
    if (step == 0.0 || !std::isfinite(start) || !std::isfinite(end) || !std::isfinite(step))
      fail(DIOPI_ERR_INVALID_ARGUMENT, "start, end and step must be finite and step nonzero");
    const double count = std::ceil((end - start) / step);
    const int64_t n = count > 0 ? int64_t(count) : 0;
    require_shape(out, Shape{n}, "out");
    Buffer result(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) result[size_t(i)] = start + double(i) * step;
    WRITE(out, result);
  });
}
