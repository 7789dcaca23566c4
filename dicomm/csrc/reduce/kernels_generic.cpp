// Kernels for any CPU: baseline instruction set, float16 converted in software.
#define DICOMM_KERNEL_NS generic_impl
#include "reduce/kernels_impl.h"

namespace dicomm::reduction {
namespace generic_impl {

struct Fp16Convert {
  static void to_float(const uint16_t* src, float* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_float(src[i]);
  }
  static void from_float(const float* src, uint16_t* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = float_to_fp16(src[i]);
  }
};

}  // namespace generic_impl

const KernelTable& generic_kernels() {
  static const KernelTable table = generic_impl::make_table<generic_impl::Fp16Convert>();
  return table;
}

}  // namespace dicomm::reduction
