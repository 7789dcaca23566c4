// Element-wise reduction of raw buffers: the arithmetic of reduce, all_reduce and reduce_scatter.
//
// Semantics follow torch's element-wise ops: integers wrap on overflow, float16/bfloat16 compute in
// float32 and round to nearest even, min/max propagate NaN, bool sum/max/bor are logical or and
// product/min/band logical and. AVG combines like SUM; the collective divides once at the end.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/types.h"

namespace dicomm::reduction {

// Throws ValueError naming op and dtype when the pair is undefined: bitwise ops on floating
// types, AVG on bool.
void check_supported(DataType dtype, ReduceOp op);

// out[i] = op(a[i], b[i]) for i < count. `out` may equal `a` or `b`, or be disjoint from both.
// Operand order matters only for which NaN or signed zero wins; callers that must agree
// bit-for-bit across ranks pass the lower rank's data as `a`.
void combine(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

// out = op(...op(op(srcs[0], srcs[1]), srcs[2])..., srcs[n-1]) element-wise, n >= 2, bit for bit what
// n - 1 pairwise combines in that order give, but in one pass over the data. `out` may be any input.
void combine_many(void* out, const void* const* srcs, int n, size_t count, DataType dtype, ReduceOp op);

// AVG's final step: buf[i] /= divisor. Floats divide and round; integers truncate toward zero
// (like torch.div(rounding_mode="trunc")), so an integer average of a wrapped sum is wrapped too.
void divide(void* buf, size_t count, DataType dtype, int64_t divisor);

// Name of the instruction set the kernels dispatch to on this machine ("avx2+f16c" or "generic").
const char* kernel_isa();

}  // namespace dicomm::reduction
