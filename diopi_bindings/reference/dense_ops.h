// The dense float32 loops of dense_float.cpp that the elementwise kernels share (elementwise.cpp's dense
// operands, strided.h's dense runs): each computed in double and rounded once by the same expression as the
// kernel's own, so a result's bits do not depend on which loop computed it.
#pragma once

#include <cstdint>

namespace diopi_ref {

// y = a + s b, a - s b, a * b, a / b, a + s (b - a) (lerp), sqrt(a), a + s b c (addcmul), a + s b / c (addcdiv).
// y may be one of the operands (the same elements).
enum class DenseOp { kAdd, kSub, kMul, kDiv, kLerp, kSqrt, kAddcmul, kAddcdiv };
void elementwise_float32(DenseOp op, float* y, const float* a, const float* b, const float* c, int64_t n,
                         double s);

// A kernel's dense loop for strided.h's runs: none (on = false), or op with its scalar.
struct DenseRun {
  bool on = false;
  DenseOp op = DenseOp::kAdd;
  double s = 0.0;
};

}  // namespace diopi_ref
