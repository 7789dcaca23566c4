// float16 and bfloat16 bits to and from float (round to nearest even): shared by the buffered reads and
// writes of tensor_io.cpp and the strided loops of strided.h, so both give the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace diopi_ref {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400) == 0);
      bits = sign | (uint32_t(127 - 15 - e) << 23) | ((m & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = (x >> 16) & 0x8000;
  if ((x & 0x7fffffffu) >= 0x7f800000u) return sign | 0x7c00 | ((x & 0x7fffffu) ? 0x200 : 0);
  const float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < 6.103515625e-05f) {  // subnormal half: round to a multiple of 2^-24
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  // normal: round the 23-bit mantissa to 10 bits, nearest even
  uint32_t mag = x & 0x7fffffffu;
  mag += 0x0fff + ((mag >> 13) & 1);
  return sign | uint16_t(((mag >> 13) - ((127 - 15) << 10)) & 0x7fff);
}

inline float bf16_to_float(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // NaN stays NaN
  x += 0x7fff + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

}  // namespace diopi_ref
