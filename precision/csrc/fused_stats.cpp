#include "fused_stats.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

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
  double sum[kLanes], sq[kLanes], lo[kLanes], hi[kLanes];
  Lanes() {
    std::fill(sum, sum + kLanes, 0.0);
    std::fill(sq, sq + kLanes, 0.0);
    std::fill(lo, lo + kLanes, HUGE_VAL);
    std::fill(hi, hi + kLanes, -HUGE_VAL);
  }
};

// The common case: no test per element. A NaN or Inf anywhere makes the sum non-finite, which sends
// the tensor through `checked_run`. Written with GCC's vector types (the compiler does not vectorise
// the float -> double widening by itself): 4 doubles a register, two registers per quantity.
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

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
  for (; i < n; ++i) {
    const double v = as_double(p[i]);
    a.sum[0] += v;
    a.sq[0] += v * v;
    a.lo[0] = v < a.lo[0] ? v : a.lo[0];
    a.hi[0] = v > a.hi[0] ? v : a.hi[0];
  }
}

// One clone per instruction set (chosen when the module loads): AVX2 where the CPU has it.
#define DITORCH_PRECISION_CONTIGUOUS(NAME, T) \
  __attribute__((target_clones("avx2", "default"))) void NAME(const T* p, int64_t n, Lanes& a) { \
    contiguous_body(p, n, a);                                                                  \
  }
DITORCH_PRECISION_CONTIGUOUS(contiguous_f64, double)
DITORCH_PRECISION_CONTIGUOUS(contiguous_f32, float)
DITORCH_PRECISION_CONTIGUOUS(contiguous_f16, c10::Half)
DITORCH_PRECISION_CONTIGUOUS(contiguous_bf16, c10::BFloat16)
#undef DITORCH_PRECISION_CONTIGUOUS

template <typename T>
void fast_run(const T* p, int64_t n, int64_t stride, Lanes& a) {
  if (stride == 1) {
    if constexpr (std::is_same_v<T, double>) return contiguous_f64(p, n, a);
    if constexpr (std::is_same_v<T, float>) return contiguous_f32(p, n, a);
    if constexpr (std::is_same_v<T, c10::Half>) return contiguous_f16(p, n, a);
    if constexpr (std::is_same_v<T, c10::BFloat16>) return contiguous_bf16(p, n, a);
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
