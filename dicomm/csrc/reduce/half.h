// Scalar float16/bfloat16 <-> float32 conversions, round to nearest even, matching torch's
// c10::Half and c10::BFloat16 (float16: the branch-free forms of the FP16 library c10 uses too).
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

namespace dicomm::reduction {

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t{h} << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  // NaN: canonical quiet NaN, like c10
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t w = uint32_t{h} << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // Normal numbers: shift the exponent and mantissa into place and rebias by scaling.
  const float normalized = bits_to_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormals: build 0.5 + mantissa * 2^-24 and subtract the 0.5.
  const float denormalized = bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result =
      sign | (two_w < (1u << 27) ? float_to_bits(denormalized) : float_to_bits(normalized));
  return bits_to_float(result);
}

inline uint16_t float_to_fp16(float f) {
  // Scaling up then down rounds the mantissa to 10 bits (nearest even) in the FPU itself.
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = float_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = bits_to_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

}  // namespace dicomm::reduction
