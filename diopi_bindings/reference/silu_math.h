// silu and its gradient per element type, shared by the strided, buffered and dense loops (elementwise.cpp,
// dense_float.cpp) so that each gives the same bits. float32/bf16/fp16 (T other than double): the exp in float32
// arithmetic (fast_exp.h), the rest in double, rounded once by the caller; float64: libm's exp.
#pragma once

#include <cmath>
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

template <class T>
double silu_of(double x) {
  return x * sigmoid_of<T>(x);
}

// g * s * (1 + x (1 - s)), s = 1 / (1 + e), e = exp(-x). For float types 1 - s is taken as e s, not by the
// subtraction: e's relative error (<= 1 ulp of float32) then stays relative in 1 - s, where 1 - s of a rounded s
// would carry s's absolute error (x = 10: 1 - s = 4.5e-5 with an error of 6e-8, 5 units in the result). e = inf
// (x < -88.7) means s = 0 and 1 - s = 1.
template <class T>
double silu_grad_of(double g, double x) {
  if constexpr (is_double_v<T>) {
    const double s = 1.0 / (1.0 + std::exp(-x));
    return g * s * (1.0 + x * (1.0 - s));
  } else {
    const double e = fast_exp(-x);
    const double s = 1.0 / (1.0 + e);
    const double one_minus_s = e == HUGE_VAL ? 1.0 : e * s;
    return g * s * (1.0 + x * one_minus_s);
  }
}

}  // namespace diopi_ref
