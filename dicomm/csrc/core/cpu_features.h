// Whether the CPU runs the AVX2 + F16C kernels (dicomm's reductions, the precision module's statistics),
// asked once per kernel table. x86-64 only: elsewhere false, and those kernels are not built.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace dicomm {

inline bool cpu_has_avx2_f16c() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && f16c;
#else
  return false;
#endif
}

}  // namespace dicomm
