// The dense float32 loops of dense_float.h. Each is built for x86-64-v3 and for the baseline (target_clones, as
// deeplink/fast_matmul.cpp); this file is compiled with -ffp-contract=off (CMakeLists.txt) so the AVX2 clone
// fuses no multiply-add the baseline and the strided loop do not: the same bits on every CPU and layout.
#include "dense_float.h"

#include <cmath>

#include "cpu_clones.h"
#include "silu_math.h"

namespace diopi_ref {

DIOPI_REF_CPU_CLONES void silu_float32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = silu_float(x[i]);
}

DIOPI_REF_CPU_CLONES void silu_backward_float32(const float* g, const float* x, float* g_in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g_in[i] = silu_grad_float(g[i], x[i]);
}

// ivdep: an output may be an input, element for element (in place); no element depends on another.
DIOPI_REF_CPU_CLONES void elementwise_float32(DenseOp op, float* y, const float* a, const float* b, const float* c,
                                              int64_t n, double s) {
#define DENSE_LOOP(expr)                     \
  _Pragma("GCC ivdep") for (int64_t i = 0; i < n; ++i) y[i] = float(expr); \
  break;
  switch (op) {
    case DenseOp::kAdd: DENSE_LOOP(double(a[i]) + s * double(b[i]))
    case DenseOp::kSub: DENSE_LOOP(double(a[i]) - s * double(b[i]))
    case DenseOp::kMul: DENSE_LOOP(double(a[i]) * double(b[i]))
    case DenseOp::kDiv: DENSE_LOOP(double(a[i]) / double(b[i]))
    case DenseOp::kLerp: DENSE_LOOP(double(a[i]) + s * (double(b[i]) - double(a[i])))
    case DenseOp::kSqrt: DENSE_LOOP(std::sqrt(double(a[i])))
    case DenseOp::kAddcmul: DENSE_LOOP(double(a[i]) + s * double(b[i]) * double(c[i]))
    case DenseOp::kAddcdiv: DENSE_LOOP(double(a[i]) + s * double(b[i]) / double(c[i]))
  }
#undef DENSE_LOOP
}

// Two passes a row: the maximum and whether there is a NaN (branch-free, vectorized), then the first index of
// the maximum (or of the first NaN).
DIOPI_REF_CPU_CLONES void max_rows_float32(const float* x, int64_t rows, int64_t length, float* values,
                                           int64_t* indices) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * length;
    float m = row[0];
    int nan = 0;
    for (int64_t i = 0; i < length; ++i) {
      nan |= row[i] != row[i];
      m = row[i] > m ? row[i] : m;
    }
    int64_t at = 0;
    if (nan) {
      while (row[at] == row[at]) ++at;
    } else {
      while (row[at] != m) ++at;
    }
    values[r] = row[at], indices[r] = at;
  }
}

}  // namespace diopi_ref
