// exp in float32 for the reference's float32/bf16/fp16 kernels (exp, sigmoid, silu, softmax, log_softmax and
// log_softmax's backward): libm's double exp is one call per element and does not vectorize; this is
// straight-line float arithmetic with selects, so loops over it do. At most 0.99 ulp from the exact exp over
// every float32 input (tests/diopi_bindings/test_diopi_fast_exp.py checks 2 ulp against float64 torch);
// float64 kernels keep std::exp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace diopi_ref {

inline float float_from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// exp(n ln 2 + r) for |r| <= ln 2 / 2: exp(r) by Cephes' degree-6 polynomial in float32 (about 1 ulp), then 2^n
// as two normal powers of two (n in [-150, 128]), so a subnormal result rounds once, at the last product.
inline float exp_of_reduced(float r, int32_t ni) {
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t half = ni / 2;  // 2^n = 2^half * 2^(n - half), both normal
  const float s1 = float_from_bits(uint32_t(half + 127) << 23);
  const float s2 = float_from_bits(uint32_t(ni - half + 127) << 23);
  return p * s1 * s2;
}

// exp(x) rounded to float32, for x a float32 value or a difference of two (softmax's x - max): n = round(x / ln 2)
// and r = x - n ln 2 in double (exact enough that rounding the argument costs nothing: softmax's arguments reach
// -100 and a float32 argument would carry up to 2^-24 * 100 relative error into the result), exp(r), |r| <=
// ln 2 / 2, by Cephes' degree-6 polynomial in float32 (about 1 ulp), then 2^n as two normal powers of two, so a
// subnormal result rounds once, at the last product. Selects, no branches, so loops over it vectorize.
inline float fast_exp(double x) {
  constexpr double kMax = 88.7228390;             // exp(x) rounds to inf in float32 above this
  constexpr double kMin = -103.97207708399179;  // ln 2^-150: exp(x) rounds to 0 at and below this
  constexpr double kLog2e = 1.4426950408889634, kLn2 = 0.6931471805599453;
  constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer (ties to even)
  const double xc = x > kMax ? kMax : (x < kMin ? kMin : x);  // also keeps n in [-150, 128]
  const double t = xc * kLog2e + kRound;
  const double n = t - kRound;
  int64_t tb, rb;
  std::memcpy(&tb, &t, sizeof t);
  std::memcpy(&rb, &kRound, sizeof rb);
  const int32_t ni = int32_t(tb - rb);
  const float r = float(xc - n * kLn2);
  const float y = exp_of_reduced(r, ni);
  const float inf = std::numeric_limits<float>::infinity();
  return x != x ? float(x) : (x > kMax ? inf : (x <= kMin ? 0.0f : y));
}

// fast_exp with a float32 argument, all in float32 (8 lanes where the loop is built for AVX2): n = round(x / ln 2)
// by the 1.5 * 2^23 rounding trick, r = x - n ln 2 with ln 2 split in two (Cody and Waite: n * kLn2Hi is exact for
// |n| <= 150, and x - n * kLn2Hi is exact by Sterbenz), then the same polynomial and scaling as fast_exp.
inline float fast_expf(float x) {
  constexpr float kMax = 88.7228390f;    // exp(x) rounds to inf in float32 above this
  constexpr float kMin = -103.972076f;  // ln 2^-150: exp(x) rounds to 0 at and below this
  constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (ties to even)
  const float xc = x > kMax ? kMax : (x < kMin ? kMin : x);  // also keeps n in [-150, 128]
  const float t = xc * kLog2e + kRound;
  const float n = t - kRound;
  int32_t tb, rb;
  std::memcpy(&tb, &t, sizeof t);
  std::memcpy(&rb, &kRound, sizeof rb);
  const int32_t ni = tb - rb;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  const float y = exp_of_reduced(r, ni);
  const float inf = std::numeric_limits<float>::infinity();
  return x != x ? x : (x > kMax ? inf : (x <= kMin ? 0.0f : y));
}

// exp for a kernel whose elements are of type T: float32 arithmetic for float32/bf16/fp16 (T other than double),
// the exact double exp for float64 tensors.
template <class T>
double exp_as(double x) {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, double>) return std::exp(x);
  else return double(fast_exp(x));
}

}  // namespace diopi_ref
