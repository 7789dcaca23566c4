// silu and its gradient per element type, shared by the strided, buffered and dense loops (elementwise.cpp,
// dense_float.cpp) so that each gives the same bits. float32/bf16/fp16 (T other than double): all in float32
// arithmetic (fast_expf, fast_exp.h), so a dense float32 loop runs 8 lanes wide under AVX2; float64: libm's exp.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "fast_exp.h"

namespace diopi_ref {

template <class T>
constexpr bool is_double_v = std::is_same_v<std::remove_cv_t<T>, double>;

template <class T>
double sigmoid_of(double x) {
  if constexpr (is_double_v<T>) return 1.0 / (1.0 + std::exp(-x));
  else return double(1.0f / (1.0f + fast_exp(-x)));
}

// x s = x / (1 + e), e = exp(-x): one division instead of 1 / (1 + e) and a product.
inline float silu_float(float x) { return x / (1.0f + fast_expf(-x)); }

// g s (1 + x (1 - s)), s = 1 / (1 + e), e = exp(-x), as g (1 + x q) / (1 + e) with q = 1 - s = e / (1 + e):
// taking 1 - s as e / (1 + e), not by a subtraction, keeps e's relative error (about 1 ulp) relative in it,
// where 1 - s of a rounded s would carry s's absolute error (x = 10: 1 - s = 4.5e-5 with an error of 6e-8, 5
// units in the result). The exp is float32; the four operations after it are double (4 lanes under AVX2), rounded
// once: in float32 their six roundings beside the exp's ulp reach 2 units of the magnitude. e = inf (x < -88.7)
// means s = 0 and q = 1: the result is g 0 (1 + x), NaN for x = -inf as in torch. Both arms are computed and one
// selected, so a loop over it vectorizes (no division under a condition).
inline float silu_grad_float(float g, float x) {
  const float e = fast_expf(-x);
  const bool saturated = e == std::numeric_limits<float>::infinity();
  const double d = 1.0 + double(e);
  const double u = 1.0 + double(x) * (saturated ? 1.0 : double(e) / d);
  const double product = double(g) * u;
  return float(saturated ? product * 0.0 : product / d);
}

template <class T>
double silu_of(double x) {
  if constexpr (is_double_v<T>) return x * sigmoid_of<T>(x);
  else return double(silu_float(float(x)));  // x is a T value: exact in float
}

template <class T>
double silu_grad_of(double g, double x) {
  if constexpr (is_double_v<T>) {
    const double s = 1.0 / (1.0 + std::exp(-x));
    return g * s * (1.0 + x * (1.0 - s));
  } else {
    return double(silu_grad_float(float(g), float(x)));
  }
}

}  // namespace diopi_ref
