// Which physical pages back a buffer, from /proc/self/pagemap: how the registration cache notices
// that a cached range was freed and mapped again (same address and length, other pages), whole or
// in part. The page frame numbers are visible only with CAP_SYS_ADMIN; without it nothing is known
// and the check is skipped (DICOMM_IB_REG_CACHE=0 stays the escape).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dicomm::transport::verbs {

struct PageIds {
  // A hash of the frame number of every page of the range, in order; 0 = unknown (no privilege,
  // or a page not present).
  uint64_t digest = 0;
  bool known() const { return digest != 0; }
  bool operator==(const PageIds& o) const { return digest == o.digest; }
};

// Reads the range's pagemap entries in blocks (one pread per 4096 pages: 1 GiB of 4 KiB pages is
// 64 reads of 32 KiB).
PageIds page_ids(const void* addr, size_t len);

}  // namespace dicomm::transport::verbs
