// Matrix products: mm, bmm, linear (+bias). Accumulation in double.
#include "tensor_io.h"

using namespace diopi_ref;

namespace {

// out[b] = a[b] (n x k) @ w[b] (k x m), or with w given transposed (m x k).
Buffer matmul(const Buffer& a, const Buffer& w, int64_t batch, int64_t n, int64_t k, int64_t m, bool w_transposed) {
  Buffer out(size_t(batch * n * m), 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    const double* A = a.data() + b * n * k;
    const double* W = w.data() + b * k * m;
    double* O = out.data() + b * n * m;
    // Both loop orders add the products of each output in increasing p: the same sums, bit for bit.
    // The transposed weight (linear's) is read along its rows instead of across them.
    if (w_transposed) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
          double sum = 0.0;
          for (int64_t p = 0; p < k; ++p) sum += A[i * k + p] * W[j * k + p];
          O[i * m + j] = sum;
        }
      continue;
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < k; ++p) {
        const double x = A[i * k + p];
        for (int64_t j = 0; j < m; ++j) O[i * m + j] += x * W[p * m + j];
      }
  }
  return out;
}

void require_ndim(diopiConstTensorHandle_t t, int64_t ndim, const char* name) {
  if (t->ndim != ndim)
    fail(DIOPI_ERR_INVALID_ARGUMENT, std::string(name) + " must have " + std::to_string(ndim) + " dims, has " +
                                         std::to_string(t->ndim));
}

}  // namespace

extern "C" {

diopiError_t diopi_aten_mm(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                           diopiConstTensorHandle_t mat2) {
  return guarded(__func__, [&] {
    need(out, "out"), need(self, "self"), need(mat2, "mat2");
    require_float({out, self, mat2});
    require_ndim(self, 2, "self"), require_ndim(mat2, 2, "mat2");
    const int64_t n = self->shape[0], k = self->shape[1], m = mat2->shape[1];
    require_shape(mat2, {k, m}, "mat2");
    require_shape(out, {n, m}, "out");
    WRITE(out, matmul(read(self), read(mat2), 1, n, k, m, false));
  });
}

diopiError_t diopi_aten_bmm(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                            diopiConstTensorHandle_t mat2) {
  return guarded(__func__, [&] {
    need(out, "out"), need(self, "self"), need(mat2, "mat2");
    require_float({out, self, mat2});
    require_ndim(self, 3, "self"), require_ndim(mat2, 3, "mat2");
    const int64_t b = self->shape[0], n = self->shape[1], k = self->shape[2], m = mat2->shape[2];
    require_shape(mat2, {b, k, m}, "mat2");
    require_shape(out, {b, n, m}, "out");
    WRITE(out, matmul(read(self), read(mat2), b, n, k, m, false));
  });
}

diopiError_t diopi_aten_linear(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                               diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias) {
  return guarded(__func__, [&] {
    need(out, "out"), need(input, "input"), need(weight, "weight");
    require_float({out, input, weight, bias});
    require_ndim(weight, 2, "weight");
    const int64_t m = weight->shape[0], k = weight->shape[1];
    Shape in_shape = shape_of(input);
    if (in_shape.empty() || in_shape.back() != k)
      fail(DIOPI_ERR_INVALID_ARGUMENT, "input " + to_string(in_shape) + " does not end in weight's " + std::to_string(k));
    Shape out_shape = in_shape;
    out_shape.back() = m;
    require_shape(out, out_shape, "out");
    const int64_t rows = numel(Shape(in_shape.begin(), in_shape.end() - 1));
    Buffer y = matmul(read(input), read(weight), 1, rows, k, m, true);
    if (bias != nullptr) {
      const Buffer b = read(bias, {m});
      for (size_t i = 0; i < y.size(); ++i) y[i] += b[i % size_t(m)];
    }
    WRITE(out, y);
  });
}

diopiError_t diopi_aten_addmm(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t self,
                              diopiConstTensorHandle_t mat1, diopiConstTensorHandle_t mat2, double beta,
                              double alpha) {
  return guarded(__func__, [&] {
    need(out, "out"), need(self, "self"), need(mat1, "mat1"), need(mat2, "mat2");
    require_float({out, self, mat1, mat2});
    require_ndim(mat1, 2, "mat1"), require_ndim(mat2, 2, "mat2");
    const int64_t n = mat1->shape[0], k = mat1->shape[1], m = mat2->shape[1];
    require_shape(mat2, {k, m}, "mat2");
    require_shape(out, {n, m}, "out");
    Buffer y = matmul(read(mat1), read(mat2), 1, n, k, m, false);
    const Buffer c = read(self, {n, m});  // broadcast (a bias row)
    for (size_t i = 0; i < y.size(); ++i) y[i] = (beta == 0.0 ? 0.0 : beta * c[i]) + alpha * y[i];
    WRITE(out, y);
  });
}

}  // extern "C"
