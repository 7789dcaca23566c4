#include "reduce/reduce.h"

#include "core/config.h"

#include <cstdlib>
#include <string>

#include "core/cpu_features.h"

#include "reduce/kernel_table.h"

namespace dicomm::reduction {
namespace {

// DICOMM_REDUCE_KERNELS=generic forces the portable kernels (to test them on any machine).
const KernelTable& kernels() {
  static const KernelTable& table = [] () -> const KernelTable& {
    if (config::choice("DICOMM_REDUCE_KERNELS") == "generic") return generic_kernels();
    return (avx2_kernels() != nullptr && cpu_has_avx2_f16c()) ? *avx2_kernels() : generic_kernels();
  }();
  return table;
}

bool is_floating(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 ||
         t == DataType::kBFloat16;
}

}  // namespace

void check_supported(DataType dtype, ReduceOp op) {
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if (bitwise && is_floating(dtype))
    throw ValueError(std::string("reduce op '") + reduce_op_name(op) +
                     "' is a bitwise op and is not defined for floating dtype '" +
                     dtype_name(dtype) + "'; use an integer or bool dtype");
  if (op == ReduceOp::kAvg && dtype == DataType::kBool)
    throw ValueError("reduce op 'avg' is not defined for dtype 'bool'; use 'sum' (logical or)");
}

void combine(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  check_supported(dtype, op);
  if (count == 0) return;
  kernels().combine[static_cast<int>(dtype)][static_cast<int>(op)](out, a, b, count);
}

void combine_many(void* out, const void* const* srcs, int n, size_t count, DataType dtype, ReduceOp op) {
  check_supported(dtype, op);
  if (n < 2) throw ValueError("combine_many needs at least 2 inputs, got " + std::to_string(n));
  if (count == 0) return;
  kernels().combine_many[static_cast<int>(dtype)][static_cast<int>(op)](out, srcs, n, count);
}

void divide(void* buf, size_t count, DataType dtype, int64_t divisor) {
  if (dtype == DataType::kBool) throw ValueError("cannot divide a bool buffer");
  if (divisor <= 0) throw ValueError("divisor must be positive, got " + std::to_string(divisor));
  if (count == 0) return;
  kernels().divide[static_cast<int>(dtype)](buf, count, divisor);
}

const char* kernel_isa() { return &kernels() == &generic_kernels() ? "generic" : "avx2+f16c"; }

}  // namespace dicomm::reduction
