// float32 tensors that are dense and alike (one shape, row-major, no gaps, the output the input itself or apart
// from it): their elementwise kernels run as one flat loop built twice, for x86-64-v3 (AVX2, FMA) and for the
// baseline, the CPU's choice made at load (dense_float.cpp). The loops compute what the strided loop computes
// (the same expression, -ffp-contract=off), so a tensor's layout never changes a result's bits.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "dense_ops.h"
#include "strided.h"

namespace diopi_ref {

// Whether out and every input are float32, dense, of out's shape, and each input is out or apart from it.
inline bool dense_float32(diopiConstTensorHandle_t out, std::initializer_list<diopiConstTensorHandle_t> inputs) {
  if (out->dtype != DIOPI_DTYPE_FLOAT32 || !contiguous(out)) return false;
  for (diopiConstTensorHandle_t t : inputs) {
    if (t->dtype != DIOPI_DTYPE_FLOAT32 || !contiguous(t) || t->ndim != out->ndim) return false;
    for (int64_t d = 0; d < t->ndim; ++d)
      if (t->shape[d] != out->shape[d]) return false;
    if (t->data != out->data && partly_overlap(t, out, int64_t(sizeof(float)))) return false;
  }
  return true;
}

// Whether the bytes of a (elements of a_size bytes) and of b (b_size) are apart.
inline bool apart(diopiConstTensorHandle_t a, int64_t a_size, diopiConstTensorHandle_t b, int64_t b_size) {
  const auto [ab, ae] = byte_span(a, a_size);
  const auto [bb, be] = byte_span(b, b_size);
  return !(ab < be && bb < ae);
}

// y = silu(x) over n elements, as elementwise.cpp's silu for float32.
void silu_float32(const float* x, float* y, int64_t n);
// g_in = silu'(x) * g over n elements, as elementwise.cpp's silu_backward for float32.
void silu_backward_float32(const float* g, const float* x, float* g_in, int64_t n);

// The maximum of each of `rows` rows of `length` floats and its first index (a NaN wins: the first NaN), as
// reduce.cpp's max.dim over its last dim; exact, so the same results as its buffered path.
void max_rows_float32(const float* x, int64_t rows, int64_t length, float* values, int64_t* indices);

}  // namespace diopi_ref
