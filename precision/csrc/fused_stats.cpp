#include "fused_stats.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
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

// Four independent lanes, so the adds of consecutive elements do not wait on each other.
struct Lanes {
  double sum[4] = {0, 0, 0, 0}, sq[4] = {0, 0, 0, 0};
  double lo[4], hi[4];
  Lanes() {
    std::fill(lo, lo + 4, HUGE_VAL);
    std::fill(hi, hi + 4, -HUGE_VAL);
  }
};

// The common case: no test per element. A NaN or Inf anywhere makes the sum non-finite, which sends
// the tensor through `checked_run`.
template <typename T>
void fast_run(const T* p, int64_t n, int64_t stride, Lanes& a) {
  int64_t i = 0;
  if (stride == 1) {
    for (; i + 4 <= n; i += 4) {
      for (int k = 0; k < 4; ++k) {
        const double v = as_double(p[i + k]);
        a.sum[k] += v;
        a.sq[k] += v * v;
        a.lo[k] = v < a.lo[k] ? v : a.lo[k];
        a.hi[k] = v > a.hi[k] ? v : a.hi[k];
      }
    }
  }
  for (; i < n; ++i) {
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
  double sum = (a.sum[0] + a.sum[1]) + (a.sum[2] + a.sum[3]);
  double sq = (a.sq[0] + a.sq[1]) + (a.sq[2] + a.sq[3]);
  double lo = std::min(std::min(a.lo[0], a.lo[1]), std::min(a.lo[2], a.lo[3]));
  double hi = std::max(std::max(a.hi[0], a.hi[1]), std::max(a.hi[2], a.hi[3]));
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
