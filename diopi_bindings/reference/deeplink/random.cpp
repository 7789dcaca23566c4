// The reference's random functions under DIOPI's names (the reference's own ABI has none): counter-based
// numbers, element i of a call drawing from (seed, offset + i) through a 64-bit mixer, so a seed and an
// offset give the same numbers in any order, on any thread. The generator's offset advances by what a call
// drew (diopiGeneratorSetSeedAndOffset). float32, float64 and bfloat16 results; other dtypes are declined
// (diopiDtypeNotSupported: the framework runs the operator on the CPU with the generator's state).
#include <diopi/functions.h>

#include "../float_bits.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace {

uint64_t mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A uniform double in (0, 1] for counter n of the stream `seed`.
double uniform(uint64_t seed, uint64_t n) {
  const uint64_t bits = mix(mix(seed + 0x9e3779b97f4a7c15ULL) ^ n);
  return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53;
}

struct Out {
  char* data = nullptr;
  diopiSize_t shape{}, stride{};
  diopiDtype_t dtype = diopi_dtype_unsupported;
  int64_t numel = 0;
  explicit Out(diopiTensorHandle_t t) {
    void* p = nullptr;
    diopiGetTensorData(t, &p);
    data = static_cast<char*>(p);
    diopiGetTensorShape(t, &shape);
    diopiGetTensorStride(t, &stride);
    diopiGetTensorDtype(t, &dtype);
    diopiGetTensorNumel(t, &numel);
  }
  bool writable() const {
    return dtype == diopi_dtype_float32 || dtype == diopi_dtype_float64 || dtype == diopi_dtype_bfloat16;
  }
  // Element offsets in row-major order of the logical index (any strides).
  std::vector<int64_t> offsets() const {
    std::vector<int64_t> out(static_cast<size_t>(numel));
    std::vector<int64_t> index(static_cast<size_t>(shape.len), 0);
    for (int64_t n = 0; n < numel; ++n) {
      int64_t off = 0;
      for (int64_t d = 0; d < shape.len; ++d) off += index[d] * stride.data[d];
      out[n] = off;
      for (int64_t d = shape.len - 1; d >= 0; --d) {
        if (++index[d] < shape.data[d]) break;
        index[d] = 0;
      }
    }
    return out;
  }
  void set(int64_t offset, double v) const {
    if (dtype == diopi_dtype_float64) {
      reinterpret_cast<double*>(data)[offset] = v;
    } else if (dtype == diopi_dtype_float32) {
      reinterpret_cast<float*>(data)[offset] = static_cast<float>(v);
    } else {  // bfloat16
      reinterpret_cast<uint16_t*>(data)[offset] = diopi_ref::float_to_bf16(static_cast<float>(v));
    }
  }
};

double get(diopiConstTensorHandle_t t, diopiDtype_t dtype, int64_t offset) {
  const void* p = nullptr;
  diopiGetTensorDataConst(t, &p);
  if (dtype == diopi_dtype_float64) return static_cast<const double*>(p)[offset];
  if (dtype == diopi_dtype_float32) return static_cast<const float*>(p)[offset];
  return diopi_ref::bf16_to_float(static_cast<const uint16_t*>(p)[offset]);
}

// Fills `out` with f(seed, first counter, element number) and advances the generator by `per` * numel.
template <class F>
diopiError_t draw(diopiTensorHandle_t out, diopiGeneratorHandle_t generator, uint64_t per, F f) {
  const Out o(out);
  if (!o.writable()) return diopiDtypeNotSupported;
  uint64_t seed = 0, offset = 0;
  if (generator == nullptr || diopiGeneratorGetSeedAndOffset(generator, &seed, &offset) != diopiSuccess)
    return diopiErrorOccurred;
  const std::vector<int64_t> offsets = o.offsets();
  for (int64_t n = 0; n < o.numel; ++n) o.set(offsets[n], f(seed, offset + per * static_cast<uint64_t>(n), n));
  return diopiGeneratorSetSeedAndOffset(generator, seed, offset + per * static_cast<uint64_t>(o.numel));
}

}  // namespace

extern "C" {

diopiError_t diopiNormalInp(diopiContextHandle_t ctx, diopiTensorHandle_t inout, double mean, double std,
                            diopiGeneratorHandle_t generator) {
  return draw(inout, generator, 2, [&](uint64_t seed, uint64_t n, int64_t) {  // Box-Muller from two uniforms
    return mean + std * std::sqrt(-2.0 * std::log(uniform(seed, n))) * std::cos(2.0 * M_PI * uniform(seed, n + 1));
  });
}

diopiError_t diopiUniformInp(diopiContextHandle_t ctx, diopiTensorHandle_t inout, double from, double to,
                             diopiGeneratorHandle_t generator) {
  return draw(inout, generator, 1, [&](uint64_t seed, uint64_t n, int64_t) {
    const double v = from + (to - from) * (1.0 - uniform(seed, n));  // [from, to)
    return v < to ? v : from;
  });
}

diopiError_t diopiDropout(diopiContextHandle_t ctx, diopiTensorHandle_t out, diopiTensorHandle_t mask,
                          diopiConstTensorHandle_t input, double p, bool train, diopiGeneratorHandle_t generator) {
  const Out m(mask), o(out);
  diopiDtype_t in_dtype;
  diopiGetTensorDtype(input, &in_dtype);
  diopiSize_t in_stride;
  diopiGetTensorStride(input, &in_stride);
  if (m.dtype != diopi_dtype_bool || !o.writable() || in_dtype != o.dtype) return diopiDtypeNotSupported;
  if (!train) return diopiNoImplement;  // nothing random: the framework's CPU path copies
  // the input read at the output's logical index: same shape, its own strides
  std::vector<int64_t> in_offsets(static_cast<size_t>(o.numel));
  {
    std::vector<int64_t> index(static_cast<size_t>(o.shape.len), 0);
    for (int64_t n = 0; n < o.numel; ++n) {
      int64_t off = 0;
      for (int64_t d = 0; d < o.shape.len; ++d) off += index[d] * in_stride.data[d];
      in_offsets[n] = off;
      for (int64_t d = o.shape.len - 1; d >= 0; --d) {
        if (++index[d] < o.shape.data[d]) break;
        index[d] = 0;
      }
    }
  }
  const std::vector<int64_t> mask_offsets = m.offsets();
  bool* keep = reinterpret_cast<bool*>(m.data);
  const double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  return draw(out, generator, 1, [&](uint64_t seed, uint64_t n, int64_t i) {
    const bool kept = uniform(seed, n) > p;
    keep[mask_offsets[i]] = kept;
    return kept ? get(input, in_dtype, in_offsets[i]) * scale : 0.0;
  });
}

}  // extern "C"
