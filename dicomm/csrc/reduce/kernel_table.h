// Function tables that the kernel translation units fill: one generic, one compiled for AVX2+F16C.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dicomm::reduction {

constexpr int kNumDtypes = 10;  // DataType values
constexpr int kNumOps = 8;      // ReduceOp values

using CombineFn = void (*)(void* out, const void* a, const void* b, size_t count);
using DivideFn = void (*)(void* buf, size_t count, int64_t divisor);
// out[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])..., srcs[n-1][i]), n >= 2, in one pass.
using CombineManyFn = void (*)(void* out, const void* const* srcs, int n, size_t count);

struct KernelTable {
  CombineFn combine[kNumDtypes][kNumOps];  // nullptr where the pair is undefined
  DivideFn divide[kNumDtypes];             // nullptr for bool
  CombineManyFn combine_many[kNumDtypes][kNumOps];  // nullptr where the pair is undefined
};

const KernelTable& generic_kernels();
// nullptr when this build has no AVX2 kernels (non-x86); the caller checks the CPU.
const KernelTable* avx2_kernels();

}  // namespace dicomm::reduction
