// One pass over a tensor's elements, in its own dtype, with float64 accumulators: min, max, sum and
// sum of squares of the finite values, and the NaN and Inf counts. No float64 copy of the tensor is
// made (a stats capture reduces every output of every op: the copy was most of its cost).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ditorch_precision {

struct FusedStats {
  bool supported = false;  // a CPU tensor of a floating or integer dtype this pass reads
  int64_t numel = 0;
  int64_t nan = 0, inf = 0, finite = 0;
  double lo = 0, hi = 0, sum = 0, sumsq = 0;  // over the finite values only
};

// Whether `fused_stats` reads tensors of this dtype (float64/32/16, bfloat16, the integer types).
bool stats_dtype(c10::ScalarType dtype);

// The statistics of a strided CPU tensor (contiguous fast path; any strides, offsets and overlaps
// read element by element). `supported` is false for other devices, layouts and dtypes.
FusedStats fused_stats(const at::Tensor& t);

}  // namespace ditorch_precision
