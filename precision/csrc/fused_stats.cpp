#include "fused_stats.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "core/cpu_features.h"  // dicomm/csrc: one CPU feature test for every AVX2 kernel

// The AVX2 paths exist on x86-64 only (chosen at load where the CPU has them); elsewhere (aarch64
// hosts, as Ascend's) the generic bodies, which the compiler vectorises for that CPU.
#if defined(__x86_64__) && defined(__GNUC__)
#define PRECISION_X86_64 1
#include <immintrin.h>
#else
#define PRECISION_X86_64 0
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace ditorch_precision {
namespace {

template <typename T>
inline double as_double(T x) {
  if constexpr (std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>)
    return static_cast<double>(static_cast<float>(x));
  else
    return static_cast<double>(x);
}

// Eight independent lanes, so the adds of consecutive elements do not wait on each other (and
// vectorise: two AVX2 registers of doubles).
constexpr int kLanes = 8;
struct Lanes {
  double sum[kLanes]{}, sq[kLanes]{}, lo[kLanes]{}, hi[kLanes]{};
  Lanes() {
    std::fill(lo, lo + kLanes, HUGE_VAL);
    std::fill(hi, hi + kLanes, -HUGE_VAL);
  }
};

// The common case: no test per element. A NaN or Inf anywhere makes the sum non-finite, which sends
// the tensor through `checked_run`. Written with GCC's vector types (the compiler does not vectorise
// the float -> double widening by itself): 4 doubles a register, two registers per quantity.
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

// The last n % 8 elements of a contiguous run, into lane 0.
template <typename T>
inline __attribute__((always_inline)) void tail(const T* p, int64_t i, int64_t n, Lanes& a) {
  for (; i < n; ++i) {
    const double v = as_double(p[i]);
    a.sum[0] += v;
    a.sq[0] += v * v;
    a.lo[0] = v < a.lo[0] ? v : a.lo[0];
    a.hi[0] = v > a.hi[0] ? v : a.hi[0];
  }
}

template <typename T>
inline __attribute__((always_inline)) v4d load4(const T* p) {
  if constexpr (std::is_same_v<T, double>) {
    v4d d;
    std::memcpy(&d, p, sizeof d);
    return d;
  } else {
    v4f f;
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(&f, p, sizeof f);
    } else {
      for (int k = 0; k < 4; ++k) f[k] = static_cast<float>(p[k]);
    }
    return __builtin_convertvector(f, v4d);
  }
}

template <typename T>
inline __attribute__((always_inline)) void contiguous_body(const T* p, int64_t n, Lanes& a) {
  v4d s[2], q[2], lo[2], hi[2];
  for (int r = 0; r < 2; ++r) {
    std::memcpy(&s[r], a.sum + 4 * r, sizeof(v4d));
    std::memcpy(&q[r], a.sq + 4 * r, sizeof(v4d));
    std::memcpy(&lo[r], a.lo + 4 * r, sizeof(v4d));
    std::memcpy(&hi[r], a.hi + 4 * r, sizeof(v4d));
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int r = 0; r < 2; ++r) {
      const v4d v = load4(p + i + 4 * r);
      s[r] += v;
      q[r] += v * v;
      lo[r] = v < lo[r] ? v : lo[r];
      hi[r] = v > hi[r] ? v : hi[r];
    }
  }
  for (int r = 0; r < 2; ++r) {
    std::memcpy(a.sum + 4 * r, &s[r], sizeof(v4d));
    std::memcpy(a.sq + 4 * r, &q[r], sizeof(v4d));
    std::memcpy(a.lo + 4 * r, &lo[r], sizeof(v4d));
    std::memcpy(a.hi + 4 * r, &hi[r], sizeof(v4d));
  }
  tail(p, i, n, a);
}

#if PRECISION_X86_64
// float32, bfloat16 and float16 with AVX2: the same lanes and the same float64 sums as
// contiguous_body (element i + k of each block of 8 in lane k, added in the same order: the sums are
// bit-identical), but min and max taken in float32, 8 lanes a register (exact: every value is a
// float, whose comparisons do not change when widened; min_ps(f, lo) is f < lo ? f : lo, as the
// body's), 8 elements made floats by one or two instructions (bfloat16: its bits moved up 16;
// float16: F16C), and each 4-float half widened by one (GCC splits __builtin_convertvector into
// 2-float pieces and converts the 16-bit types one element at a time). The pass over an op's fresh
// output, which is in cache, is bound by these instructions, not by memory.
template <typename T>
__attribute__((target("avx2,f16c"))) inline __m256 load8(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  } else {
    static_assert(std::is_same_v<T, c10::Half>);
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

template <typename T>
__attribute__((target("avx2,f16c"))) void contiguous_avx2(const T* p, int64_t n, Lanes& a) {
  __m256d s0 = _mm256_loadu_pd(a.sum), s1 = _mm256_loadu_pd(a.sum + 4);
  __m256d q0 = _mm256_loadu_pd(a.sq), q1 = _mm256_loadu_pd(a.sq + 4);
  // float values or +-HUGE_VAL so far: exact in float32 (+-inf)
  __m256 lo = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(a.lo + 4)), _mm256_cvtpd_ps(_mm256_loadu_pd(a.lo)));
  __m256 hi = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(a.hi + 4)), _mm256_cvtpd_ps(_mm256_loadu_pd(a.hi)));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 f = load8(p + i);
    lo = _mm256_min_ps(f, lo);
    hi = _mm256_max_ps(f, hi);
    __m256d v0, v1;
    if constexpr (std::is_same_v<T, float>) {  // widened straight from memory
      v0 = _mm256_cvtps_pd(_mm_loadu_ps(p + i));
      v1 = _mm256_cvtps_pd(_mm_loadu_ps(p + i + 4));
    } else {
      v0 = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
      v1 = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
    }
    s0 = _mm256_add_pd(s0, v0);
    s1 = _mm256_add_pd(s1, v1);
    q0 = _mm256_add_pd(q0, _mm256_mul_pd(v0, v0));  // no FMA: the body rounds the product first
    q1 = _mm256_add_pd(q1, _mm256_mul_pd(v1, v1));
  }
  _mm256_storeu_pd(a.sum, s0);
  _mm256_storeu_pd(a.sum + 4, s1);
  _mm256_storeu_pd(a.sq, q0);
  _mm256_storeu_pd(a.sq + 4, q1);
  _mm256_storeu_pd(a.lo, _mm256_cvtps_pd(_mm256_castps256_ps128(lo)));
  _mm256_storeu_pd(a.lo + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)));
  _mm256_storeu_pd(a.hi, _mm256_cvtps_pd(_mm256_castps256_ps128(hi)));
  _mm256_storeu_pd(a.hi + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1)));
  tail(p, i, n, a);
}

// float64: one clone per instruction set (chosen when the module loads), AVX2 where the CPU has it.
__attribute__((target_clones("avx2", "default"))) void contiguous_f64(const double* p, int64_t n, Lanes& a) {
  contiguous_body(p, n, a);
}
#else
void contiguous_f64(const double* p, int64_t n, Lanes& a) { contiguous_body(p, n, a); }
#endif

// The 32- and 16-bit floats: contiguous_avx2 where the CPU has AVX2 and F16C, else the generic body.
template <typename T>
void contiguous_narrow(const T* p, int64_t n, Lanes& a) {
#if PRECISION_X86_64
  static const bool avx2 = dicomm::cpu_has_avx2_f16c();
  if (avx2) return contiguous_avx2(p, n, a);
#endif
  contiguous_body(p, n, a);
}

template <typename T>
void fast_run(const T* p, int64_t n, int64_t stride, Lanes& a) {
  if (stride == 1) {
    if constexpr (std::is_same_v<T, double>) return contiguous_f64(p, n, a);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>)
      return contiguous_narrow(p, n, a);
    // integer types: not vectorised (their captures are small: indices, masks)
    for (int64_t i = 0; i < n; ++i) {
      const double v = as_double(p[i]);
      a.sum[0] += v;
      a.sq[0] += v * v;
      a.lo[0] = v < a.lo[0] ? v : a.lo[0];
      a.hi[0] = v > a.hi[0] ? v : a.hi[0];
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const double v = as_double(p[i * stride]);
    a.sum[0] += v;
    a.sq[0] += v * v;
    a.lo[0] = v < a.lo[0] ? v : a.lo[0];
    a.hi[0] = v > a.hi[0] ? v : a.hi[0];
  }
}

template <typename T>
void checked_run(const T* p, int64_t n, int64_t stride, FusedStats& s) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = as_double(p[i * stride]);
    if (std::isnan(v)) {
      ++s.nan;
    } else if (std::isinf(v)) {
      ++s.inf;
    } else {
      ++s.finite;
      s.sum += v;
      s.sumsq += v * v;
      s.lo = std::min(s.lo, v);
      s.hi = std::max(s.hi, v);
    }
  }
}

// Calls run(pointer, length, stride) for each innermost run of elements. Dimensions are visited by
// decreasing stride, so the innermost run is the one with the smallest stride (a transposed view is
// read along its memory order); size-1 dimensions are dropped and a contiguous tensor is one run.
template <typename T, typename Run>
void for_each_run(const at::Tensor& t, Run run) {
  const T* base = t.const_data_ptr<T>();
  if (t.is_contiguous()) {
    run(base, t.numel(), 1);
    return;
  }
  std::vector<int64_t> size, stride;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1) {
      size.push_back(t.size(d));
      stride.push_back(t.stride(d));
    }
  }
  if (size.empty()) {
    run(base, 1, 1);
    return;
  }
  std::vector<size_t> order(size.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return std::abs(stride[x]) > std::abs(stride[y]); });
  std::vector<int64_t> sz, st;
  for (size_t d : order) {
    sz.push_back(size[d]);
    st.push_back(stride[d]);
  }
  const size_t inner = sz.size() - 1;
  std::vector<int64_t> idx(inner, 0);
  while (true) {
    int64_t offset = 0;
    for (size_t d = 0; d < inner; ++d) offset += idx[d] * st[d];
    run(base + offset, sz[inner], st[inner]);
    size_t d = inner;
    while (d > 0) {
      --d;
      if (++idx[d] < sz[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (inner == 0) return;
  }
}

template <typename T>
void reduce(const at::Tensor& t, FusedStats& s) {
  Lanes a;
  for_each_run<T>(t, [&](const T* p, int64_t n, int64_t stride) { fast_run(p, n, stride, a); });
  double sum = 0, sq = 0, lo = HUGE_VAL, hi = -HUGE_VAL;
  for (int k = 0; k < kLanes; ++k) {
    sum += a.sum[k];
    sq += a.sq[k];
    lo = std::min(lo, a.lo[k]);
    hi = std::max(hi, a.hi[k]);
  }
  if (std::isfinite(sum) && std::isfinite(lo) && std::isfinite(hi)) {
    s.finite = s.numel;
    s.sum = sum;
    s.sumsq = sq;
    s.lo = lo;
    s.hi = hi;
    return;
  }
  // The rare case (or a sum that overflowed): count and skip the non-finite values.
  s.lo = HUGE_VAL;
  s.hi = -HUGE_VAL;
  for_each_run<T>(t, [&](const T* p, int64_t n, int64_t stride) { checked_run(p, n, stride, s); });
}

}  // namespace

bool stats_dtype(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: case at::kFloat: case at::kHalf: case at::kBFloat16:
    case at::kLong: case at::kInt: case at::kShort: case at::kChar: case at::kByte:
      return true;
    default:
      return false;
  }
}

FusedStats fused_stats(const at::Tensor& t) {
  FusedStats s;
  if (!t.defined() || t.layout() != at::kStrided || !t.device().is_cpu() || !stats_dtype(t.scalar_type()) ||
      t.is_conj() || t.is_neg())
    return s;
  s.supported = true;
  s.numel = t.numel();
  if (s.numel == 0) return s;
  switch (t.scalar_type()) {
    case at::kDouble: reduce<double>(t, s); break;
    case at::kFloat: reduce<float>(t, s); break;
    case at::kHalf: reduce<c10::Half>(t, s); break;
    case at::kBFloat16: reduce<c10::BFloat16>(t, s); break;
    case at::kLong: reduce<int64_t>(t, s); break;
    case at::kInt: reduce<int32_t>(t, s); break;
    case at::kShort: reduce<int16_t>(t, s); break;
    case at::kChar: reduce<int8_t>(t, s); break;
    case at::kByte: reduce<uint8_t>(t, s); break;
    default: s.supported = false;
  }
  return s;
}

}  // namespace ditorch_precision
