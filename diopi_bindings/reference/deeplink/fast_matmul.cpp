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
#include "../cpu_clones.h"

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

typedef float Lanes __attribute__((vector_size(32)));  // 8 floats: one AVX register, two SSE ones
// The helpers below are always inlined into each clone of product, so no vector crosses a call (-Wpsabi
// warns of the calling convention of 32-byte vectors, which is never used).
#pragma GCC diagnostic ignored "-Wpsabi"

__attribute__((always_inline)) inline Lanes load8(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
__attribute__((always_inline)) inline void store8(float* p, const Lanes& v) { __builtin_memcpy(p, &v, sizeof v); }

// out[i..i+3][j..j+15] += a[i..i+3][p0..p1) @ b[p0..p1)[j..j+15], kept in registers over p: the inner kernel
// of product, which loads and stores out once per block of k instead of once per element of k.
__attribute__((always_inline)) inline void block4x16(const Matrix& a, const float* B, int64_t m, float* out, int64_t i, int64_t j, int64_t p0,
                      int64_t p1) {
  Lanes acc[4][2];
  for (int r = 0; r < 4; ++r) {
    acc[r][0] = load8(out + (i + r) * m + j);
    acc[r][1] = load8(out + (i + r) * m + j + 8);
  }
  for (int64_t p = p0; p < p1; ++p) {
    const Lanes b0 = load8(B + p * m + j), b1 = load8(B + p * m + j + 8);
    for (int r = 0; r < 4; ++r) {
      const float x = a.data[(i + r) * a.row_stride + p * a.col_stride];
      acc[r][0] += x * b0;
      acc[r][1] += x * b1;
    }
  }
  for (int r = 0; r < 4; ++r) {
    store8(out + (i + r) * m + j, acc[r][0]);
    store8(out + (i + r) * m + j + 8, acc[r][1]);
  }
}

// out (rows x cols, row-major, dense) = a @ b; b packed row-major first when it is not. Built twice, for
// x86-64-v3 (AVX2, FMA) and for the baseline; the loader picks the first the CPU runs (GCC function
// multiversioning). Every element accumulates its k terms in order, in float32.
DIOPI_REF_CPU_CLONES void product(const Matrix& a, const Matrix& b, float* __restrict out, std::vector<float>& packed) {
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
      const int64_t j16 = j0 + (j1 - j0) / 16 * 16;  // columns the 4x16 kernel covers
      int64_t i = 0;
      for (; i + 4 <= n; i += 4)
        for (int64_t j = j0; j < j16; j += 16) block4x16(a, B, m, out, i, j, p0, p1);
      // the rest: rows past the last group of 4 (all columns), and the columns past j16 (rows of the groups)
      for (int64_t r = 0; r < n; ++r) {
        const int64_t from = r < i ? j16 : j0;
        if (from >= j1) continue;
        float* __restrict row = out + r * m;
        for (int64_t p = p0; p < p1; ++p) {
          const float x = a.data[r * a.row_stride + p * a.col_stride];
          const float* __restrict brow = B + p * m;
          for (int64_t j = from; j < j1; ++j) row[j] += x * brow[j];
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
