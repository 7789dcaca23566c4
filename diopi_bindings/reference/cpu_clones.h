// Hot loops built twice on x86-64, for x86-64-v3 (AVX2, FMA) and for the baseline, the loader picking
// the first the CPU runs (GCC function multiversioning); elsewhere (aarch64 hosts, as Ascend's) the
// baseline alone, as the compiler targets it.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define DIOPI_REF_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DIOPI_REF_CPU_CLONES
#endif
