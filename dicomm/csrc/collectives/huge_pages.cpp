#include "collectives/huge_pages.h"

#include <ctime>
#include <map>
#include <sys/mman.h>
#include <utility>

namespace dicomm {
namespace {

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older kernels answer EINVAL and nothing changes
#endif

constexpr size_t kHuge = size_t{2} << 20;
constexpr size_t kMaxBuffers = 64;        // more distinct buffers than this: they are not being reused
constexpr double kCheapSeconds = 1e-3;    // a collapse of memory already in huge pages costs ~50 us of CPU

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Advisor {
  std::map<std::pair<uintptr_t, size_t>, bool> seen;
  bool off = false;
};

}  // namespace

void collapse_into_huge_pages(uint8_t* buf, size_t bytes) {
  thread_local Advisor advisor;
  if (advisor.off) return;
  const uintptr_t start = reinterpret_cast<uintptr_t>(buf);
  const uintptr_t lo = (start + kHuge - 1) / kHuge * kHuge, hi = (start + bytes) / kHuge * kHuge;
  if (hi <= lo) return;  // no whole huge page inside
  const auto key = std::make_pair(start, bytes);
  const bool again = advisor.seen.count(key) != 0;
  if (!again && advisor.seen.size() >= kMaxBuffers) {
    advisor.off = true;
    return;
  }
  advisor.seen[key] = true;
  const double t0 = thread_cpu_seconds();
  madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_COLLAPSE);
  // A buffer collapsed before that needed the work again was freed and allocated anew in 4 KiB pages:
  // each call would copy it once more.
  if (again && thread_cpu_seconds() - t0 > kCheapSeconds) advisor.off = true;
}

}  // namespace dicomm
