// Matrix products of the DIOPI-named reference in float32 with float32 accumulation, cache-blocked and
// vectorizable (-O3): what a training step on the device runs (mm, bmm, addmm are most of its
// arithmetic). The reference's own kernels (the project's ABI, which diopi-conformance judges) accumulate
// in double, exactly, and serve every other case: another dtype, a result that is not dense row-major.
// float32 accumulation in any order is within the conformance rules (docs/diopi.md).
// DIOPI_REFERENCE_EXACT_MATMUL=1 turns these off (every product through the exact kernels).
#include <algorithm>
#include <cstdlib>
#include <utility>
#include <cstring>
#include <vector>

#include "bridge.h"

namespace {

struct Matrix {  // a 2-d float32 view (or one batch of a 3-d one)
  const float* data = nullptr;
  int64_t rows = 0, cols = 0, row_stride = 0, col_stride = 0;
};

struct Info {
  void* data = nullptr;
  diopiSize_t shape{}, stride{};
  diopiDtype_t dtype = diopi_dtype_unsupported;
  explicit Info(diopiConstTensorHandle_t t) {
    const void* p = nullptr;
    diopiGetTensorDataConst(t, &p);
    data = const_cast<void*>(p);
    diopiGetTensorShape(t, &shape);
    diopiGetTensorStride(t, &stride);
    diopiGetTensorDtype(t, &dtype);
  }
  Matrix matrix(int64_t batch = 0) const {  // the last two dims
    const int64_t d = shape.len;
    const int64_t offset = d == 3 ? batch * stride.data[0] : 0;
    return {static_cast<const float*>(data) + offset, shape.data[d - 2], shape.data[d - 1], stride.data[d - 2],
            stride.data[d - 1]};
  }
  bool dense_rows() const {  // row-major and contiguous in its last two dims
    const int64_t d = shape.len;
    return (shape.data[d - 1] <= 1 || stride.data[d - 1] == 1) &&
           (shape.data[d - 2] <= 1 || stride.data[d - 2] == shape.data[d - 1]);
  }
};

// Whether the bytes two tensors span meet (an out= that is also an input: the reference kernel serves it).
bool overlap(const Info& x, const Info& y) {
  auto span = [](const Info& t) {
    int64_t last = 0;
    for (int64_t d = 0; d < t.shape.len; ++d) last += (t.shape.data[d] - 1) * t.stride.data[d];
    const auto* begin = static_cast<const float*>(t.data);
    return std::pair<const float*, const float*>(begin, begin + last + 1);
  };
  const auto [xb, xe] = span(x);
  const auto [yb, ye] = span(y);
  return xb < ye && yb < xe;
}

constexpr int64_t kBlockK = 64, kBlockN = 256;

// out (rows x cols, row-major, dense) = a @ b; b packed row-major first when it is not. Built twice, for
// x86-64-v3 (AVX2, FMA) and for the baseline; the loader picks the first the CPU runs (GCC function multiversioning).
__attribute__((target_clones("arch=x86-64-v3", "default"))) void product(const Matrix& a, const Matrix& b, float* __restrict out, std::vector<float>& packed) {
  const int64_t n = a.rows, k = a.cols, m = b.cols;
  const float* B = b.data;
  if (!(b.col_stride == 1 && b.row_stride == m)) {
    packed.resize(static_cast<size_t>(k * m));
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < m; ++j) packed[p * m + j] = b.data[p * b.row_stride + j * b.col_stride];
    B = packed.data();
  }
  std::fill(out, out + n * m, 0.0f);
  for (int64_t p0 = 0; p0 < k; p0 += kBlockK) {
    const int64_t p1 = std::min(k, p0 + kBlockK);
    for (int64_t j0 = 0; j0 < m; j0 += kBlockN) {
      const int64_t j1 = std::min(m, j0 + kBlockN);
      for (int64_t i = 0; i < n; ++i) {
        float* __restrict row = out + i * m;
        const float* arow = a.data + i * a.row_stride;
        int64_t p = p0;
        for (; p + 4 <= p1; p += 4) {  // four rows of b per pass: a quarter of the loads and stores of row
          const float x0 = arow[p * a.col_stride], x1 = arow[(p + 1) * a.col_stride],
                      x2 = arow[(p + 2) * a.col_stride], x3 = arow[(p + 3) * a.col_stride];
          const float *__restrict b0 = B + p * m, *__restrict b1 = b0 + m, *__restrict b2 = b1 + m,
                                  *__restrict b3 = b2 + m;
          for (int64_t j = j0; j < j1; ++j) row[j] += x0 * b0[j] + x1 * b1[j] + x2 * b2[j] + x3 * b3[j];
        }
        for (; p < p1; ++p) {
          const float x = arow[p * a.col_stride];
          const float* __restrict brow = B + p * m;
          for (int64_t j = j0; j < j1; ++j) row[j] += x * brow[j];
        }
      }
    }
  }
}

bool all_float(std::initializer_list<const Info*> infos) {
  static const bool exact = [] {
    const char* env = std::getenv("DIOPI_REFERENCE_EXACT_MATMUL");
    return env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0;
  }();
  if (exact) return false;
  for (const Info* i : infos)
    if (i->dtype != diopi_dtype_float32) return false;
  return true;
}

}  // namespace

namespace fast {

diopiError_t diopiMm(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                     diopiConstTensorHandle_t mat2) {
  const Info o(out), a(input), b(mat2);
  if (!all_float({&o, &a, &b}) || o.shape.len != 2 || a.shape.len != 2 || b.shape.len != 2 || !o.dense_rows() ||
      overlap(o, a) || overlap(o, b))
    return diopiNoImplement;
  std::vector<float> packed;
  product(a.matrix(), b.matrix(), static_cast<float*>(o.data), packed);
  return diopiSuccess;
}

diopiError_t diopiBmm(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                      diopiConstTensorHandle_t mat2) {
  const Info o(out), a(input), b(mat2);
  if (!all_float({&o, &a, &b}) || o.shape.len != 3 || a.shape.len != 3 || b.shape.len != 3 || !o.dense_rows() ||
      overlap(o, a) || overlap(o, b))
    return diopiNoImplement;
  std::vector<float> packed;
  for (int64_t i = 0; i < o.shape.data[0]; ++i)
    product(a.matrix(i), b.matrix(i), static_cast<float*>(o.data) + i * o.stride.data[0], packed);
  return diopiSuccess;
}

// out = beta * input + alpha * (mat1 @ mat2), input broadcast from (m), (1, m) or (n, m).
diopiError_t diopiAddmm(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                        diopiConstTensorHandle_t mat1, diopiConstTensorHandle_t mat2, const diopiScalar_t* beta,
                        const diopiScalar_t* alpha) {
  const Info o(out), c(input), a(mat1), b(mat2);
  if (!all_float({&o, &c, &a, &b}) || o.shape.len != 2 || !o.dense_rows() || c.shape.len < 1 || c.shape.len > 2 ||
      overlap(o, a) || overlap(o, b))
    return diopiNoImplement;
  // out may be input itself (autograd accumulating a gradient: addmm_(grad, a, b)): the product then goes to
  // scratch first, so no element of input is overwritten before it is read. Any other overlap: the exact kernel.
  const bool in_place = overlap(o, c);
  if (in_place && !(c.data == o.data && c.shape.len == 2 && c.shape.data[0] == o.shape.data[0] &&
                    c.shape.data[1] == o.shape.data[1] && c.stride.data[0] == o.stride.data[0] &&
                    c.stride.data[1] == o.stride.data[1]))
    return diopiNoImplement;
  const int64_t n = o.shape.data[0], m = o.shape.data[1];
  const int64_t cs1 = c.shape.data[c.shape.len - 1] == 1 ? 0 : c.stride.data[c.shape.len - 1];
  const int64_t cs0 = c.shape.len == 2 && c.shape.data[0] != 1 ? c.stride.data[0] : 0;
  if ((c.shape.data[c.shape.len - 1] != m && c.shape.data[c.shape.len - 1] != 1) ||
      (c.shape.len == 2 && c.shape.data[0] != n && c.shape.data[0] != 1))
    return diopiNoImplement;
  std::vector<float> packed, scratch;
  float* y = static_cast<float*>(o.data);
  if (in_place) {
    scratch.resize(static_cast<size_t>(n * m));
    y = scratch.data();
  }
  product(a.matrix(), b.matrix(), y, packed);
  const float vb = static_cast<float>(bridge::value(beta, 1.0)), va = static_cast<float>(bridge::value(alpha, 1.0));
  const auto* bias = static_cast<const float*>(c.data);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const float term = vb == 0.0f ? 0.0f : vb * bias[i * cs0 + j * cs1];  // beta 0: input ignored (NaN too)
      static_cast<float*>(o.data)[i * m + j] = term + va * y[i * m + j];
    }
  return diopiSuccess;
}

}  // namespace fast
