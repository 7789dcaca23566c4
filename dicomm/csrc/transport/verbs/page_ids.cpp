#include "transport/verbs/page_ids.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace dicomm::transport::verbs {
namespace {

constexpr uint64_t kPresent = 1ull << 63;
constexpr uint64_t kPfnMask = (1ull << 55) - 1;
constexpr size_t kBlock = 4096;  // pagemap entries per read

uint64_t mix(uint64_t h, uint64_t v) {  // order-sensitive: a swapped pair of pages changes it
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

}  // namespace

PageIds page_ids(const void* addr, size_t len) {
  static const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);  // kept for the process
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  if (fd < 0 || len == 0) return {};
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t first = a / page, last = (a + len - 1) / page;
  thread_local std::vector<uint64_t> buf(kBlock);
  uint64_t h = 0x243f6a8885a308d3ull;
  for (uintptr_t p = first; p <= last;) {
    const size_t n = static_cast<size_t>(std::min<uintptr_t>(kBlock, last - p + 1));
    const ssize_t want = static_cast<ssize_t>(n * sizeof(uint64_t));
    if (pread(fd, buf.data(), static_cast<size_t>(want), static_cast<off_t>(p * sizeof(uint64_t))) != want) return {};
    for (size_t i = 0; i < n; ++i) {
      const uint64_t pfn = buf[i] & kPfnMask;
      if (!(buf[i] & kPresent) || pfn == 0) return {};  // absent, or frame numbers hidden (no privilege)
      h = mix(h, pfn);
    }
    p += n;
  }
  return PageIds{h ? h : 1};
}

}  // namespace dicomm::transport::verbs
