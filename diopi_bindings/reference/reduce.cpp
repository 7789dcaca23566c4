// Reductions: sum, mean, max (with indices), vector norm. An empty dim list reduces every dim.
#include <cmath>
#include <limits>

#include "dense_float.h"
#include "strided.h"
#include "tensor_io.h"

using namespace diopi_ref;

namespace {

std::vector<int64_t> dims_of(diopiSize_t dim) { return std::vector<int64_t>(dim.data, dim.data + dim.len); }

void require_out_shape(diopiConstTensorHandle_t out, const Reduction& r, bool keepdim) {
  require_shape(out, keepdim ? r.out_shape : r.out_shape_squeezed, "out");
}

// acc[slot] += x over self's elements in row-major order, as the buffered path adds them (the same bits),
// read in place through self's strides; false for a dtype that is not floating.
bool sum_strided(diopiConstTensorHandle_t self, const Reduction& r, Buffer& acc) {
  Shape shape = shape_of(self);
  std::array<Shape, 2> strides{Shape(self->strides, self->strides + self->ndim), r.slot_strides};
  coalesce(shape, strides);
  return with_float_type(self->dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = static_cast<const T*>(self->data);
    double* a = acc.data();
    walk(shape, strides, [&](const std::array<int64_t, 2>& off, int64_t len, const std::array<int64_t, 2>& st) {
      if (st[1] == 0) {  // a run inside one group: one running sum, in order
        double s = a[off[1]];
        for (int64_t i = 0; i < len; ++i) s += load_double(x + off[0] + i * st[0]);
        a[off[1]] = s;
        return;
      }
      for (int64_t i = 0; i < len; ++i) a[off[1] + i * st[1]] += load_double(x + off[0] + i * st[0]);
    });
  });
}

// Sum of each reduction group; with `mean`, divided by the group size.
diopiError_t sum_kernel(const char* symbol, diopiTensorHandle_t out, diopiConstTensorHandle_t self, diopiSize_t dim,
                        bool keepdim, bool mean) {
  return guarded(symbol, [&] {
    need(out, "out"), need(self, "self");
    require_float({out, self});
    const Reduction r = reduction(shape_of(self), dims_of(dim), /*with_slots=*/false);
    require_out_shape(out, r, keepdim);
    Buffer acc(size_t(numel(r.out_shape)), 0.0);
    if (!sum_strided(self, r, acc)) {
      const Buffer x = read(self);
      const Reduction slots = reduction(shape_of(self), dims_of(dim));
      for (size_t i = 0; i < x.size(); ++i) acc[slots.slot[i]] += x[i];
    }
    if (mean)
      for (double& v : acc) v /= double(r.group_size);  // 0/0: NaN, as torch gives for an empty mean
    write_output(out, acc, symbol);
  });
}

}  // namespace

extern "C" {

diopiError_t diopi_aten_sum_dim_IntList(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                        diopiSize_t dim, bool keepdim) {
  return sum_kernel(__func__, out, self, dim, keepdim, false);
}

diopiError_t diopi_aten_mean_dim(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                                 diopiSize_t dim, bool keepdim) {
  return sum_kernel(__func__, out, self, dim, keepdim, true);
}

diopiError_t diopi_aten_max_dim(diopiContextHandle_t, diopiTensorHandle_t values, diopiTensorHandle_t indices,
                                diopiConstTensorHandle_t self, int64_t dim, bool keepdim) {
  return guarded(__func__, [&] {
    need(values, "values"), need(indices, "indices"), need(self, "self");
    require_float({values, self});
    require_index(indices, "indices");
    const Shape shape = shape_of(self);
    const int64_t d = normalize_dim(dim, self->ndim);
    const Reduction r = reduction(shape, self->ndim ? std::vector<int64_t>{d} : std::vector<int64_t>{},
                                  /*with_slots=*/false);  // the shapes only: a slot per element costs what max does
    require_out_shape(values, r, keepdim);
    require_out_shape(indices, r, keepdim);
    if (self->ndim && shape[d] == 0) fail(DIOPI_ERR_INVALID_ARGUMENT, "max over an empty dim");
    const Split s = split_at(shape, d);
    if (self->ndim > 0 && s.inner == 1 && self->dtype == DIOPI_DTYPE_FLOAT32 && values->dtype == DIOPI_DTYPE_FLOAT32 &&
        indices->dtype == DIOPI_DTYPE_INT64 && contiguous(self) && contiguous(values) && contiguous(indices) &&
        apart(values, 4, self, 4) && apart(indices, 8, self, 4) && apart(indices, 8, values, 4) &&
        !planted_wrong(__func__)) {  // the last dim of a dense float32 tensor: the loss's row maximum
      max_rows_float32(static_cast<const float*>(self->data), s.outer, s.length, static_cast<float*>(values->data),
                       static_cast<int64_t*>(indices->data));
      return;
    }
    const Buffer x = read(self);
    Buffer best(size_t(s.outer * s.inner)), where(size_t(s.outer * s.inner));
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t in = 0; in < s.inner; ++in) {
        double v = -std::numeric_limits<double>::infinity();
        int64_t at = 0;
        for (int64_t i = 0; i < s.length; ++i) {
          const double x_i = x[size_t((o * s.length + i) * s.inner + in)];
          if (x_i > v || std::isnan(x_i)) {  // NaN wins, as in torch
            v = x_i, at = i;
            if (std::isnan(x_i)) break;
          }
        }
        best[size_t(o * s.inner + in)] = v, where[size_t(o * s.inner + in)] = double(at);
      }
    WRITE(values, best);
    WRITE(indices, where);
  });
}

diopiError_t diopi_aten_linalg_vector_norm(diopiContextHandle_t, diopiTensorHandle_t out,
                                           diopiConstTensorHandle_t self, double ord, diopiSize_t dim, bool keepdim) {
  return guarded(__func__, [&] {
    need(out, "out"), need(self, "self");
    require_float({out, self});
    const Reduction r = reduction(shape_of(self), dims_of(dim));
    require_out_shape(out, r, keepdim);
    const Buffer x = read(self);
    const size_t slots = size_t(numel(r.out_shape));
    Buffer acc(slots, std::isinf(ord) && ord < 0 ? std::numeric_limits<double>::infinity() : 0.0);
    for (size_t i = 0; i < x.size(); ++i) {
      const double a = std::fabs(x[i]);
      double& s = acc[r.slot[i]];
      if (std::isinf(ord)) s = ord > 0 ? std::max(s, a) : std::min(s, a);
      else if (ord == 0) s += a != 0.0;
      else s += std::pow(a, ord);
    }
    if (!std::isinf(ord) && ord != 0)
      for (double& s : acc) s = std::pow(s, 1.0 / ord);
    WRITE(out, acc);
  });
}

}  // extern "C"
