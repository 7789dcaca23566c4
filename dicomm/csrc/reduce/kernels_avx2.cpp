// Kernels compiled for AVX2 + F16C (chosen at run time when the CPU has both), so the build stays
// portable: the rest of the library targets the baseline instruction set.
#include "reduce/kernel_table.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "reduce/half.h"

// No "fma": fused multiply-add would change rounding of the scalar float16 fallback.
#pragma GCC push_options
#pragma GCC target("avx2,f16c")

#define DICOMM_KERNEL_NS avx2_impl
#include "reduce/kernels_impl.h"

namespace dicomm::reduction {
namespace avx2_impl {

struct Fp16Convert {
  static void to_float(const uint16_t* src, float* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(
                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < n; ++i) dst[i] = fp16_to_float(src[i]);
  }
  static void from_float(const float* src, uint16_t* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) dst[i] = float_to_fp16(src[i]);
  }
};

}  // namespace avx2_impl

const KernelTable* avx2_kernels() {
  static const KernelTable table = avx2_impl::make_table<avx2_impl::Fp16Convert>();
  return &table;
}

}  // namespace dicomm::reduction

#pragma GCC pop_options

#else

namespace dicomm::reduction {
const KernelTable* avx2_kernels() { return nullptr; }
}  // namespace dicomm::reduction

#endif
