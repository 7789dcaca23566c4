#include "transport/verbs/page_ids.h"

#include <fcntl.h>
#include <unistd.h>

namespace dicomm::transport::verbs {
namespace {

constexpr uint64_t kPresent = 1ull << 63;
constexpr uint64_t kPfnMask = (1ull << 55) - 1;

uint64_t frame(int fd, uintptr_t addr, long page) {
  uint64_t e = 0;
  off_t at = static_cast<off_t>(addr / static_cast<uintptr_t>(page) * sizeof(e));
  if (pread(fd, &e, sizeof(e), at) != static_cast<ssize_t>(sizeof(e)) || !(e & kPresent)) return 0;
  return e & kPfnMask;
}

}  // namespace

PageIds page_ids(const void* addr, size_t len) {
  static const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);  // kept for the process
  static const long page = sysconf(_SC_PAGESIZE);
  if (fd < 0 || len == 0) return {};
  const auto a = reinterpret_cast<uintptr_t>(addr);
  return PageIds{frame(fd, a, page), frame(fd, a + len - 1, page)};
}

}  // namespace dicomm::transport::verbs
