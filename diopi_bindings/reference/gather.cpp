// gather: out[i][j][k] = self[i][index[i][j][k]][k] along dim (here dim 1), the cross-entropy's pick of
// each target's log-probability.
#include <string>

#include "tensor_io.h"

using namespace diopi_ref;

extern "C" DIOPI_API diopiError_t diopi_aten_gather(diopiContextHandle_t, diopiTensorHandle_t out,
                                                    diopiConstTensorHandle_t self, diopiConstTensorHandle_t index,
                                                    int64_t dim) {
  return guarded("diopi_aten_gather", [&] {
    need(out, "out"), need(self, "self"), need(index, "index");
    require_index(index, "index");
    const Shape shape = shape_of(self), idx_shape = shape_of(index);
    const int64_t nd = int64_t(shape.size());
    if (int64_t(idx_shape.size()) != nd)
      fail(DIOPI_ERR_INVALID_ARGUMENT, "index must have as many dims as self (" + std::to_string(nd) + ")");
    const int64_t d = nd == 0 ? 0 : normalize_dim(dim, nd);
    for (int64_t k = 0; k < nd; ++k)
      if (k != d && idx_shape[size_t(k)] > shape[size_t(k)])
        fail(DIOPI_ERR_INVALID_ARGUMENT, "index " + to_string(idx_shape) + " is larger than self " + to_string(shape) +
                                             " outside dim " + std::to_string(d));
    require_shape(out, idx_shape, "out");
    const Buffer values = read(self);
    const std::vector<int64_t> idx = read_index(index);
    Shape stride(size_t(nd), 1);  // row-major strides of self
    for (int64_t k = nd - 2; k >= 0; --k) stride[size_t(k)] = stride[size_t(k + 1)] * shape[size_t(k + 1)];
    Buffer result(idx.size());
    Shape coord(size_t(nd), 0);
    for (size_t lin = 0; lin < idx.size(); ++lin) {
      int64_t source = 0;
      for (int64_t k = 0; k < nd; ++k) {
        int64_t c = coord[size_t(k)];
        if (k == d) {
          c = idx[lin];
          if (c < 0 || c >= shape[size_t(d)])
            fail(DIOPI_ERR_INVALID_ARGUMENT, "index " + std::to_string(c) + " out of range for dim " +
                                                 std::to_string(d) + " of size " + std::to_string(shape[size_t(d)]));
        }
        source += c * stride[size_t(k)];
      }
      result[lin] = values[size_t(source)];
      for (int64_t k = nd - 1; k >= 0; --k) {  // next coordinate of the index, row-major
        if (++coord[size_t(k)] < idx_shape[size_t(k)]) break;
        coord[size_t(k)] = 0;
      }
    }
    write_output(out, result, "diopi_aten_gather");
  });
}
